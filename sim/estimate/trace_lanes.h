// sim/estimate/trace_lanes.h: the lanes of a step's timeline in the order people read them, for
// the Chrome trace and the HTML step page: compute first (and a pipeline's stage lanes), then the
// links inside a chip or node (ICI, D2D, NVLink), the SparseCores, the links between slices or
// nodes (DCN, InfiniBand), and the host link.
//
// Example:
//   const std::vector<int> lanes = ordered_lanes(estimate.timing);  // into timing.lanes
//     -> TensorCore, ICI fsdp, D2D tensor, SparseCore fsdp, DCN data, Host link
//   lane_rows(estimate.timing, lanes)[event.lane];                  // the event's row
//   event_resource(timing.lanes[event.lane], event.detail);          // "mxu", "ici", ...
#pragma once

#include <string>
#include <vector>

#include "sim/perf/step_simulator.h"

namespace tpusim {

// 0 compute, 1 in-chip/in-node links, 2 SparseCore, 3 between slices or nodes, 4 host.
int lane_group(const TraceLane& lane);

// The lanes the trace's events use (indices into timing.lanes), by group and then by first use.
std::vector<int> ordered_lanes(const StepTiming& timing);

// Each lane's row (by index into timing.lanes) in the order `ordered` gives; 0 for a lane no
// event uses.
std::vector<int> lane_rows(const StepTiming& timing, const std::vector<int>& ordered);

// The resource an event occupies, for its colour in the pages (sim/html/html_page.h's
// resourceColor): on a compute lane what bounds the op (mxu, hbm, vpu, overhead; "shared" for a
// collective the TensorCore drives), on a stage lane "stage" or "bubble", else the link: ici,
// d2d, nvlink, sparsecore, dcn, infiniband, host.
std::string event_resource(const TraceLane& lane, const std::string& detail);

}  // namespace tpusim
