// Dropless MoE (capacity_factor <= 0, MaxText's sparse_matmul) keeps every token choice however
// unbalanced the routing: on a tiny-moe whose router sends every token to experts 0 and 1 (twice
// their balanced share; tests/support/imbalanced_moe.h) a capacity_factor=1 step visibly differs
// (it drops half of those choices), while the dropless step under expert, fsdp and tensor
// parallelism equals the unsharded one within fp32 summation order (relative L2 <= 1e-5 per
// tensor on loss, gradients and updated weights). Expert parallelism exchanges its worst-case
// buffers (sharding/partitioner.cpp size_dropless_buffers). The fp64 torch reference checks the
// same unbalanced step against a dense computation (tests/reference/run_torch_reference.sh).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <iostream>

#include "model/config.h"
#include "sim/train/trainer.h"
#include "tests/support/imbalanced_moe.h"
#include "tests/support/one_step.h"

namespace tpusim {
namespace {

const std::string& imbalanced_checkpoint() {
  static const std::string path = testing::write_imbalanced_moe_checkpoint(
      ::testing::TempDir() + std::to_string(::getpid()) + "_tpusim_imbalanced_moe");
  return path;
}

Config moe_config(const std::vector<std::string>& mesh) {
  // The reference kernels: the tolerance is for summation order alone.
  std::vector<std::string> overrides = {"model_name=tiny-moe", "max_target_length=32",
                                        "dataset_type=synthetic", "functional_precision=reference"};
  overrides.insert(overrides.end(), mesh.begin(), mesh.end());
  return Config::load("", overrides);
}

TEST(DroplessMoe, UnbalancedRoutingWouldDropWithACapacity) {
  const std::vector<std::string> one_device = {"compile_topology=v5e-1", "per_device_batch_size=4"};
  std::vector<std::string> capacity = one_device;
  capacity.insert(capacity.end(), {"sparse_matmul=false", "capacity_factor=1.0"});
  const testing::OneStep dropless =
      testing::run_one_step(moe_config(one_device), imbalanced_checkpoint());
  const testing::OneStep dropping =
      testing::run_one_step(moe_config(capacity), imbalanced_checkpoint());
  const double loss = std::abs(dropping.loss - dropless.loss) / dropless.loss;
  const double gradients =
      testing::worst_relative_difference(dropping.gradients, dropless.gradients);
  std::cout << "  capacity_factor=1 vs dropless on the unbalanced router: rel loss " << loss
            << ", worst gradient rel-L2 " << gradients << "\n";
  EXPECT_GT(gradients, 1e-2);  // half of experts 0 and 1's choices dropped
}

TEST(DroplessMoe, ShardedEqualsUnshardedOnUnbalancedRouting) {
  const std::vector<std::vector<std::string>> meshes = {
      {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
       "ici_expert_parallelism=4"},
      {"compile_topology=v5e-8", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
       "ici_expert_parallelism=2", "ici_tensor_parallelism=2"},
      {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=4"},
      {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
       "ici_context_parallelism=2"},
  };
  for (const auto& mesh : meshes) {
    std::string label;
    for (const std::string& item : mesh) {
      label += " " + item;
    }
    SCOPED_TRACE(label);
    const Config sharded = moe_config(mesh);
    const testing::OneStep actual = testing::run_one_step(sharded, imbalanced_checkpoint());
    const testing::OneStep expected =
        testing::run_one_step(unsharded_reference_config(sharded), imbalanced_checkpoint());
    const double loss = std::abs(actual.loss - expected.loss) / expected.loss;
    std::string worst_gradient;
    std::string worst_weight;
    const double gradients =
        testing::worst_relative_difference(actual.gradients, expected.gradients, &worst_gradient);
    const double weights =
        testing::worst_relative_difference(actual.state, expected.state, &worst_weight);
    std::cout << "  rel-L2 loss " << loss << " gradients " << gradients << " (" << worst_gradient
              << ") weights " << weights << " (" << worst_weight << ") " << label << "\n";
    EXPECT_LE(loss, 1e-5);
    EXPECT_LE(gradients, 1e-5);
    EXPECT_LE(weights, 1e-5);
  }
}

}  // namespace
}  // namespace tpusim
