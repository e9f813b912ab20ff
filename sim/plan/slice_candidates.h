// sim/plan/slice_candidates.h: the slices `tpusim plan` considers for each hardware kind.
//
// Per kind (a slice-name prefix of the catalog: v5p, v6e, tpu7x, a3, ...):
//   - every legal single-slice size of the catalog's slice rules (hw/slice.h
//     example_slice_names: the listed small shapes, then whole cubes doubling up to the largest
//     slice) up to --max-chips;
//   - multislice: 2, 4, 8, ... up to --max-slices copies of the kind's largest slice over DCN
//     (a job larger than one slice spans whole slices; smaller slices over DCN are left out,
//     as DCN is slower than the ICI a single slice of the same chips would use);
//   - a GPU node ("a3") is one slice of its GPUs: 1, 2, 4, ... up to --max-slices nodes.
//
// Example:
//   parse_hardware_kinds("v6e,tpu7x");  // the two kinds, or UserError naming an unknown one
//   enumerate_slice_candidates(kinds, /*max_chips=*/1024, /*max_slices=*/4);
//   // v6e-1 ... v6e-256, v6e-256 x 2, v6e-256 x 4, tpu7x-8 ... tpu7x-2048
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hw/catalog.h"
#include "hw/chip_spec.h"

namespace tpusim {

// A hardware kind as the user named it, with its catalog entry.
struct HardwareKind {
  std::string name;  // "tpu7x"
  const ChipSpec* chip = nullptr;
};

struct SliceCandidate {
  HardwareKind kind;
  std::string slice_name;  // compile_topology, e.g. "v6e-256" or "a3"
  int num_slices = 1;      // compile_topology_num_slices
  int64_t chips = 0;       // over all slices
  int64_t devices = 0;
  // "v6e-256", "v6e-256 x 2", "a3 x 4"
  std::string label() const;
};

// Comma-separated kinds; UserError naming an unknown or repeated one (with a suggestion).
std::vector<HardwareKind> parse_hardware_kinds(
    const std::string& list, const HardwareCatalog& catalog = HardwareCatalog::builtin());

// The candidates of each kind, in the order of `kinds`, by increasing chips within a kind.
std::vector<SliceCandidate> enumerate_slice_candidates(const std::vector<HardwareKind>& kinds,
                                                       int64_t max_chips, int max_slices);

}  // namespace tpusim
