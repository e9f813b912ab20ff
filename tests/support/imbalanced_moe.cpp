#include "tests/support/imbalanced_moe.h"

#include <cmath>
#include <stdexcept>

#include "model/config.h"
#include "sim/train/checkpoint.h"
#include "sim/train/trainer.h"

namespace tpusim::testing {

std::string write_imbalanced_moe_checkpoint(const std::string& directory) {
  constexpr float kShared = 3.0f;                // added to every embedding element
  constexpr float kPreferred[2] = {2.0f, 1.0f};  // gate columns of experts 0 and 1, along it
  ShardedModel model(Config::load("", {"model_name=tiny-moe", "compile_topology=v5e-1",
                                       "per_device_batch_size=1", "max_target_length=32"}));
  Checkpoint checkpoint = model.to_checkpoint(0);
  CheckpointTensor& embedding = checkpoint.weights.at("embed/token_embedding#0");
  for (float& value : embedding.values) {
    value += kShared;
  }
  bool found = false;
  for (auto& [name, tensor] : checkpoint.weights) {
    if (name.find("/moe/gate#") == std::string::npos) {
      continue;
    }
    found = true;
    const int64_t embed = tensor.shape.at(0);
    const int64_t experts = tensor.shape.at(1);
    const float unit = 1.0f / std::sqrt(static_cast<float>(embed));
    for (int64_t row = 0; row < embed; ++row) {
      for (int64_t expert = 0; expert < 2; ++expert) {
        tensor.values[static_cast<size_t>(row * experts + expert)] = kPreferred[expert] * unit;
      }
    }
  }
  if (!found) {
    throw std::logic_error("tiny-moe has no router gate to skew");
  }
  save_checkpoint(directory, checkpoint);
  return directory;
}

}  // namespace tpusim::testing
