// tests/sim/cli/generate_command_test.cpp: `tpusim generate` end to end through the built tpusim
// (sim/cli/generate_command.cpp): greedy decoding is the same on a sharded mesh, from the
// checkpoint and from its Hugging Face export; sampling is fixed by its seed; bad input exits 2.
// The comparison with an independent decoding loop is tests/reference/generate_reference.py.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

// A tiny-llama checkpoint after a few steps on synthetic tokens, made once for the file.
const std::string& trained_checkpoint() {
  static const std::string checkpoint = [] {
    const std::string base =
        ::testing::TempDir() + "/tpusim_generate_" + std::to_string(::getpid());
    const auto trained = run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-1",
                                     "per_device_batch_size=2", "max_target_length=16", "steps=3",
                                     "learning_rate=1e-2", "enable_checkpointing=true",
                                     "base_output_directory=" + base, "run_name=r", "--quiet"});
    EXPECT_EQ(trained.exit_code, 0) << trained.err;
    return base + "/r/checkpoints/3";
  }();
  return checkpoint;
}

nlohmann::json generate_json(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"generate", trained_checkpoint(), "--prompt",
                                   "Hello",    "--max-tokens",       "8",
                                   "--json",   "--with-logits"};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto result = run_tpusim(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return nlohmann::json::parse(result.out, nullptr, false);
}

// The gap between the two largest logits.
double top_two_gap(std::vector<double> logits) {
  std::partial_sort(logits.begin(), logits.begin() + 2, logits.end(), std::greater<>());
  return logits[0] - logits[1];
}

// Greedy tokens of `a` and `b` agree where the choice is clear (top-2 gap above 1e-4), and their
// logits agree to `tolerance`; the first difference of tokens ends the comparison (the prefixes
// differ after it).
void expect_same_decoding(const nlohmann::json& a, const nlohmann::json& b, double tolerance) {
  ASSERT_EQ(a.at("prompt_tokens"), b.at("prompt_tokens"));
  ASSERT_EQ(a.at("tokens").size(), b.at("tokens").size());
  for (size_t step = 0; step < a.at("tokens").size(); ++step) {
    const auto left = a.at("logits")[step].get<std::vector<double>>();
    const auto right = b.at("logits")[step].get<std::vector<double>>();
    double worst = 0;
    for (size_t index = 0; index < left.size(); ++index) {
      worst = std::max(worst, std::abs(left[index] - right[index]));
    }
    EXPECT_LE(worst, tolerance) << "step " << step;
    if (a.at("tokens")[step] != b.at("tokens")[step]) {
      EXPECT_LT(top_two_gap(left), 1e-4) << "step " << step << ": different tokens, clear choice";
      return;
    }
  }
}

TEST(GenerateCommand, GreedyIsTheSameShardedAndFromTheExport) {
  const nlohmann::json single = generate_json({});
  ASSERT_TRUE(single.is_object());
  EXPECT_EQ(single.at("prompt_tokens"), nlohmann::json({72, 101, 108, 108, 111}));  // bytes
  EXPECT_EQ(single.at("tokens").size(), 8u);
  EXPECT_EQ(single.at("stop"), "max_tokens");
  EXPECT_EQ(single.at("devices"), 1);
  EXPECT_EQ(single.at("logits")[0].size(), 256u);
  // Four devices: the batch over fsdp, the heads and the vocab (the logits) over tensor.
  const nlohmann::json sharded =
      generate_json({"compile_topology=v5e-4", "ici_tensor_parallelism=2"});
  EXPECT_EQ(sharded.at("devices"), 4);
  expect_same_decoding(single, sharded, 1e-4);
  // The float32 export holds the same weights bit for bit: the same logits bit for bit.
  const std::string hf = trained_checkpoint() + "-hf";
  const auto exported = run_tpusim({"export-hf", trained_checkpoint(), hf});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const auto from_hf = run_tpusim(
      {"generate", hf, "--prompt", "Hello", "--max-tokens", "8", "--json", "--with-logits"});
  ASSERT_EQ(from_hf.exit_code, 0) << from_hf.err;
  EXPECT_EQ(nlohmann::json::parse(from_hf.out), single);
  // Streamed text: the decoded bytes of the same tokens.
  const auto streamed =
      run_tpusim({"generate", trained_checkpoint(), "--prompt", "Hello", "--max-tokens", "8"});
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  std::string text;
  for (const auto& token : single.at("tokens")) {
    text += static_cast<char>(token.get<int>());
  }
  EXPECT_EQ(streamed.out, text + "\n");
}

TEST(GenerateCommand, SamplingIsFixedByTheSeed) {
  const std::vector<std::string> sample = {"--temperature", "1.5", "--top-k", "20", "--seed"};
  auto with_seed = [&](const std::string& seed) {
    std::vector<std::string> extra = sample;
    extra.push_back(seed);
    return generate_json(extra).at("tokens");
  };
  EXPECT_EQ(with_seed("7"), with_seed("7"));
  // Eight tokens drawn among 20 at temperature 1.5: another seed gives other tokens.
  EXPECT_NE(with_seed("7"), with_seed("8"));
  // top-k 1 leaves one token: the greedy choice, whatever the temperature.
  EXPECT_EQ(generate_json({"--temperature", "3", "--top-k", "1"}).at("tokens"),
            generate_json({}).at("tokens"));
}

TEST(GenerateCommand, RefusesBadInput) {
  const std::string checkpoint = trained_checkpoint();
  const std::string nowhere = ::testing::TempDir() + "/tpusim_generate_nowhere";
  expect_user_error({"generate", nowhere, "--prompt", "a"}, nowhere);
  expect_user_error({"generate", checkpoint, "--prompt", ""}, "--prompt");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--max-tokens", "0"},
                    "--max-tokens 0");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--max-tokens", "10000000"},
                    "--max-tokens 10000000");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--temperature", "-1"},
                    "--temperature -1");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--top-k", "-2"}, "--top-k -2");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--seed", "-1"}, "--seed -1");
  expect_user_error({"generate", checkpoint, "--prompt", "abcdef", "max_target_length=4"},
                    "max_target_length");
  // Another model than the checkpoint's.
  expect_user_error({"generate", checkpoint, "--prompt", "a", "base_emb_dim=32"}, "base_emb_dim");
  // Options that changed nothing, exit 0: sampling's without sampling, --with-logits without the
  // JSON object it adds to.
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--seed", "5"},
                    "--seed applies to sampling");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--top-k", "40"},
                    "--top-k applies to sampling");
  expect_user_error({"generate", checkpoint, "--prompt", "a", "--with-logits"}, "give --json");
}

}  // namespace
}  // namespace tpusim
