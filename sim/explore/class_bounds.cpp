#include "sim/explore/class_bounds.h"

#include <stdexcept>

namespace tpusim {

std::optional<ClassSeconds> ClassBounds::find(const std::vector<int64_t>& key) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = kept_.find(key);
  if (found == kept_.end()) {
    return std::nullopt;
  }
  return found->second;
}

void ClassBounds::offer(const std::vector<int64_t>& key, const ClassSeconds& seconds) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto [found, added] = kept_.try_emplace(key, seconds);
  if (!added && check_ && found->second.region_seconds != seconds.region_seconds) {
    throw std::logic_error(
        "explore: two remat_policy=none programs of one batch class gave different TensorCore "
        "seconds per region pass");
  }
}

}  // namespace tpusim
