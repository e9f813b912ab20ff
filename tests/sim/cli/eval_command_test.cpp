// tests/sim/cli/eval_command_test.cpp: `tpusim eval` (sim/cli/eval_command.cpp) end to end through
// the built tpusim: a checkpoint's held-out loss equals the eval_loss train recorded at its step,
// bitwise, from the checkpoint and from its Hugging Face export; bad input exits 2 naming it; and
// the host-memory pre-flight of train (sim/train/host_memory.h) refuses what cannot fit.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

// A text of `bytes` bytes: sentences drawn from a few words by a fixed linear congruence.
std::string sample_text(size_t bytes) {
  const std::vector<std::string> words = {"the", "model",  "reads", "a",    "long",  "text",
                                          "and", "learns", "which", "byte", "comes", "next"};
  std::string text;
  uint64_t state = 12345;
  while (text.size() < bytes) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    text += words[(state >> 33) % words.size()];
    text += (state >> 20) % 9 == 0 ? ".\n" : " ";
  }
  return text;
}

std::map<int64_t, double> eval_losses(const std::string& metrics_path) {
  std::ifstream file(metrics_path);
  std::map<int64_t, double> losses;
  std::string line;
  while (std::getline(file, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("eval_loss")) {
      losses[record["step"].get<int64_t>()] = record["eval_loss"].get<double>();
    }
  }
  return losses;
}

nlohmann::json eval_json(std::vector<std::string> args) {
  args.insert(args.begin(), "eval");
  args.emplace_back("--json");
  const auto result = run_tpusim(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return result.exit_code == 0 ? nlohmann::json::parse(result.out) : nlohmann::json();
}

class EvalCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ::testing::TempDir() + "/tpusim_eval_" + std::to_string(::getpid());
    std::filesystem::create_directories(base_);
    text_ = base_ + "/text.txt";
    std::ofstream(text_) << sample_text(24000);
  }
  void TearDown() override { std::filesystem::remove_all(base_); }

  std::string base_;
  std::string text_;
};

