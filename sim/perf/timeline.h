// sim/perf/timeline.h: a resource that serves one op at a time, for the step scheduler.
//
// The timeline keeps the busy intervals of a resource (a link, the SparseCores, the host link).
// A new op takes the earliest gap that fits at or after the time it is ready, so an op that
// becomes ready late can still slip into idle link time left between earlier ops, as XLA's
// latency-hiding scheduler fills it. The intervals never overlap, so they are kept in one sorted
// vector: ordered by start they are ordered by end too, and the first interval that can delay an
// op is found by binary search.
//
// Example:
//   Timeline link;
//   link.place(0.0, 2.0);   // -> 0: busy [0, 2)
//   link.place(1.0, 1.0);   // -> 2: waits for the first op, busy [2, 3)
//   link.place(5.0, 1.0);   // -> 5: busy [5, 6)
//   link.place(3.0, 1.0);   // -> 3: fills the gap [3, 5)
//   link.busy_within(1.0, 5.5);  // -> 3.5: busy over [1, 4) and [5, 5.5)
//   link.shift(10.0);       // every interval moves 10 s later (extrapolated iterations)
#pragma once

#include <utility>
#include <vector>

namespace tpusim {

class Timeline {
 public:
  // Books `duration` seconds at the earliest start >= ready where the resource is free for that
  // long; returns the start.
  double place(double ready, double duration);

  // Seconds of [from, to) during which the resource is busy.
  double busy_within(double from, double to) const;

  // Moves every busy interval by `delta` seconds.
  void shift(double delta);

  // Forgets every booking (keeps the storage).
  void clear() { busy_.clear(); }

 private:
  std::vector<std::pair<double, double>> busy_;  // [start, end), sorted by (start, end)
};

}  // namespace tpusim
