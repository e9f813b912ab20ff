// tests/sim/cli/train_command_test.cpp: `tpusim train`: the metrics file, token cache, and what it
// refuses (sim/cli/train_command.cpp), end to end through the built tpusim.
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

TEST(TrainCommand, MetricsFileContract) {
  const std::string metrics = ::testing::TempDir() + "/tpusim_train_metrics.jsonl";
  const auto result = run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-4",
                                  "per_device_batch_size=1", "max_target_length=32", "steps=3",
                                  "eval_interval=2", "metrics_file=" + metrics, "--verify"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream stream(metrics);
  std::string line;
  int lines = 0;
  bool saw_eval = false;
  while (std::getline(stream, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    for (const char* key :
         {"step", "loss", "grad_norm", "learning_rate", "tokens_per_s", "verify_max_rel_diff"}) {
      EXPECT_TRUE(record.contains(key)) << key;
    }
    saw_eval = saw_eval || record.contains("eval_loss");
    ++lines;
  }
  EXPECT_EQ(lines, 3);
  EXPECT_TRUE(saw_eval);
}

// steps=-1 trained nothing, exit 0: in MaxText it takes learning_rate_schedule_steps, and both -1
// leave no step count.
TEST(RedTeam, S60_StepsMinusOneTakesTheScheduleSteps) {
  const std::string metrics = ::testing::TempDir() + "/s60_steps_minus_one.jsonl";
  std::filesystem::remove(metrics);
  const auto result = run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-1",
                                  "per_device_batch_size=1", "max_target_length=32", "steps=-1",
                                  "learning_rate_schedule_steps=2", "metrics_file=" + metrics});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream stream(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(stream, line)) {
    ++lines;
  }
  EXPECT_EQ(lines, 2);
  expect_user_error({"train", "model_name=tiny-llama", "compile_topology=v5e-1", "steps=-1"},
                    "steps: -1");
}

// A diverging run (learning rate 1000) reaches a NaN gradient norm at step 4, a step before the
// loss would show it: training stops with exit 2 naming the step, as MaxText's abort_on_nan_loss
// does for the loss; switched off, it runs on.
TEST(TrainCommand, NonFiniteLossStopsTraining) {
  const std::vector<std::string> run = {"train",
                                        "model_name=tiny-llama",
                                        "compile_topology=v5e-1",
                                        "steps=6",
                                        "learning_rate=1000",
                                        "per_device_batch_size=1",
                                        "max_target_length=16",
                                        "--quiet"};
  const auto stopped = run_tpusim(run);
  EXPECT_EQ(stopped.exit_code, 2) << stopped.err;
  EXPECT_NE(stopped.err.find("step 4: the gradient norm is NaN"), std::string::npos) << stopped.err;
  std::vector<std::string> allowed = run;
  allowed.emplace_back("abort_on_nan_loss=false");
  allowed.emplace_back("abort_on_inf_loss=false");
  EXPECT_EQ(run_tpusim(allowed).exit_code, 0);
}

