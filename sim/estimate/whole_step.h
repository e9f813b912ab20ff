// sim/estimate/whole_step.h: the timeline of the whole step, for the HTML page and the trace.
//
// The scheduler (sim/perf/step_simulator.h) times the first few iterations of a repeated region
// (scanned layers) until its period is steady and extrapolates the rest: the events of the
// simulated iterations are recorded, and everything after the region is shifted by the
// extrapolated iterations' time, which leaves a gap. Every op's time is worked out once per
// call, so each extrapolated iteration is the last simulated one again: here it is drawn again
// into the gap, one period later each time, so every layer iteration is on the timeline. A
// region whose events do not split into equal iterations, or a pipeline loop (its stage lanes
// already span the loop), is left as simulated. Under gradient accumulation the scheduler times
// one microbatch and the step repeats it (step = end + (steps - 1) x microbatch): the events of
// the microbatch (those that start before its end) are drawn again once per further microbatch,
// and what follows (the cross-slice gradient reduction, the optimizer) moves after the last.
//
// Example:
//   const std::vector<TraceEvent> events = whole_step_trace(estimate);  // by start time
//   whole_step_time(estimate, flow.to_time);  // a simulated time on the whole step's timeline
#pragma once

#include <vector>

#include "sim/estimate/estimate.h"

namespace tpusim {

// The most events drawn: a region's copies stop there (the trace keeps its simulated ones).
inline constexpr size_t kMostWholeStepEvents = 400000;

std::vector<TraceEvent> whole_step_trace(const Estimate& estimate);

// Where a time of the simulated trace lands on the whole step's: after the first microbatch,
// later by the other microbatches of gradient accumulation.
double whole_step_time(const Estimate& estimate, double simulated_time);

}  // namespace tpusim
