// sim/explore/training_step_cache.h: the training steps explore's meshes share, one per
// (batch, remat), built on first use by whichever worker thread needs it first.
//
// The attention kind is not part of the key: it selects the attention kernel's cost
// (CostContext::flash_attention), not the ops, tensors or memory of the step (explore_test checks
// that both kinds build the same step), so one program serves both kinds as timing variants.
//
// Example:
//   TrainingStepCache steps(config, space);
//   std::shared_ptr<const TrainingStep> step = steps.get(/*batch=*/0, /*remat=*/1);
//   steps.get(0, TrainingStepCache::kNoRemat);  // remat_policy=none, for the bounds
//   steps.recomputed(0, 1);  // what remat 1 recomputes beyond none
//   steps.memory_floor(0, 1).bytes(mesh);  // its HBM floor on a mesh
#pragma once

#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/autodiff/training_step.h"
#include "sim/explore/memory_floor.h"
#include "sim/explore/search_space.h"
#include "sim/explore/step_bounds.h"

namespace tpusim {

class Config;

class TrainingStepCache {
 public:
  TrainingStepCache(const Config& config, const SearchSpace& space);

  // As a remat index: remat_policy=none, whether or not the space has it (bounds).
  static constexpr size_t kNoRemat = std::numeric_limits<size_t>::max();

  std::shared_ptr<const TrainingStep> get(size_t batch, size_t remat);

  // What `remat` recomputes beyond remat_policy=none (see remat_bounds).
  const std::vector<RecomputedOp>& recomputed(size_t batch, size_t remat);

  // The step's memory floor (memory_floor.h), built on first use with the config's logical axis
  // rules resolved (pass the same rules to its bytes()).
  const MemoryFloor& memory_floor(size_t batch, size_t remat);

 private:
  struct Entry {
    std::shared_ptr<const TrainingStep> step;
    std::once_flag recomputed_once;
    std::vector<RecomputedOp> recomputed;
    std::once_flag floor_once;
    std::optional<MemoryFloor> floor;
  };

  Entry& entry(size_t batch, size_t remat);

  const Config& config_;
  const SearchSpace& space_;
  LogicalAxisRules rules_;  // the floors resolve their tensors' axes with them once
  size_t none_ = kNoRemat;
  std::mutex mutex_;
  std::map<std::pair<size_t, size_t>, std::unique_ptr<Entry>> steps_;  // by (batch, remat)
};

}  // namespace tpusim
