// tests/sim/cli/explore_command_test.cpp: `tpusim explore`: JSON, CSV and human output, and its
// constraints (sim/cli/explore_command.cpp), end to end through the built tpusim.
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

TEST(ExploreCommand, JsonContractAndTheArgsReproduceTheEstimate) {
  const auto result =
      run_tpusim({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                  "max_target_length=256", "remat_policy=full", "--top", "3", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_TRUE(json["candidates_evaluated"].is_number_integer());
  ASSERT_TRUE(json["pruned"].is_object());
  ASSERT_TRUE(json["elapsed_s"].is_number());
  ASSERT_EQ(json["top"].size(), 3U);
  int64_t pruned = 0;
  for (const auto& [reason, count] : json["pruned"].items()) {
    pruned += count.get<int64_t>();
  }
  EXPECT_EQ(json["candidates_evaluated"].get<int64_t>() + pruned,
            json["candidates_in_space"].get<int64_t>());
  double previous = 1e300;
  for (const auto& item : json["top"]) {
    for (const char* key :
         {"step_time_s", "mfu", "tokens_per_s_per_chip", "hbm_peak_bytes_per_device"}) {
      EXPECT_TRUE(item[key].is_number()) << key;
    }
    EXPECT_TRUE(item["fits"].get<bool>());
    EXPECT_LE(item["tokens_per_s_per_chip"].get<double>(), previous);
    previous = item["tokens_per_s_per_chip"].get<double>();
  }
  // `args` alone reproduces the candidate through `tpusim estimate`.
  std::vector<std::string> estimate_args = {"estimate"};
  std::istringstream words(json["top"][0]["args"].get<std::string>());
  for (std::string word; words >> word;) {
    estimate_args.push_back(word);
  }
  estimate_args.emplace_back("--json");
  const auto estimate = run_tpusim(estimate_args);
  ASSERT_EQ(estimate.exit_code, 0) << estimate.err;
  const nlohmann::json reproduced = nlohmann::json::parse(estimate.out);
  EXPECT_DOUBLE_EQ(reproduced["step_time_s"].get<double>(),
                   json["top"][0]["step_time_s"].get<double>());
  EXPECT_EQ(reproduced["hbm_peak_bytes_per_device"], json["top"][0]["hbm_peak_bytes_per_device"]);
}

// Each top candidate says how much of usable HBM it takes; Mixtral's best on v5p-16 use more than
// 95% (the issue that asked for the flag saw 98%), and the text says so beside the figures.
TEST(ExploreCommand, TopCandidatesNearTheHbmLimitAreFlagged) {
  const std::vector<std::string> run = {"explore", "model_name=mixtral-8x7b",
                                        "compile_topology=v5p-16", "--top", "5"};
  std::vector<std::string> json_run = run;
  json_run.emplace_back("--json");
  const auto result = run_tpusim(json_run);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  int tight = 0;
  for (const auto& item : json["top"]) {
    const double used =
        item["hbm_peak_bytes_per_device"].get<double>() / item["hbm_capacity_bytes"].get<double>();
    EXPECT_DOUBLE_EQ(item["hbm_used_fraction"].get<double>(), used);
    EXPECT_EQ(item["hbm_tight"].get<bool>(), used > 0.95);
    tight += used > 0.95;
  }
  EXPECT_GT(tight, 0);
  const auto text = run_tpusim(run);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("above 95%: little margin"), std::string::npos) << text.out;
  // With a 5% margin asked for, no candidate above 95% is left.
  std::vector<std::string> with_margin = json_run;
  with_margin.insert(with_margin.end(), {"--min-hbm-headroom", "0.05"});
  const auto margin = run_tpusim(with_margin);
  ASSERT_EQ(margin.exit_code, 0) << margin.err;
  // The parsed document is kept in a variable: a range-for over parse(...)["top"] would iterate a
  // member of a temporary destroyed before the loop runs (ASan: heap-use-after-free).
  const nlohmann::json margin_json = nlohmann::json::parse(margin.out);
  for (const auto& item : margin_json.at("top")) {
    EXPECT_FALSE(item["hbm_tight"].get<bool>());
  }
}

// tpusim's compiler switches (SparseCore offload, collective matmul) are libtpu flags in a real
// run: a winner's args without those keys, with its libtpu_init_args as the recipe's flags,
// estimate the same step.
TEST(ExploreCommand, LibtpuFlagsReproduceTheSwitches) {
  const auto result =
      run_tpusim({"explore", "model_name=tiny-llama", "compile_topology=tpu7x-8",
                  "max_target_length=256", "remat_policy=full", "--top", "2", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_FALSE(json["top"].empty());
  for (const auto& item : json["top"]) {
    const std::string flags = item["libtpu_init_args"].get<std::string>();
    EXPECT_NE(flags.find("--xla_tpu_enable_sparse_core_collective_offload_all_gather="),
              std::string::npos)
        << flags;
    EXPECT_NE(flags.find("--xla_tpu_enable_async_collective_fusion="), std::string::npos) << flags;
    std::vector<std::string> args = {"estimate"};
    std::istringstream words(item["args"].get<std::string>());
    for (std::string word; words >> word;) {
      if (!word.starts_with("sparse_core_collective_offload=") &&
          !word.starts_with("collective_matmul=")) {
        args.push_back(word);
      }
    }
    args.insert(args.end(), {"--xla-flags", flags, "--json"});
    const auto estimate = run_tpusim(args);
    ASSERT_EQ(estimate.exit_code, 0) << estimate.err;
    EXPECT_NE(estimate.err.find("; 0 not modeled"), std::string::npos) << estimate.err;
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(estimate.out)["step_time_s"].get<double>(),
                     item["step_time_s"].get<double>());
  }
  // A GPU run has no libtpu flags.
  const auto gpu =
      run_tpusim({"explore", "model_name=tiny-llama", "hardware=gpu", "compile_topology=a3",
                  "max_target_length=256", "--top", "1", "--json"});
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_EQ(nlohmann::json::parse(gpu.out)["top"][0]["libtpu_init_args"], "");
}

TEST(ExploreCommand, CsvAndHumanOutput) {
  const std::vector<std::string> base = {"explore",
                                         "model_name=tiny-llama",
                                         "compile_topology=v5e-4",
                                         "remat_policy=full",
                                         "attention=dot_product",
                                         "--top",
                                         "2"};
  auto csv_args = base;
  csv_args.emplace_back("--csv");
  const auto csv = run_tpusim(csv_args);
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 3) << csv.out;
  EXPECT_EQ(csv.out.rfind("rank,step_time_s,mfu,tokens_per_s_per_chip", 0), 0U);
  const auto human = run_tpusim(base);
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("tpusim estimate "), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("MaxText: "), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("MaxText: LIBTPU_INIT_ARGS=\"--xla_tpu_enable_async_collective_fusion="),
            std::string::npos)
      << human.out;
}

