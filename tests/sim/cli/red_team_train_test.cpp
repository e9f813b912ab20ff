// tests/sim/cli/red_team_train_test.cpp: the train, checkpoint and output-file failures of a
// red-team pass (issue 35), one test per item, each named after it, end to end through the built
// tpusim. Each failed before its fix: a silent wrong result, a clobbered file or a wrong exit code.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;
using testing::run_tpusim;

constexpr const char* kText = "/usr/share/common-licenses/GPL-3";

// A fresh directory of this test's own.
fs::path scratch(const std::string& name) {
  const fs::path path = fs::path(::testing::TempDir()) /
                        ("tpusim_red_team_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

// The reproducer: tiny-llama on 4 devices of a v5e, byte tokens of a text file; a key
// of `extra` replaces the reproducer's own.
std::vector<std::string> tiny_run(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"model_name=tiny-llama",
                                   "compile_topology=v5e-4",
                                   "max_target_length=64",
                                   "dataset_type=text",
                                   std::string("dataset_path=") + kText,
                                   "num_threads=1"};
  for (const std::string& item : extra) {
    if (const size_t equals = item.find('='); equals != std::string::npos) {
      const std::string key = item.substr(0, equals + 1);
      std::erase_if(args, [&](const std::string& arg) { return arg.starts_with(key); });
    }
    args.push_back(item);
  }
  args.insert(args.begin(), "train");
  args.emplace_back("--quiet");
  return args;
}

// Every float of a safetensors file's data section (8-byte header size, JSON header, values).
std::vector<float> safetensors_values(const fs::path& path) {
  const std::string bytes = read_bytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof(header));
  const size_t start = sizeof(header) + header;
  std::vector<float> values((bytes.size() - start) / sizeof(float));
  std::memcpy(values.data(), bytes.data() + start, values.size() * sizeof(float));
  return values;
}

