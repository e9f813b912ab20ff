#include "sim/explore/training_step_cache.h"

#include "model/config.h"
#include "sim/explore/candidate.h"

namespace tpusim {

TrainingStepCache::TrainingStepCache(const Config& config, const SearchSpace& space)
    : config_(config), space_(space), rules_(LogicalAxisRules::from_config(config)) {
  for (size_t remat = 0; remat < space.remats.size(); ++remat) {
    if (space.remats[remat].policy == "none" && space.remats[remat].tensors.empty()) {
      none_ = remat;
    }
  }
}

std::shared_ptr<const TrainingStep> TrainingStepCache::get(size_t batch, size_t remat) {
  return entry(batch, remat).step;
}

const std::vector<RecomputedOp>& TrainingStepCache::recomputed(size_t batch, size_t remat) {
  Entry& found = entry(batch, remat);
  std::call_once(found.recomputed_once, [&] {
    const std::shared_ptr<const TrainingStep> none = get(batch, kNoRemat);
    if (none != found.step) {
      found.recomputed = recomputed_beyond_none(*found.step, *none);
    }
  });
  return found.recomputed;
}

const MemoryFloor& TrainingStepCache::memory_floor(size_t batch, size_t remat) {
  Entry& found = entry(batch, remat);
  std::call_once(found.floor_once, [&] { found.floor.emplace(*found.step, rules_); });
  return *found.floor;
}

TrainingStepCache::Entry& TrainingStepCache::entry(size_t batch, size_t remat) {
  if (remat == kNoRemat && none_ != kNoRemat) {
    remat = none_;  // the space's own "none": one step, so programs can be shared
  }
  const std::pair<size_t, size_t> key{batch, remat};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto found = steps_.find(key); found != steps_.end()) {
      return *found->second;
    }
  }
  Candidate candidate;
  candidate.batch = space_.batches[batch];
  candidate.remat = remat == kNoRemat ? 0 : static_cast<int>(remat);
  candidate.attention = space_.attention_kinds.front();  // does not change the step (above)
  Config config;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // Config copies share yaml-cpp nodes
    config = candidate_config(config_, space_, candidate);
    if (remat == kNoRemat) {
      config.set_string("remat_policy", "none", kExploreOrigin);
    }
  }
  auto built = std::make_unique<Entry>();
  built->step = std::make_shared<const TrainingStep>(
      build_training_step(config, space_.batches[batch].microbatch));
  std::lock_guard<std::mutex> lock(mutex_);
  // Another thread may have built it meanwhile: the first one stays (steps are shared).
  return *steps_.emplace(key, std::move(built)).first->second;
}

}  // namespace tpusim
