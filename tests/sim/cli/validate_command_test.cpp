// tests/sim/cli/validate_command_test.cpp: `tpusim validate`: the published set and bad files
// (sim/cli/validate_command.cpp), end to end through the built tpusim.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

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
  ASSERT_EQ(json["rows"].size(), 4u);
  for (const auto& row : json["rows"]) {
    EXPECT_EQ(row["hardware"], "h100-sxm-80g");
    EXPECT_TRUE(row["fits"].get<bool>()) << row["id"];
    EXPECT_FALSE(row.contains("measured_tokens_s_chip"));
  }
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
}

}  // namespace
}  // namespace tpusim
