// sim/perf/collective_cost.h: time of a collective over mesh axes on the physical topology.
//
// A group of mesh axes runs one ring per physical axis it covers, over the positions its mesh axes
// take there together (sharding/device_mesh.h places them): mesh axes that split one physical axis
// share its links, so their portions form one ring, not one ring each. Per
// docs/reference/hardware.md §2, for V = the per-device array gathered, scattered or reduced
// over a group of N devices:
//   all-gather / reduce-scatter: T = max(T_hop x hops, (N-1)/N x V / W)
//   all-reduce: reduce-scatter + all-gather;  all-to-all: a quarter of an all-gather on a
//   bidirectional ring, half on a line
// where W adds the bandwidth of every physical axis the ring spans: 2 x link per wrapped torus
// axis (a bidirectional ring), 1 x link on an open line (the far end is N-1 hops away), the D2D
// link for the v7x chiplet pair, and the host NICs for DCN (each chip's share). A group that spans
// the chiplet pair and torus axes is also bounded by the chip's ingress: the bytes the chip lacks
// all enter over its torus links, whatever the D2D link adds. Links run at
// their achievable fraction; each collective pays collective_launch_us. On a GPU node
// (slice.switched) W is the GPU's whole NVLink bandwidth through the switch and a ring of N takes
// N - 1 hops. An axis split over ICI
// and DCN runs hierarchically: the ICI part, then the DCN part.
//
// Example:
//   CollectiveTime time = collective_time(op, bytes, mesh, slice);
//   time.seconds; time.link;   // LinkKind::kIci, kDcn, kD2d
#pragma once

#include <string>

#include "common/mechanisms.h"
#include "hw/slice.h"
#include "model/ir/op.h"
#include "sharding/device_mesh.h"
#include "sim/perf/timing_labels.h"

namespace tpusim {

struct CollectiveTime {
  double seconds = 0;
  double ici_seconds = 0;
  double dcn_seconds = 0;
  // Of dcn_seconds, the latency of the messages sent one after the other across slices
  // (dcn_step_latency; 0 with the mechanism off), which the TensorCore driving a reduction waits
  // out.
  double dcn_latency_seconds = 0;
  LinkKind link = LinkKind::kIci;  // the slowest part
};

// `mechanisms`: chip_ingress_bound, dcn_shards_first and dcn_step_latency apply unless switched
// off.
CollectiveTime collective_time(OpKind kind, double bytes, const std::vector<std::string>& mesh_axes,
                               const DeviceMesh& mesh, const Slice& slice,
                               const MechanismSet& mechanisms = MechanismSet());

}  // namespace tpusim
