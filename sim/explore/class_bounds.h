// sim/explore/class_bounds.h: the TensorCore seconds per region pass of the remat_policy=none
// programs the explorer built, by (mesh equivalence key, batch class key), shared by the worker
// threads and by the pipeline schedules of one explore: a (mesh, batch) of a class whose program
// was built on an equivalent mesh, at another batch or under another schedule, gets its exact
// TensorCore bound from them (bounds_from_regions with its own repeats and accumulation count,
// step_bounds.h) without a partition (batch_classes.h says why the seconds are the same).
//
// Example:
//   ClassBounds kept(/*check=*/false);
//   kept.offer(key, {none.region_seconds, /*schedule=*/0});
//   std::optional<ClassSeconds> found = kept.find(key);  // from any thread, any schedule
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace tpusim {

struct ClassSeconds {
  std::vector<std::vector<double>> region_seconds;  // ComputeBounds::region_seconds
  size_t schedule = 0;                              // the schedule whose program gave them
};

class ClassBounds {
 public:
  // `check`: seconds offered again for a key are compared with those kept (std::logic_error when
  // they differ: the class argument would be wrong), for tests.
  explicit ClassBounds(bool check) : check_(check) {}
  std::optional<ClassSeconds> find(const std::vector<int64_t>& key) const;
  void offer(const std::vector<int64_t>& key, const ClassSeconds& seconds);

 private:
  bool check_ = false;
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, ClassSeconds> kept_;
};

}  // namespace tpusim