std::vector<double> losses_of(const fs::path& metrics) {
  std::vector<double> losses;
  std::ifstream stream(metrics);
  std::string line;
  while (std::getline(stream, line)) {
    losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  return losses;
}

TEST(RedTeam, Item3_QuantizationInTrainIsRefusedNotIgnored) {
  for (const std::string value : {"int8", "fp8"}) {
    expect_user_error({"train", "model_name=tiny-llama", "quantization=" + value}, "quantization");
  }
}

// A learning rate of 1000 drives the weights to NaN: the run stops at the first non-finite value
// (the gradient norm or the updated weights, before the loss shows it) and every checkpoint it
// saved before is finite.
TEST(RedTeam, Item4_NonFiniteValuesStopTrainingBeforeAnythingIsSaved) {
  const fs::path root = scratch("item4");
  const auto run =
      run_tpusim(tiny_run({"ici_fsdp_parallelism=4", "steps=12", "learning_rate=1e3",
                           "eval_interval=1", "enable_checkpointing=true", "checkpoint_period=1",
                           "base_output_directory=" + root.string(), "run_name=nan"}));
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("NaN"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("step "), std::string::npos) << run.err;
  int checkpoints = 0;
  for (const auto& entry : fs::directory_iterator(root / "nan" / "checkpoints")) {
    ++checkpoints;
    for (const float value : safetensors_values(entry.path() / "model.safetensors")) {
      ASSERT_TRUE(std::isfinite(value)) << entry.path();
    }
  }
  EXPECT_GT(checkpoints, 0);
  fs::remove_all(root);
}

TEST(RedTeam, Item5_ResumeWithAnotherTokenizerIsRefused) {
  const fs::path root = scratch("item5a");
  const std::string spm = "spm_train --input=" + std::string(kText) +
                          " --model_prefix=" + (root / "text").string() +
                          " --vocab_size=200 --model_type=bpe --character_coverage=1.0 "
                          "> /dev/null 2>&1";
  ASSERT_EQ(std::system(spm.c_str()), 0) << "spm_train (Debian package sentencepiece)";
  const std::vector<std::string> keys = {"enable_checkpointing=true",
                                         "base_output_directory=" + root.string(), "run_name=a",
                                         "per_device_batch_size=1"};
  std::vector<std::string> first = keys;
  first.emplace_back("steps=1");
  ASSERT_EQ(run_tpusim(tiny_run(first)).exit_code, 0);
  std::vector<std::string> resumed = keys;
  resumed.emplace_back("steps=2");
  resumed.push_back("tokenizer_path=" + (root / "text.model").string());
  expect_user_error(tiny_run(resumed), "tokenizer");
  fs::remove_all(root);
}

TEST(RedTeam, Item5_HuggingFaceConfigMustDescribeTheModel) {
  const fs::path root = scratch("item5b");
  ASSERT_EQ(
      run_tpusim(tiny_run({"enable_checkpointing=true", "steps=1", "run_name=a",
                           "base_output_directory=" + root.string(), "per_device_batch_size=1"}))
          .exit_code,
      0);
  const fs::path hf = root / "hf";
  ASSERT_EQ(run_tpusim({"export-hf", (root / "a/checkpoints/1").string(), hf.string()}).exit_code,
            0);
  // As exported, it loads back; with another rope_theta in config.json it is refused.
  const std::vector<std::string> load =
      tiny_run({"steps=1", "per_device_batch_size=1", "load_parameters_path=" + hf.string()});
  EXPECT_EQ(run_tpusim(load).exit_code, 0);
  nlohmann::json config = nlohmann::json::parse(read_bytes(hf / "config.json"));
  config["rope_theta"] = 500000.0;
  std::ofstream(hf / "config.json") << config.dump(2);
  expect_user_error(load, "rope_theta");
  fs::remove_all(root);
}

// The source edited at the same size with its mtime kept (as `cp -p` or `touch -r` leave it):
// the cache must not hand back the old tokens.
TEST(RedTeam, Item6_TokenCacheChecksContentNotMtime) {
  const fs::path root = scratch("item6");
  const fs::path text = root / "corpus.txt";
  std::string content = read_bytes(kText);
  std::ofstream(text, std::ios::binary) << content;
  const std::vector<std::string> run =
      tiny_run({"steps=1", "per_device_batch_size=1", "dataset_path=" + text.string(),
                "base_output_directory=" + root.string()});
  const auto first = run_tpusim(run);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto mtime = fs::last_write_time(text);
  for (char& c : content) {
    c = c == 'e' ? 'a' : c;  // same size, other text
  }
  std::ofstream(text, std::ios::binary) << content;
  fs::last_write_time(text, mtime);
  std::vector<std::string> verbose = run;
  verbose.erase(std::find(verbose.begin(), verbose.end(), "--quiet"));
  const auto second = run_tpusim(verbose);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.err.find("read from the cache"), std::string::npos) << second.err;
  fs::remove_all(root);
}

// Verifying does not change the run (it used to switch it to the reference kernels), and a
// difference above the tolerance is exit 3, not a number printed beside exit 0.
TEST(RedTeam, Item10_VerifyIsAGuardAndDoesNotPerturbTheRun) {
  const fs::path root = scratch("item10");
  const auto with = [&](const std::string& metrics, std::vector<std::string> extra) {
    extra.emplace_back("ici_fsdp_parallelism=4");
    extra.emplace_back("steps=3");
    extra.push_back("metrics_file=" + (root / metrics).string());
    return run_tpusim(tiny_run(extra));
  };
  ASSERT_EQ(with("plain.jsonl", {}).exit_code, 0);
  const auto verified = with("verified.jsonl", {"--verify"});
  ASSERT_EQ(verified.exit_code, 0) << verified.err;
  EXPECT_EQ(losses_of(root / "verified.jsonl"), losses_of(root / "plain.jsonl"));
  // The sharded step sums in another order than the reference: not zero, so a tolerance of
  // 1e-12 is exceeded, and the run stops with exit 3 naming the step.
  const auto strict = with("strict.jsonl", {"--verify", "verify_tolerance=1e-12"});
  EXPECT_EQ(strict.exit_code, 3) << strict.err;
  EXPECT_NE(strict.err.find("step 1: --verify"), std::string::npos) << strict.err;
  fs::remove_all(root);
}

