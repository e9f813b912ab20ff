// sim/estimate/trace_lanes.h: the lanes of a step's timeline in the order people read them, for
// the Chrome trace and the HTML step page: compute first (and a pipeline's "Stage s" lanes), then the links inside a chip or node
// (ICI, D2D, NVLink), the SparseCores, the links between slices or nodes (DCN, InfiniBand), and
// the host link.
//
// Example:
//   ordered_lanes(estimate.timing.trace)
//     -> {"TensorCore", "ICI fsdp", "D2D tensor", "SparseCore fsdp", "DCN data", "Host link"}
#pragma once

#include <string>
#include <vector>

#include "sim/perf/step_simulator.h"

namespace tpusim {

// 0 compute, 1 in-chip/in-node links, 2 SparseCore, 3 between slices or nodes, 4 host.
int lane_group(const std::string& lane);

// The distinct lanes of `trace`, by group and then by first use.
std::vector<std::string> ordered_lanes(const std::vector<TraceEvent>& trace);

}  // namespace tpusim
