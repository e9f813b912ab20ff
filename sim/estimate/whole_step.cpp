#include "sim/estimate/whole_step.h"

#include <algorithm>
#include <map>
#include <string>

namespace tpusim {
namespace {

bool on_compute_lane(const StepTiming& timing, const TraceEvent& event) {
  const LaneKind kind = timing.lanes[static_cast<size_t>(event.lane)].kind;
  return kind == LaneKind::kTensorCore || kind == LaneKind::kGpuSms;
}

// The end of the last compute event among `indices` (of timing.trace), else of any event.
double iteration_end(const StepTiming& timing, const std::vector<size_t>& indices, size_t from,
                     size_t count) {
  double compute_end = -1;
  double any_end = -1;
  for (size_t index = from; index < from + count; ++index) {
    const TraceEvent& event = timing.trace[indices[index]];
    const double end = event.start + event.duration;
    any_end = std::max(any_end, end);
    if (on_compute_lane(timing, event)) {
      compute_end = std::max(compute_end, end);
    }
  }
  return compute_end >= 0 ? compute_end : any_end;
}

}  // namespace

std::vector<TraceEvent> whole_step_trace(const Estimate& estimate) {
  const StepTiming& timing = estimate.timing;
  std::vector<TraceEvent> events = timing.trace;
  std::map<std::string, std::vector<size_t>> by_region;  // indices into timing.trace, in order
  for (size_t index = 0; index < timing.trace.size(); ++index) {
    by_region[timing.trace[index].region].push_back(index);
  }
  const int64_t most_simulated = estimate.perf.max_simulated_iterations;
  for (const Region& region : estimate.program.program.graph.regions()) {
    const int64_t simulated = std::min<int64_t>(region.repeat, most_simulated);
    const auto found = by_region.find(region.name);
    if (region.pipelined() || region.repeat <= simulated || simulated < 2 ||
        found == by_region.end() || found->second.size() % static_cast<size_t>(simulated) != 0) {
      continue;
    }
    const std::vector<size_t>& indices = found->second;
    const size_t per_iteration = indices.size() / static_cast<size_t>(simulated);
    const size_t last = indices.size() - per_iteration;
    // The steady period, as the scheduler measures it: from one iteration's end to the next.
    const double period = iteration_end(timing, indices, last, per_iteration) -
                          iteration_end(timing, indices, last - per_iteration, per_iteration);
    for (int64_t copy = 1; copy <= region.repeat - simulated; ++copy) {
      if (events.size() + per_iteration > kMostWholeStepEvents) {
        break;
      }
      for (size_t index = last; index < indices.size(); ++index) {
        TraceEvent event = timing.trace[indices[index]];
        event.start += static_cast<double>(copy) * period;
        events.push_back(event);
      }
    }
  }
  const int64_t microbatches = estimate.program.accumulation_steps;
  if (microbatches > 1) {
    const double microbatch = timing.microbatch_seconds;
    const size_t drawn = events.size();
    for (size_t index = 0; index < drawn; ++index) {
      if (events[index].start >= microbatch) {
        events[index].start = whole_step_time(estimate, events[index].start);
        continue;
      }
      for (int64_t copy = 1; copy < microbatches && events.size() < kMostWholeStepEvents; ++copy) {
        TraceEvent event = events[index];
        event.start += static_cast<double>(copy) * microbatch;
        events.push_back(event);
      }
    }
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.start < b.start; });
  return events;
}

double whole_step_time(const Estimate& estimate, double simulated_time) {
  const double microbatch = estimate.timing.microbatch_seconds;
  const auto others = static_cast<double>(estimate.program.accumulation_steps - 1);
  return simulated_time >= microbatch ? simulated_time + others * microbatch : simulated_time;
}

}  // namespace tpusim