// An output that names an input is refused and the input kept: export-hf into the checkpoint it
// reads, the metrics over the corpus, the page over the config.
TEST(RedTeam, Item15_AnOutputThatIsAnInputIsRefused) {
  const fs::path root = scratch("item15");
  ASSERT_EQ(
      run_tpusim(tiny_run({"enable_checkpointing=true", "steps=1", "run_name=a",
                           "base_output_directory=" + root.string(), "per_device_batch_size=1"}))
          .exit_code,
      0);
  const fs::path checkpoint = root / "a/checkpoints/1";
  const std::string weights = read_bytes(checkpoint / "model.safetensors");
  const auto same = run_tpusim({"export-hf", checkpoint.string(), checkpoint.string()});
  EXPECT_EQ(same.exit_code, 2) << same.err;
  EXPECT_EQ(read_bytes(checkpoint / "model.safetensors"), weights);

  const fs::path corpus = root / "corpus.txt";
  fs::copy_file(kText, corpus);
  const auto metrics =
      run_tpusim(tiny_run({"steps=1", "per_device_batch_size=1", "dataset_path=" + corpus.string(),
                           "metrics_file=" + corpus.string()}));
  EXPECT_EQ(metrics.exit_code, 2) << metrics.err;
  EXPECT_EQ(read_bytes(corpus), read_bytes(kText));

  const fs::path config = root / "my.yml";
  std::ofstream(config) << "model_name: llama2-7b\n";
  const auto page = run_tpusim({"estimate", config.string(), "--html", config.string()});
  EXPECT_EQ(page.exit_code, 2) << page.err;
  EXPECT_EQ(read_bytes(config), "model_name: llama2-7b\n");
  fs::remove_all(root);
}