TEST(ExploreCommand, BadConstraintsExitTwo) {
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "ici_tensor_parallelism=3"},
      "ici_tensor_parallelism=3");
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                     "per_device_batch_size=3", "--global-batch-size", "8"},
                    "per_device_batch_size=3");
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--objective",
                     "tokens_per_dollar"},
                    "tokens_per_dollar");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--objective", "speed"},
      "speed");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--min-hbm-headroom", "2"},
      "headroom");
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v9-8"}, "v9-8");
  // Pinned mesh sizes go through estimate's check: no division by zero, no int overflow, and a
  // negative size other than -1 is an error, not "nothing fits".
  for (const char* bad :
       {"ici_data_parallelism=0", "ici_data_parallelism=4294967296", "ici_data_parallelism=-3"}) {
    expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8", bad},
                      "ici_data_parallelism");
  }
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                     "ici_data_parallelism=65536", "ici_fsdp_parallelism=65536"},
                    "ici_data_parallelism=65536");
  // Found by the command-line fuzz: 1e-30 searched no batch and crashed (SIGSEGV), 1e309 (inf)
  // never left the loop doubling the batch; NaN passed every comparison.
  for (const char* bad : {"1e-30", "1e309", "nan", "70000"}) {
    expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                       "--max-per-device-batch", bad},
                      "--max-per-device-batch");
  }
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                     "--max-per-device-batch", "0.015625"},
                    "no per_device_batch_size up to 0.015625");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--min-hbm-headroom", "nan"},
      "--min-hbm-headroom");
  // Each listed candidate is estimated again: --top 65536 ran for minutes.
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--top", "65536"}, "--top");
}

