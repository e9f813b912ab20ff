// sim/explore/class_bounds.h: the TensorCore seconds of one pass over each region of the
// remat_policy=none programs the explorer built, by (mesh equivalence key, region class key),
// shared by the worker threads and by the pipeline schedules of one explore. A (mesh, batch)
// whose every region has the key of a region some built program had, on an equivalent mesh, at
// another batch or under another schedule, gets its exact TensorCore bound from those seconds
// (bounds_from_regions with its own repeats and accumulation count, step_bounds.h) without a
// partition (batch_classes.h says why the seconds are the same).
//
// Example:
//   ClassBounds kept(/*check=*/false);
//   kept.offer(keys, none.region_seconds, /*schedule=*/0);  // keys[r]: region r's key
//   std::optional<ClassSeconds> found = kept.find(keys, 1);  // from any thread, any schedule
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
  bool other_schedule = false;  // some region's seconds came from another schedule's program
};

class ClassBounds {
 public:
  // `check`: seconds offered again for a key are compared with those kept (std::logic_error when
  // they differ: the class argument would be wrong), for tests.
  explicit ClassBounds(bool check) : check_(check) {}
  // The seconds of every region (keys[r]: region r's key) when each is known, for `schedule`.
  std::optional<ClassSeconds> find(const std::vector<std::vector<int64_t>>& keys,
                                   size_t schedule) const;
  // Keeps a built program's seconds per context and region under its regions' keys.
  void offer(const std::vector<std::vector<int64_t>>& keys,
             const std::vector<std::vector<double>>& region_seconds, size_t schedule);

 private:
  struct Kept {
    std::vector<double> seconds;  // per context
    size_t schedule = 0;
  };
  bool check_ = false;
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, Kept> kept_;
};

}  // namespace tpusim