// A failed export leaves the previous export whole: here config.json cannot be replaced (a
// directory stands there), so the new model.safetensors must not be moved in either.
TEST(RedTeam, Item16_FailedExportKeepsThePreviousExport) {
  const fs::path root = scratch("item16");
  ASSERT_EQ(run_tpusim(tiny_run({"enable_checkpointing=true", "steps=2", "checkpoint_period=1",
                                 "run_name=a", "base_output_directory=" + root.string(),
                                 "per_device_batch_size=1"}))
                .exit_code,
            0);
  const fs::path out = root / "hf";
  ASSERT_EQ(run_tpusim({"export-hf", (root / "a/checkpoints/1").string(), out.string()}).exit_code,
            0);
  const std::string first = read_bytes(out / "model.safetensors");
  fs::remove(out / "config.json");
  fs::create_directory(out / "config.json");
  const auto failed = run_tpusim({"export-hf", (root / "a/checkpoints/2").string(), out.string()});
  EXPECT_EQ(failed.exit_code, 2) << failed.err;
  EXPECT_EQ(read_bytes(out / "model.safetensors"), first);
  for (const auto& entry : fs::directory_iterator(out)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
  fs::remove_all(root);
}

TEST(RedTeam, Item18_NanLossWithTokenPageIsNotAnInternalError) {
  const fs::path root = scratch("item18a");
  const auto run = run_tpusim(
      tiny_run({"compile_topology=v5e-1", "steps=8", "learning_rate=1e3", "eval_interval=1",
                "per_device_batch_size=1", "abort_on_nan_loss=false", "abort_on_inf_loss=false",
                "token_viz_file=" + (root / "tokens.html").string()}));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(fs::exists(root / "tokens.html"));
  fs::remove_all(root);
}

TEST(RedTeam, Item18_BaseConfigSymlinkLoopIsExit2) {
  const fs::path root = scratch("item18b");
  fs::create_symlink(root / "loop.yml", root / "loop.yml");
  std::ofstream(root / "my.yml") << "base_config: loop.yml\n";
  expect_user_error({"estimate", (root / "my.yml").string()}, "loop.yml");
  fs::remove_all(root);
}

TEST(RedTeam, Item18_EditedStateJsonIsExit2NamingIt) {
  const fs::path root = scratch("item18c");
  const std::vector<std::string> keys = {"enable_checkpointing=true",
                                         "run_name=a",
                                         "base_output_directory=" + root.string(),
                                         "per_device_batch_size=1",
                                         "eval_interval=1",
                                         "token_viz_file=" + (root / "tokens.html").string()};
  std::vector<std::string> first = keys;
  first.emplace_back("steps=1");
  ASSERT_EQ(run_tpusim(tiny_run(first)).exit_code, 0);
  const fs::path state = root / "a/checkpoints/1/state.json";
  nlohmann::json json = nlohmann::json::parse(read_bytes(state));
  json["metadata"]["metrics"] = "{\"step\": \"one\"}\n";
  std::ofstream(state) << json.dump(2);
  std::vector<std::string> resumed = keys;
  resumed.emplace_back("steps=2");
  expect_user_error(tiny_run(resumed), "state.json");
  fs::remove_all(root);
}

// A process id that no longer runs: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) {
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(RedTeam, Item20_KilledTokenizerLeavesNoTemporaries) {
  const fs::path root = scratch("item20a");
  const fs::path cache = root / "cache";
  const std::vector<std::string> run =
      tiny_run({"steps=1", "per_device_batch_size=1", "dataset_cache_dir=" + cache.string()});
  ASSERT_EQ(run_tpusim(run).exit_code, 0);
  // The cache of this source is the one directory under dataset_cache_dir; a chunk's temporary
  // of a tokenizer killed before its rename is left there.
  const fs::path source = fs::directory_iterator(cache)->path();
  const fs::path leftover =
      source / ("chunk-0-00000.bin.tmp." + std::to_string(dead_pid()) + ".0123456789abcdef");
  std::ofstream(leftover) << "half a chunk";
  const auto again = run_tpusim(run);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_FALSE(fs::exists(leftover));
  fs::remove_all(root);
}

TEST(RedTeam, Item20_DamagedLatestCheckpointIsNamedForWhatItIs) {
  const fs::path root = scratch("item20b");
  const std::vector<std::string> keys = {"enable_checkpointing=true", "run_name=a",
                                         "base_output_directory=" + root.string(),
                                         "per_device_batch_size=1"};
  std::vector<std::string> first = keys;
  first.emplace_back("steps=2");
  first.emplace_back("checkpoint_period=1");
  ASSERT_EQ(run_tpusim(tiny_run(first)).exit_code, 0);
  const fs::path state = root / "a/checkpoints/2/state.json";
  fs::remove(state);
  fs::create_symlink(state, state);  // a link to itself: every open fails with ELOOP
  std::vector<std::string> resumed = keys;
  resumed.emplace_back("steps=3");
  const auto run = run_tpusim(tiny_run(resumed));
  EXPECT_NE(run.err.find("cannot read state.json"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("incomplete"), std::string::npos) << run.err;
  fs::remove_all(root);
}

TEST(RedTeam, Item20_CacheStartLineIsWhole) {
  const fs::path root = scratch("item20c");
  std::vector<std::string> args = tiny_run(
      {"steps=1", "per_device_batch_size=1", "dataset_cache_dir=" + (root / "cache").string()});
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  const auto run = run_tpusim(args);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("training starts once the first piece is tokenized"), std::string::npos)
      << run.err;
  fs::remove_all(root);
}

TEST(RedTeam, Item20_StepsBelowTheResumedStepIsExit2) {
  const fs::path root = scratch("item20d");
  const std::vector<std::string> keys = {"enable_checkpointing=true", "run_name=a",
                                         "base_output_directory=" + root.string(),
                                         "per_device_batch_size=1"};
  std::vector<std::string> first = keys;
  first.emplace_back("steps=2");
  ASSERT_EQ(run_tpusim(tiny_run(first)).exit_code, 0);
  std::vector<std::string> again = keys;
  again.emplace_back("steps=1");
  expect_user_error(tiny_run(again), "steps");
  fs::remove_all(root);
}

}  // namespace
}  // namespace tpusim
