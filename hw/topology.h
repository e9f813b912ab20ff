// hw/topology.h: the physical topology of one or more slices as a Boost graph.
//
// Vertices are devices (one per chip; on v7x one per chiplet), hosts, and one DCN fabric vertex
// when there are several slices. Edges are ICI links between neighbouring chips on the torus
// (wraparound only where the generation's rule allows it), D2D links between the two chiplets of a
// v7x chip, PCIe links from each chip to its host, and DCN links from each host to the fabric.
//
// A GPU node (slice.switched) has no torus: every pair of its GPUs is one edge, one hop through
// the switch, at the GPU's whole NVLink bandwidth (a non-blocking NVSwitch); nodes join over the
// DCN fabric vertex (InfiniBand), one NIC per GPU.
//
// v7x assumption (docs/reference/hardware.md §5.5: the split of ICI ports between the two
// chiplets is not public): the chip is one torus node; each ICI link is drawn as two edges, one
// between the chiplet-0 vertices and one between the chiplet-1 vertices of neighbouring chips,
// each carrying half of the link's bandwidth, so per-chip bandwidth and bisection are unchanged.
//
// What a ring collective gets along an axis (axis_bandwidth) is hw/network_model.h's, the model
// the collective costs use too.
//
// Example:
//   Topology topology(parse_slice("v5e-256"));
//   topology.bisection_bandwidth_bytes_per_s();   // 32 links x 50 GB/s = 1.6 TB/s
//   topology.axis_bandwidth(0).wraps;             // true (axis of 16)
//   topology.hop_distance(0, 17);                 // 2
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "hw/slice.h"

namespace tpusim {

enum class VertexKind { kDevice, kHost, kDcnFabric };
enum class LinkKind { kIci, kD2d, kPcie, kDcn };

struct TopologyVertex {
  VertexKind kind = VertexKind::kDevice;
  int slice_index = 0;
  std::vector<int> coords;  // chip coordinates on the torus (devices)
  int chiplet = 0;          // 0 or 1 on v7x
  int host = -1;            // host index within the slice (devices and hosts)
};

struct TopologyEdge {
  LinkKind kind = LinkKind::kIci;
  double bandwidth_uni_bytes_per_s = 0;  // one direction
  double latency_s = 0;
  int axis = -1;            // torus axis for ICI links
  bool wraparound = false;  // ICI link that closes a ring
};

using TopologyGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS,
                                            TopologyVertex, TopologyEdge>;

// What a ring collective along one torus axis gets.
struct AxisBandwidth {
  int axis = 0;
  int size = 1;
  bool wraps = false;
  double link_bandwidth_uni_bytes_per_s = 0;
  // Per-device egress a ring collective along this axis can use: both directions (2 x link) when
  // the axis wraps; one direction when it does not (the far edge needs size-1 hops, so an open
  // line is up to 2x slower, docs/reference/hardware.md §2).
  double ring_bandwidth_bytes_per_s = 0;
  int max_hops = 0;  // farthest neighbour along the axis: size/2 with wrap, size-1 without
};

class Topology {
 public:
  explicit Topology(const Slice& slice);

  const Slice& slice() const { return slice_; }
  const TopologyGraph& graph() const { return graph_; }

  int num_devices() const { return slice_.total_devices(); }
  // Vertex of device `index` (devices come first, in MaxText's device order: slice, then chip in
  // row-major order of the shape with the first axis fastest, then chiplet).
  int device_vertex(int device_index) const { return device_index; }

  // ICI/D2D hops between two devices of the same slice (breadth-first search on the graph).
  int hop_distance(int device_a, int device_b) const;

  AxisBandwidth axis_bandwidth(int axis) const;

  // One-direction bandwidth across the cut that halves the slice through its longest axis,
  // counted edge by edge on the graph (a wrapped axis is cut twice).
  double bisection_bandwidth_bytes_per_s() const;

  // ICI links of one chip (distinct neighbouring chips), the largest over the slice.
  int ici_links_per_chip() const;

  // Aggregate DCN bandwidth of one slice (all its hosts' NICs), one direction.
  double dcn_bandwidth_per_slice_bytes_per_s() const;

  // Graphviz text of the graph.
  std::string to_dot() const;

 private:
  int chip_index(const std::vector<int>& coords) const;

  Slice slice_;
  TopologyGraph graph_;
};

}  // namespace tpusim
