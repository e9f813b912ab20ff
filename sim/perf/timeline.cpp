#include "sim/perf/timeline.h"

#include <algorithm>
#include <iterator>

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
  // A booking of positive length that touches positive-length neighbours is merged with them
  // (back-to-back transfers keep the list short). For bookings of positive length only the union
  // of those intervals matters; zero-length ones, which can hold a later op at their instant,
  // stay apart.
  const std::pair<double, double> booked{start, start + duration};
  auto at = std::upper_bound(busy_.begin(), busy_.end(), booked);
  const bool mergeable = duration > 0;
  const bool joins_previous = mergeable && at != busy_.begin() &&
                              std::prev(at)->second == booked.first &&
                              std::prev(at)->first < std::prev(at)->second;
  const bool joins_next =
      mergeable && at != busy_.end() && at->first == booked.second && at->first < at->second;
  if (joins_previous && joins_next) {
    std::prev(at)->second = at->second;
    busy_.erase(at);
  } else if (joins_previous) {
    std::prev(at)->second = booked.second;
  } else if (joins_next) {
    at->first = booked.first;
  } else {
    busy_.insert(at, booked);
  }
  return start;
}

double Timeline::busy_within(double from, double to) const {
  auto interval = std::partition_point(
      busy_.begin(), busy_.end(),
      [from](const std::pair<double, double>& busy) { return busy.second <= from; });
  double busy = 0;
  for (; interval != busy_.end() && interval->first < to; ++interval) {
    busy += std::max(0.0, std::min(to, interval->second) - std::max(from, interval->first));
  }
  return busy;
}

void Timeline::shift(double delta) {
  for (auto& [start, end] : busy_) {
    start += delta;
    end += delta;
  }
}

}  // namespace tpusim