// Train tiny-llama on a sharded mesh for 4 steps, evaluating every 2 on 2 held-out batches and
// keeping a checkpoint at each; `tpusim eval` of each checkpoint with the run's keys gives the
// loss train recorded (the same function on the same weights: sim/train/evaluation.h), and so do
// the Hugging Face weights export-hf writes of it (float32: the same values).
TEST_F(EvalCommand, EqualsTheEvalLossTrainRecordedBitwise) {
  const std::vector<std::string> run_keys = {"compile_topology=v5e-4",   "ici_fsdp_parallelism=2",
                                             "ici_tensor_parallelism=2", "per_device_batch_size=1",
                                             "max_target_length=32",     "dataset_type=text",
                                             "dataset_path=" + text_,    "eval_steps=2"};
  std::vector<std::string> train = {"train",
                                    "model_name=tiny-llama",
                                    "steps=4",
                                    "eval_interval=2",
                                    "learning_rate=1e-2",
                                    "enable_checkpointing=true",
                                    "checkpoint_period=2",
                                    "base_output_directory=" + base_,
                                    "run_name=r",
                                    "metrics_file=" + base_ + "/metrics.jsonl",
                                    "--quiet"};
  train.insert(train.end(), run_keys.begin(), run_keys.end());
  const auto trained = run_tpusim(train);
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::map<int64_t, double> recorded = eval_losses(base_ + "/metrics.jsonl");
  ASSERT_EQ(recorded.size(), 2U);
  for (const auto& [step, loss] : recorded) {
    std::vector<std::string> args = {base_ + "/r/checkpoints/" + std::to_string(step)};
    args.insert(args.end(), run_keys.begin(), run_keys.end());
    const nlohmann::json result = eval_json(args);
    ASSERT_TRUE(result.is_object());
    EXPECT_EQ(result["loss"].get<double>(), loss) << "step " << step;
    EXPECT_EQ(result["step"], step);
    EXPECT_EQ(result["format"], "tpusim");
    // 2 batches of 4 sequences (1 per device on 4 devices) of 32 tokens; the byte-level
    // tokenizer: one byte per token, so bits per byte = loss / ln 2.
    EXPECT_EQ(result["tokens"], 2 * 4 * 32);
    EXPECT_EQ(result["bytes"].get<double>(), 2 * 4 * 32);
    EXPECT_DOUBLE_EQ(result["bits_per_byte"].get<double>(), loss / std::log(2.0));
    EXPECT_DOUBLE_EQ(result["perplexity"].get<double>(), std::exp(loss));
    // The text's windows of 32 tokens (and the next-token target) in one era, the last tenth
    // held out (dataset.h): no repeats.
    const auto windows = static_cast<int64_t>((std::filesystem::file_size(text_) - 1) / 32);
    EXPECT_EQ(result["held_out_windows"], windows / 10);
    EXPECT_EQ(result["repeats_windows"], false);
  }
  // A text of 12 windows holds out one: the 8 sequences of 2 batches score it 8 times, which
  // the report says (tokens count each time; the loss is the window's all the same).
  const std::string short_text = base_ + "/short.txt";
  std::ofstream(short_text) << sample_text(12 * 32 + 1);
  std::vector<std::string> short_args = {base_ + "/r/checkpoints/4"};
  for (const std::string& key : run_keys) {
    short_args.push_back(key.starts_with("dataset_path") ? "dataset_path=" + short_text : key);
  }
  const nlohmann::json repeated = eval_json(short_args);
  ASSERT_TRUE(repeated.is_object());
  EXPECT_EQ(repeated["held_out_windows"], 1);
  EXPECT_EQ(repeated["repeats_windows"], true);
  EXPECT_EQ(repeated["tokens"], 2 * 4 * 32);
  short_args.insert(short_args.begin(), "eval");
  const auto short_printed = run_tpusim(short_args);
  ASSERT_EQ(short_printed.exit_code, 0) << short_printed.err;
  EXPECT_NE(short_printed.out.find("the held-out split has 1 window for 8 sequences"),
            std::string::npos)
      << short_printed.out;
  // Training moved the loss (the two evaluations are not the same number twice).
  EXPECT_NE(recorded.begin()->second, recorded.rbegin()->second);
  // The same weights exported to Hugging Face names and evaluated from there.
  const std::string hf = base_ + "/hf";
  const auto exported = run_tpusim({"export-hf", base_ + "/r/checkpoints/4", hf});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  std::vector<std::string> hf_args = {hf, "model_name=tiny-llama"};
  hf_args.insert(hf_args.end(), run_keys.begin(), run_keys.end());
  const nlohmann::json from_hf = eval_json(hf_args);
  ASSERT_TRUE(from_hf.is_object());
  EXPECT_EQ(from_hf["loss"].get<double>(), recorded.at(4));
  EXPECT_EQ(from_hf["format"], "huggingface");
  EXPECT_TRUE(from_hf["step"].is_null());
  // dataset_path alone reads the file as text (dataset_type guessed), the human output names the
  // loss with every digit, and --tokens-page writes the page.
  std::vector<std::string> human = {"eval", base_ + "/r/checkpoints/4", "--tokens-page",
                                    base_ + "/tokens.html"};
  for (const std::string& key : run_keys) {
    if (!key.starts_with("dataset_type")) {
      human.push_back(key);
    }
  }
  const auto printed = run_tpusim(human);
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  std::ostringstream digits;
  digits.precision(17);
  digits << recorded.at(4);
  EXPECT_NE(printed.out.find("loss           " + digits.str()), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("bits per byte"), std::string::npos) << printed.out;
  EXPECT_NE(printed.err.find("host memory: "), std::string::npos) << printed.err;
  std::ifstream page(base_ + "/tokens.html");
  std::ostringstream html;
  html << page.rdbuf();
  EXPECT_NE(html.str().find("tpusim eval: tiny-llama"), std::string::npos);
}