TEST(TrainCommand, BadInputExits2) {
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text"}, "dataset_path");
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text",
                     "dataset_path=/nonexistent/corpus.txt"},
                    "/nonexistent/corpus.txt");
  // (Over data parallelism: the default fsdp=128 would not split tiny-llama's 64-wide embed.)
  expect_user_error({"train", "model_name=tiny-llama", "compile_topology=v5p-256",
                     "ici_fsdp_parallelism=1", "ici_data_parallelism=-1"},
                    "v5p-256");
  expect_user_error({"train", "model_name=tiny-llama", "steps=many"}, "steps");
  // A file where --dump writes a directory: refused before the run, naming --dump (it failed
  // after the first step as "cannot create checkpoint directory").
  expect_user_error({"train", "model_name=tiny-llama", "--dump", "/etc/passwd"},
                    "--dump: '/etc/passwd' exists and is not a directory");
  // Inputs that are not regular files fail at once instead of failing late (a directory) or
  // never ending (/dev/zero); a value that is not UTF-8 cannot reach the JSON output.
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text", "dataset_path=/tmp"},
                    "/tmp");
  expect_user_error(
      {"train", "model_name=tiny-llama", "dataset_type=text", "dataset_path=/dev/zero"},
      "/dev/zero");
  expect_user_error({"config", "run_name=\xff"}, "run_name");
  // A value with a newline or an escape stays on the error's one line, written as \n and \x1b.
  const auto newline = run_tpusim({"estimate", "model_name=tiny\nllama\x1b[31m"});
  EXPECT_EQ(newline.exit_code, 2);
  EXPECT_EQ(std::count(newline.err.begin(), newline.err.end(), '\n'), 1) << newline.err;
  EXPECT_NE(newline.err.find("tiny\\nllama\\x1b[31m"), std::string::npos) << newline.err;
  expect_user_error(
      {"train", "model_name=tiny-llama", "run_name=../..", "enable_checkpointing=true",
       "base_output_directory=/tmp/tpusim_cli_test_runs", "steps=1"},
      "run_name");
  expect_user_error(
      {"train", "model_name=llama2-7b", "vocab_size=100", "override_model_config=true",
       "dataset_type=text", "dataset_path=/usr/share/common-licenses/GPL-3"},
      "vocab_size");
  // A chunked head needs chunks that split each device's positions evenly.
  expect_user_error(
      {"train", "model_name=tiny-llama", "max_target_length=24", "num_vocab_tiling=4",
       "compile_topology=v5e-4", "ici_fsdp_parallelism=1", "ici_context_parallelism=4"},
      "num_vocab_tiling");
  // Dropless MoE keeps whole experts on each expert-parallel shard (tiny-moe has 4).
  expect_user_error({"train", "model_name=tiny-moe", "compile_topology=v5e-8",
                     "ici_fsdp_parallelism=1", "ici_expert_parallelism=8"},
                    "num_experts");
}

// MaxText switches the functional engine does not compute are refused, not silently ignored.
TEST(TrainCommand, RefusesSwitchesTheEngineDoesNotBuild) {
  // qk-norm is built as MaxText's Attention does it (qwen3), not llama4's L2 variant after RoPE.
  expect_user_error({"train", "model_name=tiny-llama", "override_model_config=true",
                     "decoder_block=llama4", "use_qk_norm=true"},
                    "use_qk_norm");
  expect_user_error({"train", "model_name=tiny-mla", "use_qk_norm=true"}, "use_qk_norm");
  // llama4's router scales each token by the sigmoid of its chosen logits before the experts.
  expect_user_error(
      {"train", "model_name=tiny-moe", "override_model_config=true", "decoder_block=llama4"},
      "decoder_block");
  // MaxText soft-caps only tied logits: a final cap on tiny-llama's untied ones is refused.
  expect_user_error({"train", "model_name=tiny-llama", "final_logits_soft_cap=30"},
                    "final_logits_soft_cap");
  // Numerics the estimate does not read and the engine does not build: the router's scoring,
  // bias, groups and aux loss, clamped activations, dropout, scaled RoPE.
  for (const std::string key : {"routed_score_func=sigmoid", "routed_bias=true",
                                "n_routing_groups=2", "load_balance_loss_weight=0.01"}) {
    expect_user_error({"train", "model_name=tiny-moe", key}, key.substr(0, key.find('=')));
  }
  expect_user_error({"train", "model_name=tiny-llama", "mlp_activations_limit=7"},
                    "mlp_activations_limit");
  expect_user_error({"train", "model_name=tiny-llama", "dropout_rate=0.1"}, "dropout_rate");
  expect_user_error({"train", "model_name=tiny-llama", "rope_type=yarn"}, "rope_type");
}

// The losses of a metrics file, in step order.
std::vector<double> losses_of(const std::string& path) {
  std::vector<double> losses;
  std::ifstream stream(path);
  std::string line;
  while (std::getline(stream, line)) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return losses;
}

