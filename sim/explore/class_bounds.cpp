#include "sim/explore/class_bounds.h"

#include <stdexcept>
#include <utility>

namespace tpusim {

std::optional<ClassSeconds> ClassBounds::find(const std::vector<std::vector<int64_t>>& keys,
                                              size_t schedule) const {
  ClassSeconds found;
  const std::lock_guard<std::mutex> lock(mutex_);
  for (size_t region = 0; region < keys.size(); ++region) {
    const auto kept = kept_.find(keys[region]);
    if (kept == kept_.end()) {
      return std::nullopt;
    }
    if (region == 0) {
      found.region_seconds.resize(kept->second.seconds.size(), std::vector<double>(keys.size()));
    } else if (kept->second.seconds.size() != found.region_seconds.size()) {
      // Kept under other cost contexts (the explore's contexts are one list today): no bound
      // rather than seconds padded or cut to fit.
      return std::nullopt;
    }
    for (size_t context = 0; context < kept->second.seconds.size(); ++context) {
      found.region_seconds[context][region] = kept->second.seconds[context];
    }
    found.other_schedule = found.other_schedule || kept->second.schedule != schedule;
  }
  return found;
}

void ClassBounds::offer(const std::vector<std::vector<int64_t>>& keys,
                        const std::vector<std::vector<double>>& region_seconds, size_t schedule) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (size_t region = 0; region < keys.size(); ++region) {
    const auto [found, added] = kept_.try_emplace(keys[region]);  // one lookup either way
    if (!added && !check_) {
      continue;  // the first offer stays (the check below compares the later ones)
    }
    Kept offered{{}, schedule};
    for (const std::vector<double>& by_region : region_seconds) {
      offered.seconds.push_back(by_region.at(region));
    }
    if (added) {
      found->second = std::move(offered);
    } else if (found->second.seconds != offered.seconds) {
      throw std::logic_error(
          "explore: two remat_policy=none programs of one region class gave different "
          "TensorCore seconds for a pass over that region");
    }
  }
}

}  // namespace tpusim
