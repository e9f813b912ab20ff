// num_vocab_tiling = T (MaxText's chunked cross-entropy: the head and its backward run once per
// 1/T of the tokens, recomputing each chunk's logits) changes how the head is computed, not what:
// loss, gradients and updated weights equal the untiled unsharded step's within fp32 summation
// order (relative L2 <= 1e-5 per tensor), alone and under sharding, with an untied unembedding
// (tiny-llama) and with logits tied to the token embedding (tiny-gpt3, whose embedding gradient
// sums the chunks' contributions with the lookup's).
#include <gtest/gtest.h>

#include <iostream>

#include "common/error.h"
#include "sim/train/trainer.h"
#include "tests/support/one_step.h"

namespace tpusim {
namespace {

Config tiled_config(const std::string& model, int chunks, const std::vector<std::string>& mesh) {
  // The reference kernels: the tolerance is for summation order alone (fp32 GEMMs add their own
  // rounding, which AdamW's g / (|g| + eps) amplifies on the tiniest gradients).
  std::vector<std::string> overrides = {
      "model_name=" + model, "max_target_length=32", "dataset_type=synthetic",
      "num_vocab_tiling=" + std::to_string(chunks), "functional_precision=reference"};
  overrides.insert(overrides.end(), mesh.begin(), mesh.end());
  return Config::load("", overrides);
}

TEST(VocabTiling, ChunkedHeadEqualsUnchunkedUnshardedStep) {
  struct Case {
    std::string model;
    int chunks;
    std::vector<std::string> mesh;
  };
  const std::vector<Case> cases = {
      {"tiny-llama", 2, {"compile_topology=v5e-1", "per_device_batch_size=4"}},
      {"tiny-llama", 4, {"compile_topology=v5e-1", "per_device_batch_size=4"}},
      {"tiny-gpt3", 4, {"compile_topology=v5e-1", "per_device_batch_size=4"}},
      // The vocab split over tensor (cross-entropy statistics all-reduced per chunk), the
      // sequence split over context (each device chunks its own positions), FSDP gradients.
      {"tiny-llama",
       4,
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
      {"tiny-llama",
       2,
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_context_parallelism=2"}},
      {"tiny-gpt3",
       4,
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
      {"tiny-llama",
       2,
       {"compile_topology=v5e-4", "per_device_batch_size=2", "ici_fsdp_parallelism=4",
        "gradient_accumulation_steps=2"}},
  };
  for (const Case& test_case : cases) {
    const Config tiled = tiled_config(test_case.model, test_case.chunks, test_case.mesh);
    Config whole = unsharded_reference_config(tiled);
    whole.set("num_vocab_tiling", "1", "test");
    std::string label = test_case.model + " num_vocab_tiling=" + std::to_string(test_case.chunks);
    for (const std::string& item : test_case.mesh) {
      label += " " + item;
    }
    SCOPED_TRACE(label);
    const testing::OneStep chunked = testing::run_one_step(tiled);
    const testing::OneStep reference = testing::run_one_step(whole);
    const double loss = std::abs(chunked.loss - reference.loss) / std::abs(reference.loss);
    std::string worst_gradient;
    std::string worst_weight;
    const double gradients =
        testing::worst_relative_difference(chunked.gradients, reference.gradients, &worst_gradient);
    const double weights =
        testing::worst_relative_difference(chunked.state, reference.state, &worst_weight);
    std::cout << "  rel-L2 loss " << loss << " gradients " << gradients << " (" << worst_gradient
              << ") weights " << weights << " (" << worst_weight << ")  " << label << "\n";
    EXPECT_LE(loss, 1e-5);
    EXPECT_LE(gradients, 1e-5);
    EXPECT_LE(weights, 1e-5);
    EXPECT_GT(reference.loss, 0.0);
  }
}

// Chunks that do not split a device's positions evenly: a UserError naming the key.
TEST(VocabTiling, UnevenChunksOfTheLocalSequenceAreAUserError) {
  const Config config =
      Config::load("", {"model_name=tiny-llama", "max_target_length=24", "num_vocab_tiling=4",
                        "compile_topology=v5e-4", "per_device_batch_size=1",
                        "ici_fsdp_parallelism=1", "ici_context_parallelism=4"});
  try {
    ShardedModel model(config);
    FAIL() << "expected a UserError";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("num_vocab_tiling: 4"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace tpusim
