// tests/sim/cli/validate_command_test.cpp: `tpusim validate`: the published set and bad files
// (sim/cli/validate_command.cpp), end to end through the built tpusim.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/csv.h"
#include "common/yaml_text.h"
#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

TEST(ValidateCommand, JsonContractOnThePublishedSet) {
  const std::string csv = testing::source_dir() + "/validation/published.csv";
  const auto result = run_tpusim({"validate", csv, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_GE(json["rows"].size(), 10u);
  for (const auto& row : json["rows"]) {
    for (const char* key : {"predicted_step_s", "measured_step_s", "error"}) {
      EXPECT_TRUE(row[key].is_number()) << key;
    }
    EXPECT_TRUE(row["id"].is_string());
  }
  for (const char* key : {"median_abs_error", "mean_abs_error", "max_abs_error"}) {
    EXPECT_TRUE(json["summary"][key].is_number()) << key;
  }
}

TEST(ValidateCommand, GpuRowsValidateFromTheirOwnCsv) {
  const std::string csv = testing::source_dir() + "/validation/gpu_published.csv";
  const auto result = run_tpusim({"validate", csv, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json["rows"].size(), 5u);  // four H100 rows, one H200 (A3 Ultra)
  for (const auto& row : json["rows"]) {
    EXPECT_TRUE(row["hardware"] == "h100-sxm-80g" || row["hardware"] == "h200-sxm-141g")
        << row["hardware"];
    EXPECT_TRUE(row["fits"].get<bool>()) << row["id"];
    EXPECT_FALSE(row.contains("measured_tokens_s_chip"));
  }
}

// --list-mechanisms names every mechanism once with what it models, the same names --help lists
// for --without; it excludes a CSV.
TEST(ValidateCommand, ListsEveryMechanismWithoutTakes) {
  const auto listed = run_tpusim({"validate", "--list-mechanisms", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  const nlohmann::json mechanisms = nlohmann::json::parse(listed.out);
  ASSERT_GE(mechanisms.size(), 20u);
  std::vector<std::string> names;
  for (const auto& item : mechanisms) {
    names.push_back(item["name"].get<std::string>());
    EXPECT_GT(item["summary"].get<std::string>().size(), 20u) << names.back();
  }
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  const auto help = run_tpusim({"validate", "--help"});
  for (const std::string& name : names) {
    EXPECT_NE(help.out.find(name), std::string::npos) << name;
  }
  const auto text = run_tpusim({"validate", "--list-mechanisms"});
  EXPECT_NE(text.out.find(names.front() + ": "), std::string::npos);
  const auto both = run_tpusim(
      {"validate", "--list-mechanisms", testing::source_dir() + "/validation/published.csv"});
  EXPECT_EQ(both.exit_code, 2);
}

TEST(ValidateCommand, BadFilesExit2) {
  const std::string directory = ::testing::TempDir();
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(directory + "/" + name) << text;
    return directory + "/" + name;
  };
  expect_user_error({"validate", "/nonexistent/results.csv"}, "/nonexistent/results.csv");
  // A measured time of 0 or less gave an inf% error; empty args estimated the default model.
  expect_user_error({"validate", write("zero.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e,compile_topology=v5e-8,0,\n")},
                    "row 2 (A) measured_step_s");
  expect_user_error({"validate", write("empty_args.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e, ,1.0,\n")},
                    "row 2 (A) args");
  expect_user_error(
      {"validate",
       write("no_args.csv", "id,hardware,measured_step_s,measured_tokens_s_chip\nA,v5e,1,\n")},
      "args");
  expect_user_error(
      {"validate",
       write("ragged.csv", "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,v5e\n")},
      "fields");
  expect_user_error(
      {"validate",
       write("quote.csv", "id,hardware,args,measured_step_s,measured_tokens_s_chip\n\"A,v5e\n")},
      "quote");
  expect_user_error({"validate", write("bad_number.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e,compile_topology=v5e-8,fast,\n")},
                    "fast");
  expect_user_error({"validate", write("bad_key.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e,compile_topology=v5e-8 remat_polcy=full,1.0,\n")},
                    "remat_polcy");
  // A row's hardware and chips describe its args' run (chips=7 or hardware=v9 for a v5e-8 run
  // were printed as its label and validated without a word).
  expect_user_error({"validate", write("wrong_chips.csv",
                                       "id,hardware,chips,args,measured_step_s\nA,v5e,7,"
                                       "compile_topology=v5e-8,1.0\n")},
                    "row 2 (A) chips: '7' but its args run on 8 chips");
  expect_user_error({"validate", write("wrong_hardware.csv",
                                       "id,hardware,chips,args,measured_step_s\nA,v9,8,"
                                       "compile_topology=v5e-8,1.0\n")},
                    "row 2 (A) hardware: 'v9' but its args run on v5e");
  // The hardware may be a slice-name prefix of the chip, as GCP names the slices (tpu7x for v7x,
  // v5litepod for v5e): that check refused them as "but its args run on v7x".
  for (const auto& [hardware, slice] : std::vector<std::pair<std::string, std::string>>{
           {"tpu7x", "tpu7x-8"}, {"v5litepod-16", "v5litepod-16"}}) {
    const auto named =
        run_tpusim({"validate", write("prefix_" + hardware + ".csv",
                                      "id,hardware,args,measured_step_s\nA," + hardware +
                                          ",model_name=tiny-llama "
                                          "compile_topology=" +
                                          slice + ",1.0\n")});
    EXPECT_EQ(named.exit_code, 0) << named.err;
  }
  // A header without rows printed "median |error| 0.0% ... over 0 rows" (--pairs: an empty
  // summary), exit 0.
  expect_user_error(
      {"validate",
       write("header_only.csv", "id,hardware,args,measured_step_s,measured_tokens_s_chip\n")},
      "no rows under the header");
  expect_user_error({"validate", "--pairs",
                     write("header_only_pairs.csv",
                           "id,level,quantity,a,b,measured_a,measured_b,source,config_note\n")},
                    "no rows under the header");
}

// validate --pairs on the public pairs: every pair's prediction is the estimate (or op timing) of
// its two runs, read back here through `tpusim estimate --json` and `tpusim op --json` on the
// runs as a user would type them; the points and directions follow from the two ratios.
TEST(ValidatePairs, PublicPairsAreTheRatiosOfTheirRuns) {
  const std::string csv = testing::source_dir() + "/validation/pairs.csv";
  const auto result = run_tpusim({"validate", "--pairs", csv, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_GE(json["pairs"].size(), 13u);
  int step_pairs = 0;
  for (const auto& pair : json["pairs"]) {
    SCOPED_TRACE(pair["id"].get<std::string>());
    const double measured = pair["measured_b"].get<double>() / pair["measured_a"].get<double>();
    const double predicted = pair["predicted_b"].get<double>() / pair["predicted_a"].get<double>();
    EXPECT_DOUBLE_EQ(pair["measured_ratio"].get<double>(), measured);
    EXPECT_DOUBLE_EQ(pair["predicted_ratio"].get<double>(), predicted);
    EXPECT_DOUBLE_EQ(pair["error_points"].get<double>(), 100 * (predicted - measured));
    if (std::abs(measured - 1) < 0.03) {
      EXPECT_EQ(pair["direction"], "not judged");
    } else {
      EXPECT_EQ(pair["direction"], (predicted - 1) * (measured - 1) > 0 ? "right" : "wrong");
    }
    step_pairs += pair["level"] == "step";
  }
  EXPECT_EQ(json["summary"]["step"]["pairs"], step_pairs);
  // The first guide ablation, estimated on its own.
  const auto found = std::find_if(json["pairs"].begin(), json["pairs"].end(), [](const auto& pair) {
    return pair["id"] == "guide-sc-offload-dense-8k";
  });
  ASSERT_NE(found, json["pairs"].end());
  const auto& offload = *found;
  std::vector<std::string> args = {"estimate",
                                   "model_name=llama3.1-8b",
                                   "compile_topology=tpu7x-128",
                                   "max_target_length=8192",
                                   "per_device_batch_size=2",
                                   "ici_fsdp_parallelism=-1",
                                   "remat_policy=full",
                                   "attention=flash",
                                   "sparse_core_collective_offload=on",
                                   "--json"};
  const auto estimate = run_tpusim(args);
  ASSERT_EQ(estimate.exit_code, 0) << estimate.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(estimate.out)["step_time_s"].get<double>(),
                   offload["predicted_b"].get<double>());
  // The all-gather op pair, timed on its own.
  const auto gathers =
      std::find_if(json["pairs"].begin(), json["pairs"].end(),
                   [](const auto& pair) { return pair["id"] == "all-gather-small-large"; });
  ASSERT_NE(gathers, json["pairs"].end());
  const auto& gather = *gathers;
  ASSERT_EQ(gather["level"], "op");
  const auto op =
      run_tpusim({"op", "all_gather", "bytes=33554432", "axes=fsdp", "compile_topology=v5e-32",
                  "ici_fsdp_parallelism=4", "ici_data_parallelism=-1", "--json"});
  ASSERT_EQ(op.exit_code, 0) << op.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(op.out)["seconds"].get<double>(),
                   gather["predicted_b"].get<double>());
}

// A pair of one run with itself predicts no change: against a measured +10% that is -10 points
// and the wrong direction; against a measured +1% it is not judged.
TEST(ValidatePairs, NoPredictedChangeAgainstAMeasuredOne) {
  const std::string path = ::testing::TempDir() + "/self_pairs.csv";
  const std::string run = "model_name=llama2-7b compile_topology=v5e-16 per_device_batch_size=1";
  std::ofstream(path) << "id,level,quantity,a,b,measured_a,measured_b,source,config_note\n"
                      << "ten,step,step_s," << run << "," << run << ",1.0,1.1,test,\n"
                      << "one,step,mfu," << run << "," << run << ",0.5,0.505,test,\n";
  const auto result = run_tpusim({"validate", "--pairs", path, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_NEAR(json["pairs"][0]["error_points"].get<double>(), -10.0, 1e-9);
  EXPECT_EQ(json["pairs"][0]["direction"], "wrong");
  EXPECT_NEAR(json["pairs"][1]["error_points"].get<double>(), -1.0, 1e-9);
  EXPECT_EQ(json["pairs"][1]["direction"], "not judged");
  EXPECT_EQ(json["summary"]["step"]["directions_judged"], 1);
  EXPECT_EQ(json["summary"]["step"]["directions_wrong"], 1);
  EXPECT_NEAR(json["summary"]["step"]["max_abs_points"].get<double>(), 10.0, 1e-9);
}

TEST(ValidatePairs, BadPairsExit2) {
  const std::string directory = ::testing::TempDir();
  const std::string header = "id,level,quantity,a,b,measured_a,measured_b,source,config_note\n";
  const auto write = [&](const std::string& name, const std::string& row) {
    std::ofstream(directory + "/" + name) << header << row << "\n";
    return directory + "/" + name;
  };
  const std::string run = "model_name=llama2-7b compile_topology=v5e-16";
  expect_user_error(
      {"validate", "--pairs", write("level.csv", "P,kernel,step_s," + run + "," + run + ",1,2,s,")},
      "level");
  expect_user_error({"validate", "--pairs",
                     write("quantity.csv", "P,step,seconds," + run + "," + run + ",1,2,s,")},
                    "quantity");
  expect_user_error({"validate", "--pairs",
                     write("measured.csv", "P,step,step_s," + run + "," + run + ",1,-2,s,")},
                    "measured_b");
  expect_user_error(
      {"validate", "--pairs",
       write("typo.csv", "P,step,step_s," + run + " remat_polcy=full," + run + ",1,2,s,")},
      "remat_polcy");
  // Named runs are looked up beside the pairs file: none is there.
  expect_user_error({"validate", "--pairs",
                     write("named.csv", "P,step,step_s,published:NOPE," + run + ",1,2,s,")},
                    "published.csv");
  expect_user_error({"validate", "--pairs",
                     write("op.csv",
                           "P,op,seconds,matmull m=8,matmul m=8,"
                           "1,2,s,")},
                    "matmull");
  expect_user_error({"validate", "--pairs", directory + "/missing.csv"}, "missing.csv");
  expect_user_error({"validate"}, "--pairs");
}

// A CSV saved by a spreadsheet starts with a UTF-8 byte order mark: it was read into the first
// column's name ("missing column 'id'", exit 2, naming a column the file has).
TEST(RedTeam, S60_ACsvWithAByteOrderMarkReadsAsWithout) {
  const std::string row =
      "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,v5e,model_name=tiny-llama "
      "compile_topology=v5e-4,1.0,\n";
  const std::string plain = ::testing::TempDir() + "/s60_plain.csv";
  const std::string marked = ::testing::TempDir() + "/s60_bom.csv";
  std::ofstream(plain) << row;
  std::ofstream(marked) << "\xEF\xBB\xBF" << row;
  const auto expected = run_tpusim({"validate", plain, "--json"});
  const auto result = run_tpusim({"validate", marked, "--json"});
  ASSERT_EQ(expected.exit_code, 0) << expected.err;
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out)["rows"], nlohmann::json::parse(expected.out)["rows"]);
}

}  // namespace
}  // namespace tpusim
