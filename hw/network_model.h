// hw/network_model.h: how fast a ring collective can move bytes between the devices of a slice,
// and how many hops its latency pays: the one network model that `tpusim topology` prints
// (hw/topology.h) and the collective cost model charges (sim/perf/collective_cost.h).
//
// A ring runs along part of one torus axis, through a GPU node's switch, or over a v7x chip's
// chiplet pair (the D2D link):
//   - torus axis: a ring over a whole axis with wraparound links closes, so each device sends
//     both ways (2 links) and the farthest device is size/2 hops away; an open line uses one
//     direction (1 link) and size-1 hops, up to 2x slower (docs/reference/hardware.md §2). An
//     axis of 2 has one link between its chips: a wrap would duplicate it, so it never closes;
//   - switch: every GPU sends on all its links at once, one hop to any other GPU; a ring of N
//     takes N-1 steps;
//   - chiplet pair: one D2D hop at the D2D bandwidth.
// Link bandwidths come from the catalog (configs/hw/*.yml), either at peak (what the hardware
// has, printed by topology) or achievable per device (what collectives get: the catalog's
// achievable fraction, a chip's links shared by its devices).
//
// Example:
//   const Slice slice = parse_slice("v5p-128");        // 4x4x4, every axis wraps
//   const RingPath ring = torus_ring(slice, /*axis=*/0, /*size=*/4, /*whole_axis=*/true);
//   ring.links;          // 2 (both directions)
//   ring.latency_steps;  // 2 (= 4 / 2)
//   ring.bandwidth(ici_link_achievable_bytes_per_s(slice));  // what a ring collective gets
#pragma once

#include "hw/slice.h"

namespace tpusim {

struct RingPath {
  bool wraps = false;          // a closed ring (wraparound links at both ends)
  double links = 0;            // ICI links each device drives at once
  double d2d_bytes_per_s = 0;  // a chiplet pair's ring: the D2D link instead of ICI links
  double latency_steps = 0;    // hops a collective's latency pays (times the hop latency)
  int max_hops = 0;            // the farthest device of the ring, in hops
  // One device's egress on this ring, given one ICI link's bandwidth (bytes/s, one direction).
  double bandwidth(double link_bytes_per_s) const {
    return links * link_bytes_per_s + d2d_bytes_per_s;
  }
};

// A ring over `size` devices along torus axis `axis` (or the switch of a GPU node), covering the
// whole axis or only part of it (a part of an axis never closes).
RingPath torus_ring(const Slice& slice, int axis, int size, bool whole_axis);
// A ring over the two chiplets of one chip (v7x).
RingPath chiplet_ring(const Slice& slice);

// One ICI link, one direction, as the catalog gives it.
double ici_link_peak_bytes_per_s(const Slice& slice);
// What a collective gets of one ICI link: the achievable fraction, shared by a chip's devices.
double ici_link_achievable_bytes_per_s(const Slice& slice);
// What a collective gets of the DCN per device, one direction.
double dcn_achievable_bytes_per_s(const Slice& slice);
double ici_hop_latency_s(const Slice& slice);
double dcn_latency_s(const Slice& slice);

}  // namespace tpusim