TEST_F(EvalCommand, RefusesBadInput) {
  const auto trained = run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-1",
                                   "per_device_batch_size=1", "max_target_length=16", "steps=1",
                                   "enable_checkpointing=true", "base_output_directory=" + base_,
                                   "run_name=r", "--quiet"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::string checkpoint = base_ + "/r/checkpoints/1";
  const std::vector<std::string> keys = {"compile_topology=v5e-1", "per_device_batch_size=1",
                                         "max_target_length=16"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), keys.begin(), keys.end());
    return args;
  };
  expect_user_error(with({"eval", base_ + "/nowhere"}), base_ + "/nowhere");
  expect_user_error(with({"eval", checkpoint, "dataset_path=" + base_ + "/missing.txt"}),
                    base_ + "/missing.txt");
  expect_user_error(with({"eval", checkpoint, "eval_steps=0"}), "eval_steps: 0");
  expect_user_error(with({"eval", checkpoint, "eval_steps=-1"}), "eval_steps: -1");
  // A checkpoint of another model than the one named.
  expect_user_error(with({"eval", checkpoint, "model_name=tiny-qwen3"}), "model_name");
  // Hugging Face weights name no tpusim model: model_name is needed.
  const auto exported = run_tpusim({"export-hf", checkpoint, base_ + "/hf"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  expect_user_error(with({"eval", base_ + "/hf"}), "model_name");
  // Without a dataset, synthetic held-out data: a loss, no bits per byte.
  const nlohmann::json synthetic = eval_json(with({checkpoint}));
  ASSERT_TRUE(synthetic.is_object());
  EXPECT_EQ(synthetic["dataset"], "synthetic");
  EXPECT_TRUE(synthetic["bits_per_byte"].is_null());
  EXPECT_GT(synthetic["loss"].get<double>(), 0);
}

// A run under `ulimit -v 8000000` (8,192,000,000 bytes of address space; the test lowers its own
// soft RLIMIT_AS, which tpusim inherits).
[[maybe_unused]] testing::CommandResult run_under_address_limit(
    const std::vector<std::string>& args) {
  rlimit saved{};
  getrlimit(RLIMIT_AS, &saved);
  rlimit lowered = saved;
  lowered.rlim_cur = static_cast<rlim_t>(8000000) * 1024;
  setrlimit(RLIMIT_AS, &lowered);
  const auto result = run_tpusim(args);
  setrlimit(RLIMIT_AS, &saved);
  return result;
}

// The pre-flight: llama3.1-405b on one chip needs terabytes of host memory, llama2-7b over 100 GB;
// both exit 2 at once, before allocating, naming the bytes needed and the bytes available, where
// they used to run for minutes and die of bad_alloc (exit 1) or of the kernel's OOM killer.
TEST(HostMemoryPreflight, TrainThatCannotFitExitsTwoAtOnce) {
#ifdef TPUSIM_SANITIZER_SLOWDOWN
  // AddressSanitizer maps terabytes of shadow memory at start-up, which an 8 GB RLIMIT_AS forbids
  // ("Failed to mmap"): under the sanitizers the pre-flight is checked against the machine's
  // MemAvailable instead, with the model that needs terabytes (no machine here has them).
  const std::vector<std::string> models = {"llama3.1-405b"};
  const std::string limited_by = " GiB) are available (MemAvailable";
  const double slowdown = TPUSIM_SANITIZER_SLOWDOWN;
#else
  const std::vector<std::string> models = {"llama3.1-405b", "llama2-7b"};
  const std::string limited_by = " GiB) are available (RLIMIT_AS (ulimit -v)";
  const double slowdown = 1;
#endif
  for (const std::string& model : models) {
    const std::vector<std::string> args = {"train", "model_name=" + model, "compile_topology=v5e-1",
                                           "steps=1"};
    const auto start = std::chrono::steady_clock::now();
#ifdef TPUSIM_SANITIZER_SLOWDOWN
    const auto result = run_tpusim(args);
#else
    const auto result = run_under_address_limit(args);
#endif
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(result.exit_code, 2) << model << ": " << result.err;
    EXPECT_NE(result.err.find("host memory: train of " + model + " on v5e-1 needs "),
              std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find(limited_by), std::string::npos) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_EQ(result.err.find("internal error"), std::string::npos) << result.err;
    EXPECT_LT(seconds, 10.0 * slowdown) << model;
  }
}

}  // namespace
}  // namespace tpusim
