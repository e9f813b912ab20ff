#include "sim/memory/memory_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "model/config.h"

namespace tpusim {
namespace {

constexpr double kBf16 = 2;
constexpr double kF32 = 4;

MemoryEstimate memory_for(const std::vector<std::string>& extra,
                          const std::string& topology = "v5p-8") {
  std::vector<std::string> overrides = {"model_name=llama2-7b", "compile_topology=" + topology,
                                        "per_device_batch_size=1", "max_target_length=1024"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return estimate_memory(build_step_program(Config::load("", overrides)));
}

// Memory when the backward pass starts on the decoder layers: every saved activation is live.
const MemoryCheckpoint& backward_start(const MemoryEstimate& memory) {
  for (const MemoryCheckpoint& checkpoint : memory.timeline) {
    if (checkpoint.where == "layer/grad (first iteration)") {
      return checkpoint;
    }
  }
  throw std::logic_error("no layer/grad checkpoint");
}

// llama2-7b: 32 layers of 4*D^2 + 3*D*F weights, D=4096, F=11008, plus the embedding and
// unembedding (32000 x 4096 each) and 2 norms per layer + the final norm (D each).
constexpr double kLayerParameters = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008 + 2 * 4096;
constexpr double kParameters = 32 * kLayerParameters + 2.0 * 32000 * 4096 + 4096;

TEST(MemoryModel, WeightsAndOptimizerStateAreShardedOverFsdp) {
  const MemoryEstimate four = memory_for({});
  // Everything is split 4 ways: the llama2 preset's ['norm', 'fsdp'] rule shards the norm scales.
  const double expected_weights = kParameters * kF32 / 4;
  EXPECT_NEAR(four.at_peak.weights / expected_weights, 1.0, 1e-12);
  EXPECT_NEAR(four.at_peak.optimizer_state / (2 * expected_weights), 1.0, 1e-12);
  const MemoryEstimate eight = memory_for({}, "v5p-16");
  EXPECT_NEAR(eight.at_peak.weights / four.at_peak.weights, 0.5, 0.001);
}

TEST(MemoryModel, FullRematSavesOnlyLayerInputs) {
  const MemoryCheckpoint memory = backward_start(memory_for({"remat_policy=full"}));
  // At the start of the backward pass: every layer's input (1 sequence of 1024 x 4096 in bf16
  // per device) plus what the head keeps (its input, the final norm's output and the logits).
  const double layer_inputs = 32 * 1024.0 * 4096 * kBf16;
  EXPECT_GE(memory.memory.saved_activations, layer_inputs);
  const double head = 2 * 1024.0 * 4096 * kBf16 + 1024.0 * 32000 * kBf16;
  EXPECT_LE(memory.memory.saved_activations, layer_inputs + head + 2 * 1024 * 4.0 /*tokens*/);
}

TEST(MemoryModel, RematPolicyOrdersSavedActivations) {
  const double full = backward_start(memory_for({"remat_policy=full"})).memory.saved_activations;
  const double qkv =
      backward_start(memory_for({"remat_policy=save_qkv_proj"})).memory.saved_activations;
  const double minimal =
      backward_start(memory_for({"remat_policy=minimal"})).memory.saved_activations;
  const double none = backward_start(memory_for({"remat_policy=none"})).memory.saved_activations;
  EXPECT_LT(full, qkv);
  EXPECT_LT(qkv, minimal);
  EXPECT_LT(minimal, none);
  // save_qkv_proj adds q, k and v per layer: 3 x 1024 x 32 heads x 128 in bf16.
  EXPECT_NEAR(qkv - full, 32 * 3 * 1024.0 * 4096 * kBf16, 1.0);
}

TEST(MemoryModel, OffloadMovesLayerInputsToHost) {
  const MemoryCheckpoint device = backward_start(memory_for({"remat_policy=custom"}));
  const MemoryCheckpoint host =
      backward_start(memory_for({"remat_policy=custom", "decoder_layer_input=offload"}));
  const double layer_inputs = 32 * 1024.0 * 4096 * kBf16;
  EXPECT_NEAR(device.memory.saved_activations - host.memory.saved_activations, layer_inputs, 1.0);
  EXPECT_NEAR(host.host_offloaded_bytes, layer_inputs, 1.0);
}

TEST(MemoryModel, VerdictAgainstUsableHbm) {
  const MemoryEstimate small = memory_for({});
  EXPECT_TRUE(small.fits);
  EXPECT_DOUBLE_EQ(small.capacity_bytes, 95.0 * 1024 * 1024 * 1024);  // v5p: 95 GiB usable
  const MemoryEstimate big = estimate_memory(build_step_program(Config::load(
      "", {"model_name=llama2-7b", "compile_topology=v5p-8", "per_device_batch_size=64",
           "max_target_length=1024", "remat_policy=none"})));
  EXPECT_FALSE(big.fits);
  EXPECT_GT(big.peak_bytes, big.capacity_bytes);
}

// num_vocab_tiling chunks the logits: the head keeps no [tokens, vocab] tensor for backward and
// works on 1/T of the tokens at a time; its weights are counted once, not once per chunk.
TEST(MemoryModel, VocabTilingShrinksLogitsMemory) {
  const auto head_grad = [](const MemoryEstimate& memory) {
    for (const MemoryCheckpoint& checkpoint : memory.timeline) {
      if (checkpoint.where == "head/grad (first iteration)") {
        return checkpoint.memory;
      }
    }
    throw std::logic_error("no head/grad checkpoint");
  };
  const MemoryEstimate whole = memory_for({});
  const MemoryEstimate tiled = memory_for({"num_vocab_tiling=8"});
  const double logits = 1024.0 * 32000 * kBf16;
  const MemoryBreakdown before = head_grad(whole);
  const MemoryBreakdown after = head_grad(tiled);
  EXPECT_GT(before.saved_activations - after.saved_activations, 0.9 * logits);
  EXPECT_LT(after.temporaries + after.saved_activations,
            before.temporaries + before.saved_activations - logits);
  EXPECT_DOUBLE_EQ(whole.at_peak.weights, tiled.at_peak.weights);
  EXPECT_DOUBLE_EQ(whole.at_peak.optimizer_state, tiled.at_peak.optimizer_state);
}

TEST(MemoryModel, PeakIsTheSumOfItsCategories) {
  const MemoryEstimate memory = memory_for({"remat_policy=minimal"});
  EXPECT_DOUBLE_EQ(memory.peak_bytes, memory.at_peak.total());
  EXPECT_FALSE(memory.peak_region.empty());
}

TEST(MemoryModel, DotProductAttentionCountsItsScores) {
  // llama2-7b, 8192 tokens, 2 sequences per device on v5p-8 (fsdp=4): one attention op's scores
  // are 2 x 32 heads x 8192 x 8192 bf16 = 8 GiB; backward holds two such buffers. flash holds none.
  const auto peak = [](const std::string& attention) {
    return estimate_memory(
               build_step_program(Config::load(
                   "", {"model_name=llama2-7b", "compile_topology=v5p-8", "max_target_length=8192",
                        "per_device_batch_size=2", "remat_policy=full", "attention=" + attention})))
        .peak_bytes;
  };
  const double scores = 2.0 * 32 * 8192 * 8192 * 2;
  const double extra = peak("dot_product") - peak("flash");
  EXPECT_GE(extra, scores);
  EXPECT_LE(extra, 2 * scores);
}

}  // namespace
}  // namespace tpusim
