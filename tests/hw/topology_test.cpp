#include "hw/topology.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace tpusim {
namespace {

int count_edges(const Topology& topology, LinkKind kind) {
  int count = 0;
  for (const auto& edge : boost::make_iterator_range(boost::edges(topology.graph()))) {
    count += topology.graph()[edge].kind == kind ? 1 : 0;
  }
  return count;
}

// Pod bisection figures from docs/reference/hardware.md §1b, counted one direction over the
// links crossing the cut, with the catalog's nominal per-link bandwidth.
TEST(Topology, BisectionMatchesPublishedPodFigures) {
  const Topology v5e(parse_slice("v5e-256"));
  EXPECT_NEAR(v5e.bisection_bandwidth_bytes_per_s() / 1e12, 1.6, 1.6 * 0.05);
  const Topology v6e(parse_slice("v6e-256"));
  EXPECT_NEAR(v6e.bisection_bandwidth_bytes_per_s() / 1e12, 3.2, 3.2 * 0.05);
  const Topology v4(parse_slice("v4:16x16x16"));
  EXPECT_NEAR(v4.bisection_bandwidth_bytes_per_s() / 1e12, 24.0, 24.0 * 0.05);
  for (const char* name : {"v5e-256", "v6e-256"}) {
    const Topology topology(parse_slice(name));
    EXPECT_NEAR(topology.bisection_bandwidth_bytes_per_s() / 1e12,
                topology.slice().chip->pod_bisection_tbps,
                topology.slice().chip->pod_bisection_tbps * 0.05)
        << name;
  }
}

TEST(Topology, WraparoundDoublesLinksAcrossTheCut) {
  // 4x4x8 wraps: the cut through the 8-axis crosses 16 links twice.
  const Topology wrapped(parse_slice("v5p-256"));
  // 2x4x4 does not wrap: the cut through a 4-axis crosses 8 links once.
  const Topology open(parse_slice("v5p-64"));
  const double link = 100e9;
  EXPECT_DOUBLE_EQ(wrapped.bisection_bandwidth_bytes_per_s(), 32 * link);
  EXPECT_DOUBLE_EQ(open.bisection_bandwidth_bytes_per_s(), 8 * link);
}

TEST(Topology, LinkCountsFollowWraparound) {
  // 4x4x4 torus: 3 axes x 64 chips links.
  EXPECT_EQ(count_edges(Topology(parse_slice("v5p-128")), LinkKind::kIci), 3 * 64);
  EXPECT_EQ(Topology(parse_slice("v5p-128")).ici_links_per_chip(), 6);
  // 2x2x1 mesh: 2 axes of 2 chips, 2 links each.
  EXPECT_EQ(count_edges(Topology(parse_slice("v5p-8")), LinkKind::kIci), 4);
  EXPECT_EQ(Topology(parse_slice("v5p-8")).ici_links_per_chip(), 2);
  // 16x16 v6e: both axes wrap: 2 x 256 links; 4 links per chip.
  EXPECT_EQ(count_edges(Topology(parse_slice("v6e-256")), LinkKind::kIci), 512);
  EXPECT_EQ(Topology(parse_slice("v6e-256")).ici_links_per_chip(), 4);
  // 4x4 v5e: no wrap: 2 x 4 x 3 links.
  EXPECT_EQ(count_edges(Topology(parse_slice("v5e-16")), LinkKind::kIci), 24);
}

TEST(Topology, D2dOnlyOnV7x) {
  EXPECT_EQ(count_edges(Topology(parse_slice("tpu7x-128")), LinkKind::kD2d), 64);
  for (const char* name : {"v4-128", "v5p-128", "v5e-256", "v6e-256"}) {
    EXPECT_EQ(count_edges(Topology(parse_slice(name)), LinkKind::kD2d), 0) << name;
  }
}

TEST(Topology, HopDistanceUsesWraparound) {
  const Topology wrapped(parse_slice("v5p-128"));  // 4x4x4 torus
  // Device 0 is (0,0,0); device 3 is (3,0,0): one hop over the wraparound link.
  EXPECT_EQ(wrapped.hop_distance(0, 3), 1);
  EXPECT_EQ(wrapped.hop_distance(0, 2), 2);
  EXPECT_EQ(wrapped.hop_distance(0, 63), 3);   // (3,3,3)
  const Topology open(parse_slice("v5e-16"));  // 4x4 mesh
  EXPECT_EQ(open.hop_distance(0, 3), 3);
  EXPECT_EQ(open.hop_distance(0, 15), 6);
  const Topology v7x(parse_slice("tpu7x-8"));  // 2x2x1 chips, 2 chiplets each
  EXPECT_EQ(v7x.hop_distance(0, 1), 1);        // the two chiplets of chip 0, over D2D
  EXPECT_EQ(v7x.hop_distance(0, 2), 1);        // chiplet 0 of chip 1
  EXPECT_EQ(v7x.hop_distance(0, 3), 2);        // chiplet 1 of chip 1
}

TEST(Topology, AxisRingBandwidthWithAndWithoutWrap) {
  const Topology wrapped(parse_slice("v5e-256"));
  const AxisBandwidth axis = wrapped.axis_bandwidth(0);
  EXPECT_TRUE(axis.wraps);
  EXPECT_DOUBLE_EQ(axis.ring_bandwidth_bytes_per_s, 2 * 50e9);
  EXPECT_EQ(axis.max_hops, 8);
  const Topology open(parse_slice("v5e-32"));  // 4x8
  const AxisBandwidth line = open.axis_bandwidth(1);
  EXPECT_FALSE(line.wraps);
  EXPECT_DOUBLE_EQ(line.ring_bandwidth_bytes_per_s, 50e9);
  EXPECT_EQ(line.max_hops, 7);
}

TEST(Topology, MultisliceConnectsHostsThroughDcn) {
  const Topology topology(parse_slice("v5e-16", 4));
  EXPECT_EQ(topology.num_devices(), 64);
  EXPECT_EQ(count_edges(topology, LinkKind::kDcn), 8);  // 2 hosts x 4 slices
  EXPECT_EQ(count_edges(topology, LinkKind::kPcie), 64);
  EXPECT_EQ(topology.hop_distance(0, 15), 6);
  EXPECT_DOUBLE_EQ(topology.dcn_bandwidth_per_slice_bytes_per_s(),
                   16 * topology.slice().chip->dcn_bandwidth_per_chip_gbps * 1e9);
}

TEST(Topology, DotOutputIsGraphviz) {
  const std::string dot = Topology(parse_slice("v5p-8")).to_dot();
  EXPECT_EQ(dot.rfind("graph", 0), 0u);
  EXPECT_NE(dot.find(" -- "), std::string::npos);
}

TEST(Topology, GpuNodeIsOneSwitchHopBetweenAnyPair) {
  // compile_topology=a3: 8 x H100 behind NVSwitch, 18 NVLink4 links of 25 GB/s each [SB-g].
  const Topology node(parse_slice("a3", 2));
  EXPECT_TRUE(node.slice().switched);
  EXPECT_EQ(node.num_devices(), 16);
  for (int other = 1; other < 8; ++other) {
    EXPECT_EQ(node.hop_distance(0, other), 1) << other;
  }
  EXPECT_EQ(node.ici_links_per_chip(), 18);
  const AxisBandwidth axis = node.axis_bandwidth(0);
  EXPECT_DOUBLE_EQ(axis.ring_bandwidth_bytes_per_s, 450e9);
  EXPECT_EQ(axis.max_hops, 1);
  // Half the GPUs send to the other half at 450 GB/s each.
  EXPECT_DOUBLE_EQ(node.bisection_bandwidth_bytes_per_s(), 4 * 450e9);
  // One 400 Gb/s NIC per GPU: 8 x 50 GB/s per node into the fabric.
  EXPECT_DOUBLE_EQ(node.dcn_bandwidth_per_slice_bytes_per_s(), 400e9);
  EXPECT_THROW((void)node.hop_distance(0, 8), UserError);  // other node: InfiniBand, not NVLink
}

}  // namespace
}  // namespace tpusim
