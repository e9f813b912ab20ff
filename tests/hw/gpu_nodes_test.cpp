// The GPU node types (configs/hw/h100-sxm.yml, h100-a3high.yml, h100-a3mega.yml, h200-sxm.yml,
// b200-sxm.yml): MaxText's and xpk's names, the published figures (docs/reference/gpu.md) and the
// fabric between nodes.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "hw/catalog.h"
#include "hw/slice.h"
#include "hw/topology.h"

namespace tpusim {
namespace {

// compile_topology names (MaxText) and xpk device types [XPK-g] pick the node's entry.
TEST(GpuNodes, MaxTextAndXpkNamesPickTheNode) {
  const struct {
    const char* name;
    const char* chip;
  } cases[] = {
      {"a3", "h100-sxm"},
      {"a3high", "h100-a3high"},
      {"h100-80gb-8", "h100-a3high"},
      {"a3mega", "h100-a3mega"},
      {"h100-mega-80gb-8", "h100-a3mega"},
      {"a3ultra", "h200-sxm"},
      {"h200-141gb-8", "h200-sxm"},
      {"a4", "b200-sxm"},
      {"b200-8", "b200-sxm"},
  };
  for (const auto& test : cases) {
    const Slice slice = parse_slice(test.name, 4);
    EXPECT_EQ(slice.chip->name, test.chip) << test.name;
    EXPECT_TRUE(slice.switched) << test.name;
    EXPECT_EQ(slice.total_chips(), 32) << test.name;
  }
}

TEST(GpuNodes, ANodeIsNamedAlone) {
  try {
    (void)parse_slice("a4-16", 1);
    FAIL() << "a4-16 accepted";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("compile_topology_num_slices"), std::string::npos)
        << error.what();
  }
}

// Published figures: H200 141 GB HBM3e at 4.8 TB/s with the H100's compute [NV-H200]; B200
// 2.25 PFLOP/s bf16, 4.5 fp8, 180 GB at 8 TB/s [NV-B200].
TEST(GpuNodes, PublishedComputeAndMemory) {
  const HardwareCatalog& catalog = HardwareCatalog::builtin();
  const ChipSpec& h100 = catalog.chip("h100-sxm");
  const ChipSpec& h200 = catalog.chip("h200-sxm");
  const ChipSpec& b200 = catalog.chip("b200-sxm");
  EXPECT_DOUBLE_EQ(h200.peak_bf16_tflops, h100.peak_bf16_tflops);
  EXPECT_DOUBLE_EQ(h200.peak_fp8_tflops, 1979);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth_gbps, 4800);
  EXPECT_NEAR(h200.hbm_capacity_gib, 141e9 / (1 << 30), 0.05);
  EXPECT_DOUBLE_EQ(b200.peak_bf16_tflops, 2250);
  EXPECT_DOUBLE_EQ(b200.peak_fp8_tflops, 4500);
  EXPECT_DOUBLE_EQ(b200.hbm_bandwidth_gbps, 8000);
  EXPECT_NEAR(b200.hbm_capacity_gib, 180e9 / (1 << 30), 0.05);
  // The H100 variants differ from h100-sxm only in their fabric (and host).
  for (const char* variant : {"h100-a3high", "h100-a3mega"}) {
    const ChipSpec& chip = catalog.chip(variant);
    EXPECT_DOUBLE_EQ(chip.peak_bf16_tflops, h100.peak_bf16_tflops) << variant;
    EXPECT_DOUBLE_EQ(chip.hbm_bandwidth_gbps, h100.hbm_bandwidth_gbps) << variant;
    EXPECT_DOUBLE_EQ(chip.ici_link_bandwidth_uni_gbps, h100.ici_link_bandwidth_uni_gbps) << variant;
  }
}

// NVLink per direction: 18 links of 25 GB/s (H100, H200: 900 GB/s both ways) or 50 GB/s (B200,
// NVLink 5: 1.8 TB/s both ways). Between nodes, per node and direction: 8 x 400 Gb/s RoCE NICs on
// A3 Ultra and A4 (400 GB/s), 8 x 200 Gb/s on A3 Mega (200 GB/s), 4 x 200 Gb/s on A3 High
// (100 GB/s) [GCN].
TEST(GpuNodes, NvlinkAndFabricPerDirection) {
  const struct {
    const char* node;
    double ring_gbps;
    double node_dcn_gbps;
  } cases[] = {
      {"a3", 450, 400},      {"a3high", 450, 100}, {"a3mega", 450, 200},
      {"a3ultra", 450, 400}, {"a4", 900, 400},
  };
  for (const auto& test : cases) {
    const Topology topology(parse_slice(test.node, 32));
    EXPECT_DOUBLE_EQ(topology.axis_bandwidth(0).ring_bandwidth_bytes_per_s, test.ring_gbps * 1e9)
        << test.node;
    EXPECT_DOUBLE_EQ(topology.dcn_bandwidth_per_slice_bytes_per_s(), test.node_dcn_gbps * 1e9)
        << test.node;
    EXPECT_EQ(topology.ici_links_per_chip(), 18) << test.node;
  }
}

// Every GPU entry names its fabric, carries its attention kernel table with a sourced or assumed
// scale, and every spec number has its provenance.
TEST(GpuNodes, EveryGpuEntryIsFullyProvenanced) {
  int gpus = 0;
  for (const ChipSpec& chip : HardwareCatalog::builtin().chips()) {
    if (!chip.is_gpu()) {
      EXPECT_TRUE(chip.attention_kernel.empty()) << chip.name;
      EXPECT_TRUE(chip.slice.fabric.empty()) << chip.name;
      continue;
    }
    ++gpus;
    EXPECT_FALSE(chip.slice.fabric.empty()) << chip.name;
    EXPECT_FALSE(chip.attention_kernel.empty()) << chip.name;
    EXPECT_FALSE(chip.attention_kernel.source.empty()) << chip.name;
    EXPECT_FALSE(chip.attention_kernel.rate_scale_note.empty()) << chip.name;
    for (const std::string& key : chip_spec_keys()) {
      ASSERT_TRUE(chip.provenance.contains(key)) << chip.name << " " << key;
      EXPECT_FALSE(chip.provenance.at(key).text.empty()) << chip.name << " " << key;
    }
  }
  EXPECT_EQ(gpus, 5);
}

}  // namespace
}  // namespace tpusim
