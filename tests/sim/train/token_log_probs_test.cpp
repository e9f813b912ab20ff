// The per-token log-probabilities behind the token view (token_viz_file): recorded by the sharded
// cross-entropy (vocab split over tensor parallelism, a chunked head), gathered to global
// [sequence, position], they average to minus the step's loss and equal the unsharded model's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/config.h"
#include "sim/train/dataset.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

TEST(TokenLogProbs, ShardedValuesAverageToTheLossAndMatchTheReference) {
  const std::vector<std::vector<std::string>> meshes = {
      {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"},
      {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "num_vocab_tiling=2"},
      {"ici_fsdp_parallelism=1", "ici_context_parallelism=2", "ici_tensor_parallelism=2"}};
  for (const std::vector<std::string>& mesh : meshes) {
    std::vector<std::string> overrides = {"model_name=tiny-llama", "compile_topology=v5e-4",
                                          "per_device_batch_size=1", "max_target_length=32"};
    overrides.insert(overrides.end(), mesh.begin(), mesh.end());
    const Config config = Config::load("", overrides);
    SCOPED_TRACE(mesh.back());
    ShardedModel sharded(config);
    ShardedModel reference(unsharded_reference_config(config));
    const int64_t sequences = sharded.program().microbatch;
    const Batch batch = Dataset::from_config(config).train_batch(0, 0, sequences);
    auto record = [&](ShardedModel& model, double& loss) {
      TokenLogProbs log_probs;
      log_probs.sequences = sequences;
      log_probs.length = 32;
      loss = model.compute_gradients({batch}, &log_probs).loss;
      return log_probs.values;
    };
    double loss = 0;
    double reference_loss = 0;
    const std::vector<float> values = record(sharded, loss);
    const std::vector<float> expected = record(reference, reference_loss);
    ASSERT_EQ(values.size(), static_cast<size_t>(sequences * 32));
    double sum = 0;
    for (size_t token = 0; token < values.size(); ++token) {
      ASSERT_TRUE(std::isfinite(values[token])) << "token " << token << " was not recorded";
      EXPECT_LT(values[token], 0.0F);
      EXPECT_NEAR(values[token], expected[token], 1e-4) << "token " << token;
      sum += values[token];
    }
    EXPECT_NEAR(-sum / static_cast<double>(values.size()), loss, 1e-5 * loss);
  }
}

}  // namespace
}  // namespace tpusim
