#include "hw/slice.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace tpusim {
namespace {

struct SliceCase {
  std::string name;
  std::string chip;
  std::vector<int> shape;
  int chips;
  int devices;
  std::vector<bool> wraps;
};

// Shapes from MaxText's accelerator_to_spec_map / xpk system_characteristics
// (docs/reference/maxtext.md §0, docs/reference/hardware.md §1b).
const std::vector<SliceCase> kCases = {
    {"v4-8", "v4", {2, 2, 1}, 4, 4, {false, false, false}},
    {"v4-128", "v4", {4, 4, 4}, 64, 64, {true, true, true}},
    {"v4-4096", "v4", {8, 16, 16}, 2048, 2048, {true, true, true}},
    {"v5p-8", "v5p", {2, 2, 1}, 4, 4, {false, false, false}},
    {"v5p-16", "v5p", {2, 2, 2}, 8, 8, {false, false, false}},
    {"v5p-32", "v5p", {2, 2, 4}, 16, 16, {false, false, false}},
    {"v5p-64", "v5p", {2, 4, 4}, 32, 32, {false, false, false}},
    {"v5p-128", "v5p", {4, 4, 4}, 64, 64, {true, true, true}},
    {"v5p-256", "v5p", {4, 4, 8}, 128, 128, {true, true, true}},
    {"v5p-768", "v5p", {4, 8, 12}, 384, 384, {true, true, true}},
    {"v5p-1024", "v5p", {8, 8, 8}, 512, 512, {true, true, true}},
    {"v5p-2048", "v5p", {8, 8, 16}, 1024, 1024, {true, true, true}},
    {"v5p-12288", "v5p", {16, 16, 24}, 6144, 6144, {true, true, true}},
    {"v5p-17920", "v5p", {16, 20, 28}, 8960, 8960, {true, true, true}},
    {"v5e-1", "v5e", {1, 1}, 1, 1, {false, false}},
    {"v5e-8", "v5e", {2, 4}, 8, 8, {false, false}},
    {"v5litepod-16", "v5e", {4, 4}, 16, 16, {false, false}},
    {"v5e-128", "v5e", {8, 16}, 128, 128, {false, true}},
    {"v5e-256", "v5e", {16, 16}, 256, 256, {true, true}},
    {"v6e-8", "v6e", {2, 4}, 8, 8, {false, false}},
    {"v6e-256", "v6e", {16, 16}, 256, 256, {true, true}},
    {"tpu7x-8", "v7x", {2, 2, 1}, 4, 8, {false, false, false}},
    {"tpu7x-128", "v7x", {4, 4, 4}, 64, 128, {true, true, true}},
    {"tpu7x-512", "v7x", {4, 8, 8}, 256, 512, {true, true, true}},
    {"tpu7x-18432", "v7x", {16, 24, 24}, 9216, 18432, {true, true, true}},
    {"v5p:4x4x8", "v5p", {4, 4, 8}, 128, 128, {true, true, true}},
    {"v6e:8x16", "v6e", {8, 16}, 128, 128, {false, true}},
    {"tpu7x:2x2x2", "v7x", {2, 2, 2}, 8, 16, {false, false, false}},
    // As xpk and the published recipes write them: a shape after the dash, the one-chip tpu7x-2
    // and the product name.
    {"tpu7x-4x4x8", "v7x", {4, 4, 8}, 128, 256, {true, true, true}},
    {"tpu7x-4x8x8", "v7x", {4, 8, 8}, 256, 512, {true, true, true}},
    {"v5p-4x4x8", "v5p", {4, 4, 8}, 128, 128, {true, true, true}},
    {"v6e-4x4", "v6e", {4, 4}, 16, 16, {false, false}},
    {"tpu7x-2", "v7x", {1, 1, 1}, 1, 2, {false, false, false}},
    {"ironwood-256", "v7x", {4, 4, 8}, 128, 256, {true, true, true}},
};

TEST(ParseSlice, NamesAcrossGenerations) {
  for (const SliceCase& expected : kCases) {
    SCOPED_TRACE(expected.name);
    const Slice slice = parse_slice(expected.name);
    EXPECT_EQ(slice.chip->name, expected.chip);
    EXPECT_EQ(slice.shape, expected.shape);
    EXPECT_EQ(slice.chips, expected.chips);
    EXPECT_EQ(slice.devices(), expected.devices);
    EXPECT_EQ(slice.wraparound, expected.wraps);
  }
}

TEST(ParseSlice, HostsFollowChipsPerHost) {
  EXPECT_EQ(parse_slice("v5p-128").hosts, 16);  // 4 chips per host
  EXPECT_EQ(parse_slice("v5e-256").hosts, 32);  // 8 chips per host
  EXPECT_EQ(parse_slice("v5e-4").hosts, 1);
  EXPECT_EQ(parse_slice("v5e-4").chips_per_host, 4);
  EXPECT_EQ(parse_slice("tpu7x-512").hosts, 64);  // 4 chips per VM
}

TEST(ParseSlice, Multislice) {
  const Slice slice = parse_slice("v5e-256", 8);
  EXPECT_EQ(slice.num_slices, 8);
  EXPECT_EQ(slice.total_chips(), 2048);
  EXPECT_EQ(slice.total_devices(), 2048);
  EXPECT_THROW(parse_slice("v5e-256", 0), UserError);
}

TEST(ParseSlice, InvalidNamesAreUserErrors) {
  for (const char* name :
       {"",         "v5p",      "v5p-",           "-128",      "v5q-128", "v5p-100",
        "v5p-7",    "v5p-0",    "v5p--8",         "v5p-abc",   "v6e-512", "v6e-12",
        "tpu7x-7",  "v5e-3",    "v5p:4x4",        "v5p:3x3x3", "v6e:3x5", "v5p:4x0x4",
        "v5p:4xx4", "v4-16384", "v5p-99999999999"}) {
    SCOPED_TRACE(name);
    EXPECT_THROW(parse_slice(name), UserError);
  }
}

// Red-team item 12: a shape's chip product was an int product: 1024x2048x2048 (2^32 chips)
// wrapped to 0 and divided by zero (SIGFPE); 100000x100000x100000 wrapped to a negative count.
TEST(RedTeam, Item12_SliceChipProductOverflowIsAUserError) {
  for (const char* name : {"v5p:1024x2048x2048", "v5p:100000x100000x100000", "v4:4x4x1073741824",
                           "tpu7x-65536x65536x4"}) {
    SCOPED_TRACE(name);
    try {
      parse_slice(name);
      ADD_FAILURE() << "no error";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find("more than the largest"), std::string::npos)
          << error.what();
    }
  }
}

TEST(ParseSlice, ErrorNamesValueAndSuggestsGeneration) {
  try {
    parse_slice("v5q-128");
    FAIL();
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("v5q"), std::string::npos);
    EXPECT_NE(message.find("did you mean"), std::string::npos);
  }
}

TEST(Slice, GpuNodeIsNamedAloneAndCountsNodesAsSlices) {
  const Slice node = parse_slice("a3", 16);
  EXPECT_EQ(node.chip->name, "h100-sxm");
  EXPECT_TRUE(node.chip->is_gpu());
  EXPECT_TRUE(node.switched);
  EXPECT_EQ(node.shape, std::vector<int>{8});
  EXPECT_EQ(node.wraparound, std::vector<bool>{false});
  EXPECT_EQ(node.total_devices(), 128);
  EXPECT_EQ(node.total_hosts(), 16);
  EXPECT_FALSE(parse_slice("v5p-8").switched);
  // A count after the node name is not how MaxText names GPU nodes.
  try {
    (void)parse_slice("a3-16");
    FAIL() << "a3-16 accepted";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("compile_topology_num_slices"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace tpusim
