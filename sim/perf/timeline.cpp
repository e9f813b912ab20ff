#include "sim/perf/timeline.h"

#include <algorithm>

namespace tpusim {

double Timeline::place(double ready, double duration) {
  // Intervals that end by `ready` cannot delay the op; they are a prefix, since the intervals are
  // disjoint and sorted (a zero-length interval sits at the edge of a busy one, never inside).
  auto interval = std::partition_point(
      busy_.begin(), busy_.end(),
      [ready](const std::pair<double, double>& busy) { return busy.second <= ready; });
  double start = ready;
  for (; interval != busy_.end(); ++interval) {
    const auto& [busy_start, busy_end] = *interval;
    if (busy_end <= start) {
      continue;
    }
    if (busy_start >= start + duration) {
      break;
    }
    start = std::max(start, busy_end);
  }
  const std::pair<double, double> booked{start, start + duration};
  busy_.insert(std::upper_bound(busy_.begin(), busy_.end(), booked), booked);
  return start;
}

void Timeline::shift(double delta) {
  for (auto& [start, end] : busy_) {
    start += delta;
    end += delta;
  }
}

}  // namespace tpusim
