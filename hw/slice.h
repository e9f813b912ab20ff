// hw/slice.h: slice names as MaxText and Cloud TPU use them -> the physical slice.
//
// v4, v5p and tpu7x names count TensorCores, v5e and v6e names count chips
// (docs/reference/maxtext.md §0); an explicit shape "<chip>:<AxBxC>" is accepted too:
//   parse_slice("v5p-128")    -> v5p, 4x4x4 = 64 chips = 64 devices (megacore), wraps on all axes
//   parse_slice("tpu7x-128")  -> v7x, 4x4x4 = 64 chips = 128 devices (2 chiplets per chip)
//   parse_slice("v6e-256")    -> v6e, 16x16 = 256 chips, both axes wrap
//   parse_slice("v5p:4x4x8")  -> v5p, 4x4x8 = 128 chips
//   parse_slice("tpu7x-4x4x8"), parse_slice("v6e-4x4") -> a shape after the dash, as xpk writes it
//   parse_slice("ironwood-256") -> tpu7x-256 (the v7x catalog lists the name as a prefix)
//   parse_slice("a3", 8)      -> 8 nodes of 8 x H100 SXM, NVSwitch inside a node, InfiniBand
//                                between nodes (a GPU node is named alone, MaxText's "a3")
// Several slices (multislice over DCN) come from compile_topology_num_slices; for GPUs a slice is
// a node and the DCN is the node-to-node fabric.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hw/catalog.h"
#include "hw/chip_spec.h"

namespace tpusim {

struct Slice {
  const ChipSpec* chip = nullptr;
  std::string name;              // as given, e.g. "v5p-128"
  std::vector<int> shape;        // chips per torus axis, e.g. {4, 4, 4}
  std::vector<bool> wraparound;  // per axis
  int chips = 0;                 // per slice
  int devices_per_chip = 1;
  int chips_per_host = 0;  // min(chips, the chip's chips_per_host)
  int hosts = 0;           // per slice
  int num_slices = 1;
  // A GPU node: every device reaches every other through the switch at its full link bandwidth
  // (shape is {GPUs per node}, no torus, no wraparound).
  bool switched = false;

  int devices() const { return chips * devices_per_chip; }
  int total_chips() const { return chips * num_slices; }
  int total_devices() const { return devices() * num_slices; }
  int total_hosts() const { return hosts * num_slices; }
};

// Parses a slice name for `num_slices` slices. UserError naming the value when the name, the chip
// or the shape is unknown, or a number does not fit the generation's shapes.
Slice parse_slice(std::string_view name, int num_slices = 1,
                  const HardwareCatalog& catalog = HardwareCatalog::builtin());

// The shape a generation gives a slice of `chips` chips; UserError when none exists.
std::vector<int> shape_for_chip_count(const ChipSpec& chip, int chips, std::string_view name);

// Which axes of `shape` have wraparound links on `chip`.
std::vector<bool> wraparound_for_shape(const ChipSpec& chip, const std::vector<int>& shape);

// Example slice names for a chip (one per legal size up to its largest slice, for listings/tests).
std::vector<std::string> example_slice_names(const ChipSpec& chip, int max_names = 16);

}  // namespace tpusim
