// Mesh devices on the hardware: physical_devices_of_mesh is a permutation that puts the neighbours
// of a mesh axis on neighbouring chips (one ICI or D2D hop) and its DCN part on other slices.
#include "sharding/device_mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "hw/topology.h"
#include "model/config.h"

namespace tpusim {
namespace {

struct Case {
  std::string slice;
  int num_slices = 1;
  std::vector<std::string> overrides;
};

// Device index of a mesh coordinate array (row-major, axis 0 major).
int mesh_device(const MeshShape& shape, const std::array<int, kNumMeshAxes>& coordinate) {
  int device = 0;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    device = device * shape.size(axis) + coordinate[static_cast<size_t>(axis)];
  }
  return device;
}

std::array<int, kNumMeshAxes> mesh_coordinate(const MeshShape& shape, int device) {
  std::array<int, kNumMeshAxes> coordinate{};
  for (int axis = kNumMeshAxes - 1; axis >= 0; --axis) {
    coordinate[static_cast<size_t>(axis)] = device % shape.size(axis);
    device /= shape.size(axis);
  }
  return coordinate;
}

TEST(DeviceMesh, PhysicalDevicesArePlacedLikeTheAxes) {
  const std::vector<Case> cases = {
      {"v5e-8",
       1,
       {"ici_data_parallelism=2", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"}},
      {"v5p-128", 1, {"ici_fsdp_parallelism=16", "ici_tensor_parallelism=4"}},
      {"v5p-128", 1, {"ici_fsdp_parallelism=8", "ici_tensor_parallelism=8"}},   // split axes
      {"tpu7x-16", 1, {"ici_fsdp_parallelism=8", "ici_tensor_parallelism=2"}},  // chiplets
      {"v5e-16", 2, {"ici_fsdp_parallelism=16", "dcn_data_parallelism=2"}},
  };
  for (const Case& test_case : cases) {
    std::vector<std::string> overrides = test_case.overrides;
    overrides.push_back("compile_topology=" + test_case.slice);
    overrides.push_back("compile_topology_num_slices=" + std::to_string(test_case.num_slices));
    SCOPED_TRACE(test_case.slice + " " + overrides.front());
    const Slice slice = parse_slice(test_case.slice, test_case.num_slices);
    const DeviceMesh mesh = place_mesh(resolve_mesh(Config::load("", overrides), slice), slice);
    const std::vector<int> physical = physical_devices_of_mesh(mesh, slice);
    ASSERT_EQ(static_cast<int>(physical.size()), slice.total_devices());
    std::vector<int> sorted = physical;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> identity(sorted.size());
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(sorted, identity);  // a permutation

    const Topology topology(slice);
    const int per_slice = slice.devices();
    for (int axis = 0; axis < kNumMeshAxes; ++axis) {
      const MeshAxisPlacement& placement = mesh.axes[static_cast<size_t>(axis)];
      const int ici = placement.ici_size;
      for (int device = 0; device < static_cast<int>(physical.size()); ++device) {
        std::array<int, kNumMeshAxes> coordinate = mesh_coordinate(mesh.shape, device);
        const int value = coordinate[static_cast<size_t>(axis)];
        // The next position on the axis's innermost portion, when that is a whole physical axis:
        // one hop away (a split axis may stride over positions another mesh axis owns).
        if (ici > 1 && !placement.portions.empty() && placement.portions.front().whole_axis &&
            (value % ici) % placement.portions.front().size + 1 < placement.portions.front().size) {
          ++coordinate[static_cast<size_t>(axis)];
          const int neighbour = physical[static_cast<size_t>(mesh_device(mesh.shape, coordinate))];
          EXPECT_EQ(topology.hop_distance(physical[static_cast<size_t>(device)], neighbour), 1)
              << mesh_axis_names()[static_cast<size_t>(axis)] << " device " << device;
          --coordinate[static_cast<size_t>(axis)];
        }
        // The DCN part of the axis selects another slice.
        if (placement.dcn_size > 1 && value + ici < ici * placement.dcn_size) {
          coordinate[static_cast<size_t>(axis)] += ici;
          const int other = physical[static_cast<size_t>(mesh_device(mesh.shape, coordinate))];
          EXPECT_NE(other / per_slice, physical[static_cast<size_t>(device)] / per_slice);
        }
      }
    }
  }
}

TEST(DeviceMesh, TensorInnermostMeshIsTheIdentityOnV5e8) {
  const Slice slice = parse_slice("v5e-8");
  const DeviceMesh mesh = place_mesh(
      resolve_mesh(Config::load("", {"compile_topology=v5e-8", "ici_data_parallelism=2",
                                     "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"}),
                   slice),
      slice);
  const std::vector<int> physical = physical_devices_of_mesh(mesh, slice);
  std::vector<int> identity(8);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(physical, identity);
}

TEST(DeviceMesh, PlacedFirstAxisTakesTheChipletPair) {
  // tpu7x-16 = 8 chips (2x2x2) x 2 chiplets; data=2 tensor=2 fsdp=4. By default the innermost
  // axis (tensor) takes the chiplet pair; mesh_placement_first=data gives it to data instead.
  const Config config = Config::load("", {"compile_topology=tpu7x-16", "ici_data_parallelism=2",
                                          "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"});
  const Slice slice = parse_slice("tpu7x-16");
  const MeshShape shape = resolve_mesh(config, slice);
  const DeviceMesh by_default = place_mesh(shape, slice);
  EXPECT_TRUE(by_default.axis("tensor").uses_chiplets());
  EXPECT_FALSE(by_default.axis("data").uses_chiplets());
  const DeviceMesh data_first = place_mesh(shape, slice, {mesh_axis_index("data")});
  EXPECT_TRUE(data_first.axis("data").uses_chiplets());
  EXPECT_FALSE(data_first.axis("tensor").uses_chiplets());
  EXPECT_EQ(data_first.placement_order.front(), mesh_axis_index("data"));
  EXPECT_EQ(data_first.placement_order.size(), static_cast<size_t>(kNumMeshAxes));
  // Device numbering follows the placement: still a permutation, and the two devices that differ
  // only in their data coordinate are the two chiplets of one chip.
  const std::vector<int> physical = physical_devices_of_mesh(data_first, slice);
  std::vector<int> sorted = physical;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(16);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  const int data_stride = 4 * 2;  // mesh device index, row-major: data, fsdp, tensor
  for (int device = 0; device < data_stride; ++device) {
    const int first = physical[static_cast<size_t>(device)];
    const int second = physical[static_cast<size_t>(device + data_stride)];
    EXPECT_EQ(first / 2, second / 2) << "device " << device;  // same chip
  }
}

TEST(DeviceMesh, PlacementKeyNamesBadAxes) {
  EXPECT_EQ(placement_from_config(Config::load("", {"mesh_placement_first=fsdp,tensor"})),
            (std::vector<int>{mesh_axis_index("fsdp"), mesh_axis_index("tensor")}));
  EXPECT_TRUE(placement_from_config(Config::load("", {})).empty());
  for (const std::string bad : {"fsdb", "fsdp,fsdp", "fsdp,,tensor", "fsdp,"}) {
    try {
      placement_from_config(Config::load("", {"mesh_placement_first=" + bad}));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find("mesh_placement_first"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace tpusim