TEST(ExploreCommand, NothingFitsSaysWhy) {
  const auto result = run_tpusim({"explore", "model_name=llama3.1-70b", "compile_topology=v5e-4",
                                  "max_target_length=2048", "--max-per-device-batch", "1"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("nothing fits: the smallest peak HBM found is"), std::string::npos)
      << result.out;
}

// Red-team item 11: a DCN pipeline pinned on a single slice (and a pinned stage count no layers
// per stage fit) left explore no schedule, and it dereferenced an empty error: SIGSEGV. Each is
// exit 2 naming the key, as estimate and train refuse the same config.
TEST(RedTeam, Item11_PinnedDcnPipelineOnOneSliceIsExit2) {
  const std::vector<std::string> one_slice = {"model_name=tiny-llama", "compile_topology=v4-8",
                                              "dcn_pipeline_parallelism=4"};
  const std::vector<std::string> odd_layers = {"model_name=tiny-llama", "compile_topology=v4-8",
                                               "compile_topology_num_slices=4",
                                               "dcn_pipeline_parallelism=4"};
  for (const char* command : {"explore", "estimate", "train"}) {
    SCOPED_TRACE(command);
    std::vector<std::string> args = {command};
    args.insert(args.end(), one_slice.begin(), one_slice.end());
    expect_user_error(args, "dcn_pipeline_parallelism=4");
  }
  for (const char* command : {"explore", "estimate"}) {
    SCOPED_TRACE(command);
    std::vector<std::string> args = {command};
    args.insert(args.end(), odd_layers.begin(), odd_layers.end());
    expect_user_error(args, "4 stages x 1 layer per stage must divide the 2 pipelined layers");
  }
}

// Found by the command-line fuzzer once it learned the pipeline keys: a pinned
// num_layers_per_pipeline_stage of 0 with a pipeline axis divided by zero in explore (SIGFPE);
// estimate and train already refused it.
TEST(RedTeam, Item11_ZeroLayersPerPipelineStageIsExit2) {
  for (const char* axis : {"ici_pipeline_parallelism=2", "dcn_pipeline_parallelism=2"}) {
    for (const char* command : {"explore", "estimate"}) {
      SCOPED_TRACE(std::string(command) + " " + axis);
      expect_user_error({command, "model_name=tiny-llama", "compile_topology=v5e-4",
                         "compile_topology_num_slices=2", axis, "num_layers_per_pipeline_stage=0"},
                        "num_layers_per_pipeline_stage=0");
    }
  }
}

// --no-branch-and-bound "times every candidate that fits": variants that could not beat another
// variant of their own per-device program were still skipped and counted as cannot_beat_top (948
// of tiny-llama's 1100 on v5e-1). The top N stays the same.
TEST(RedTeam, S60_NoBranchAndBoundTimesEveryFittingCandidate) {
  const std::vector<std::string> args = {"explore",
                                         "model_name=tiny-llama",
                                         "compile_topology=v5e-1",
                                         "--top",
                                         "5",
                                         "--json",
                                         "--threads",
                                         "1"};
  const auto bounded = run_tpusim(args);
  std::vector<std::string> every = args;
  every.emplace_back("--no-branch-and-bound");
  const auto timed = run_tpusim(every);
  ASSERT_EQ(bounded.exit_code, 0) << bounded.err;
  ASSERT_EQ(timed.exit_code, 0) << timed.err;
  const nlohmann::json with_bounds = nlohmann::json::parse(bounded.out);
  const nlohmann::json without = nlohmann::json::parse(timed.out);
  EXPECT_FALSE(without["pruned"].contains("cannot_beat_top")) << without["pruned"];
  EXPECT_GT(without["candidates_evaluated"].get<int64_t>(),
            with_bounds["candidates_evaluated"].get<int64_t>());
  ASSERT_EQ(with_bounds["top"].size(), without["top"].size());
  for (size_t rank = 0; rank < without["top"].size(); ++rank) {
    EXPECT_EQ(with_bounds["top"][rank]["args"], without["top"][rank]["args"]) << rank;
  }
}

}  // namespace
}  // namespace tpusim