// The first run tokenizes into the cache under base_output_directory, the second says it read
// the cache; a run with the cache that stops at step 2 and resumes to step 4 has bitwise the
// losses of one uncached, uninterrupted run. A corrupted chunk then exits 2 naming it.
TEST(TrainCommand, TokenCacheIsReusedAndChangesNoLoss) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / "tpusim_cli_token_cache";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::vector<std::string> run = {"train",
                                        "model_name=tiny-llama",
                                        "compile_topology=v5e-4",
                                        "per_device_batch_size=1",
                                        "learning_rate_schedule_steps=4",
                                        "dataset_type=text",
                                        "dataset_path=/usr/share/common-licenses/GPL-3"};
  // The schedule does not follow `steps`: the run stopped at step 2 and resumed is the same run.
  auto with = [&](std::vector<std::string> extra) {
    if (std::none_of(extra.begin(), extra.end(), [](const std::string& key) {
          return key.starts_with("max_target_length=");
        })) {
      extra.emplace_back("max_target_length=32");
    }
    std::vector<std::string> args = run;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_tpusim(args);
  };
  const std::string plain = (root / "plain.jsonl").string();
  ASSERT_EQ(with({"steps=4", "metrics_file=" + plain}).exit_code, 0);
  const std::vector<std::string> cached = {
      "base_output_directory=" + root.string(), "run_name=cached", "enable_checkpointing=true",
      "checkpoint_period=2", "metrics_file=" + (root / "cached.jsonl").string()};
  auto cached_run = [&](const std::string& steps) {
    std::vector<std::string> extra = cached;
    extra.push_back(steps);
    return with(extra);
  };
  const auto first = cached_run("steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("dataset: tokenized"), std::string::npos) << first.err;
  const auto resumed = cached_run("steps=4");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("read from the cache"), std::string::npos) << resumed.err;
  EXPECT_EQ(resumed.err.find("dataset: tokenized"), std::string::npos) << resumed.err;
  const std::vector<double> expected = losses_of(plain);
  ASSERT_EQ(expected.size(), 4U);
  EXPECT_EQ(losses_of((root / "cached.jsonl").string()), expected);
  // Another max_target_length reads the same cache.
  const auto longer =
      with({"steps=1", "max_target_length=64", "base_output_directory=" + root.string()});
  EXPECT_NE(longer.err.find("read from the cache"), std::string::npos) << longer.err;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root / "dataset_cache")) {
    if (entry.path().filename().string().starts_with("chunk-")) {
      std::filesystem::resize_file(entry.path(), 100);
    }
  }
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text",
                     "dataset_path=/usr/share/common-licenses/GPL-3",
                     "base_output_directory=" + root.string(), "steps=1"},
                    "truncated");
  std::filesystem::remove_all(root);
}

TEST(TrainCommand, TokenCacheAndViewKeysExit2NamingTheKey) {
  const std::vector<std::string> text = {"train", "model_name=tiny-llama", "dataset_type=text",
                                         "dataset_path=/usr/share/common-licenses/GPL-3",
                                         "steps=1"};
  auto with = [&](const std::string& extra) {
    std::vector<std::string> args = text;
    args.push_back(extra);
    return args;
  };
  expect_user_error(with("dataset_cache_dir=/usr/share/common-licenses/GPL-3"),
                    "dataset_cache_dir");
  expect_user_error(with("token_viz_file=/tmp/tokens.html"), "token_viz_file");  // no eval
  std::vector<std::string> directory = with("token_viz_file=/tmp");
  directory.emplace_back("eval_interval=1");
  expect_user_error(directory, "token_viz_file");
  // One file for the metrics and the page: each evaluation's page replaced the metrics, exit 0.
  const std::string same = ::testing::TempDir() + "/s60_metrics_and_page";
  std::vector<std::string> shared = with("token_viz_file=" + same);
  shared.insert(shared.end(), {"eval_interval=1", "metrics_file=" + same});
  expect_user_error(shared, "is metrics_file too");
}

}  // namespace
}  // namespace tpusim
