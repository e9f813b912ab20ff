// qwen3-next-80b-a3b (Gated DeltaNet + gated attention, 512 experts) estimated on several meshes:
// the sharded per-device program runs through the performance and memory models, and its weights
// are spread over the devices as the model card's 80B parameters should be.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/config.h"
#include "sim/estimate/estimate.h"

namespace tpusim {
namespace {

TEST(GatedDeltaNetEstimate, RunsShardedOnSeveralMeshes) {
  // fp32 master weights (weight_dtype), 79.67B parameters (tests/model/gated_delta_net_test.cpp,
  // by hand): 318.7 GB over the devices of each mesh, which split every large weight.
  constexpr double kWeightBytes = 79.67e9 * 4;
  const std::vector<std::vector<std::string>> meshes = {
      {"compile_topology=v5p-8"},
      {"compile_topology=tpu7x-16", "ici_tensor_parallelism=2"},
      {"compile_topology=v5p-16", "ici_expert_parallelism=4"},
      {"compile_topology=v5p-16", "ici_context_parallelism=2"},
  };
  for (const auto& mesh : meshes) {
    std::vector<std::string> overrides = {"model_name=qwen3-next-80b-a3b",
                                          "per_device_batch_size=1", "max_target_length=1024"};
    overrides.insert(overrides.end(), mesh.begin(), mesh.end());
    SCOPED_TRACE(mesh.front() + (mesh.size() > 1 ? " " + mesh[1] : ""));
    const Estimate estimate = estimate_config(Config::load("", overrides));
    EXPECT_TRUE(std::isfinite(estimate.step_seconds));
    EXPECT_GT(estimate.step_seconds, 0);
    EXPECT_GT(estimate.mfu, 0);
    EXPECT_LT(estimate.mfu, 1);
    const double devices = estimate.json["devices"].get<double>();
    const double weights = estimate.json["memory"]["weights_bytes"].get<double>();
    EXPECT_NEAR(weights * devices / kWeightBytes, 1.0, 0.01);
  }
}

}  // namespace
}  // namespace tpusim
