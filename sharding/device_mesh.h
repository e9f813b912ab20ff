// sharding/device_mesh.h: where each mesh axis lies on the hardware.
//
// The ICI part of the mesh is laid onto the physical axes of one slice: the torus dimensions, and
// on v7x the pair of chiplets inside a chip (a physical axis of size 2 joined by D2D). Like JAX's
// create_device_mesh for TPU tori, mesh axes are placed from the innermost (last in MaxText's
// mesh order: autoregressive, expert, tensor_sequence, tensor, ...) outwards, each onto one
// physical axis of exactly its size if there is one (the chiplet pair first for a size-2 axis),
// else onto a set of whole physical axes whose sizes multiply to it, else onto part of an axis
// (a "split" placement, which loses the wraparound). The DCN part of an axis spans slices.
//
// Example (v5p-128 = 4x4x4, fsdp=16 tensor=4):
//   tensor -> torus axis 0 (size 4, wraps); fsdp -> torus axes 1, 2 (4 x 4, wraps)
// Example (tpu7x-128, fsdp=32 tensor=2): tensor -> the chiplet pair (D2D); fsdp -> 4x4x4 torus
#pragma once

#include <string>
#include <vector>

#include "hw/slice.h"
#include "sharding/mesh.h"

namespace tpusim {

class Config;

// Physical axis index kChipletAxis means the two chiplets of a v7x chip.
inline constexpr int kChipletAxis = -1;

struct PhysicalPortion {
  int physical_axis = 0;   // torus dimension, or kChipletAxis
  int size = 1;            // how many positions of that axis the mesh axis spans
  bool whole_axis = true;  // spans the entire physical axis (can use its wraparound)
};

struct MeshAxisPlacement {
  int mesh_axis = 0;
  int ici_size = 1;
  int dcn_size = 1;
  std::vector<PhysicalPortion> portions;  // ICI placement, minor to major
  bool split = false;                     // needed part of a physical axis
  bool uses_chiplets() const;
  // True when every torus portion spans a whole wrapped axis (a bidirectional ring is possible).
  bool wraps(const Slice& slice) const;
  std::string describe(const Slice& slice) const;  // "torus x (4, wraps) + chiplets (D2D)"
};

struct DeviceMesh {
  MeshShape shape;
  std::vector<MeshAxisPlacement> axes;  // one per mesh axis, in mesh order
  std::vector<int> placement_order;     // mesh axes in the order they were placed (all 12)

  const MeshAxisPlacement& axis(const std::string& name) const;
};

// `placed_first`: mesh axes (by index) placed before the others, in that order; the others follow
// innermost first. Empty: create_device_mesh's order.
DeviceMesh place_mesh(const MeshShape& shape, const Slice& slice,
                      const std::vector<int>& placed_first = {});

// True when both meshes have the same shape and lay every mesh axis onto the same physical
// portions (so every collective costs the same on both).
bool same_layout(const DeviceMesh& a, const DeviceMesh& b);

// The axes of the config's mesh_placement_first ("fsdp,tensor" -> {fsdp, tensor}); UserError
// naming the key for an unknown or repeated axis.
std::vector<int> placement_from_config(const Config& config);

// Where each device of the mesh sits on the hardware: for every mesh device index (row-major over
// the mesh coordinates, axis 0 major: the functional engine's device numbering), the physical
// device index in the Topology's order (slice, then chip row-major with the first torus axis
// fastest, then chiplet), which is also host order (a host owns consecutive chips). An axis's ICI
// coordinate runs over its portions minor first; a physical axis shared by several mesh axes gives
// the inner mesh axis (placed first) the fastest positions; the DCN part of an axis is its major
// part and picks the slice.
// Example (v5e-8 = 2x4, data=2 fsdp=2 tensor=2): tensor -> x, fsdp and data -> y (fsdp inner), so
// mesh device (data, fsdp, tensor) is physical chip tensor + 2 * (fsdp + 2 * data), the identity.
std::vector<int> physical_devices_of_mesh(const DeviceMesh& mesh, const Slice& slice);

}  // namespace tpusim
