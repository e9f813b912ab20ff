#include "hw/slice.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <numeric>

#include "common/error.h"
#include "common/suggest.h"

namespace tpusim {
namespace {

// A full cube of v4/v5p/v7x is 4x4x4 chips (one rack); larger slices are built from cubes.
constexpr int kCubeEdge = 4;
constexpr int kCubeChips = kCubeEdge * kCubeEdge * kCubeEdge;

int product(const std::vector<int>& dims) {
  return std::accumulate(dims.begin(), dims.end(), 1, std::multiplies<>());
}

// The product of a shape the user wrote, in 64 bits and saturated: "1024x2048x2048" has 2^32
// chips, which an int product wraps to 0 (and 100000x100000x100000 to a negative count).
long long checked_product(const std::vector<int>& dims) {
  constexpr long long kSaturated = std::numeric_limits<long long>::max();
  long long result = 1;
  for (const int dim : dims) {
    if (dim <= 0) {
      return 0;
    }
    if (result > kSaturated / dim) {
      return kSaturated;
    }
    result *= dim;
  }
  return result;
}

bool is_full_cube_shape(const std::vector<int>& shape) {
  return shape.size() == 3 &&
         std::all_of(shape.begin(), shape.end(), [](int dim) { return dim % kCubeEdge == 0; });
}

// The most cubic factorization a <= b <= c of `count`: smallest largest factor, then largest
// smallest factor. This reproduces the shapes of MaxText's accelerator_to_spec_map, e.g.
// 6 -> 1x2x3 (v5p-768 = 4x8x12), 16 -> 2x2x4 (v5p-2048 = 8x8x16), 144 -> 4x6x6 (tpu7x-18432).
std::vector<int> most_cubic_factorization(int count) {
  std::vector<int> best;
  for (int a = 1; a * a * a <= count; ++a) {
    if (count % a != 0) {
      continue;
    }
    for (int b = a; a * b * b <= count; ++b) {
      if ((count / a) % b != 0) {
        continue;
      }
      const int c = count / a / b;
      const std::vector<int> candidate = {a, b, c};
      if (best.empty() || c < best[2] || (c == best[2] && a > best[0])) {
        best = candidate;
      }
    }
  }
  return best;
}

std::string legal_sizes_hint(const ChipSpec& chip) {
  const int unit = chip.slice.name_counts == SliceNameUnit::kTensorCores
                       ? static_cast<int>(chip.tensorcores_per_chip)
                       : 1;
  std::string hint;
  if (chip.slice.shape_rule == ShapeRule::kCube) {
    for (const std::vector<int>& shape : chip.slice.small_shapes) {
      hint += std::to_string(product(shape) * unit) + ", ";
    }
    hint += "or a multiple of " + std::to_string(kCubeChips * unit);
  } else {
    for (size_t index = 0; index < chip.slice.small_shapes.size(); ++index) {
      hint +=
          (index == 0 ? "" : ", ") + std::to_string(product(chip.slice.small_shapes[index]) * unit);
    }
  }
  return hint;
}

// The shapes an explicit shape may take: the listed small ones, and on a cube rule every dim a
// multiple of 4 ("v5p:16x16x35" was refused with "legal sizes: ... or a multiple of 128",
// though its 17920 cores are one).
std::string legal_shapes_hint(const ChipSpec& chip) {
  std::string hint;
  for (const std::vector<int>& shape : chip.slice.small_shapes) {
    std::string text;
    for (const int dim : shape) {
      text += (text.empty() ? "" : "x") + std::to_string(dim);
    }
    hint += (hint.empty() ? "" : ", ") + text;
  }
  if (chip.slice.shape_rule == ShapeRule::kCube) {
    hint += ", or every dim a multiple of " + std::to_string(kCubeEdge);
  }
  return hint;
}

}  // namespace

std::vector<int> shape_for_chip_count(const ChipSpec& chip, int chips, std::string_view name) {
  for (const std::vector<int>& shape : chip.slice.small_shapes) {
    if (product(shape) == chips) {
      return shape;
    }
  }
  if (chip.slice.shape_rule == ShapeRule::kCube && chips >= kCubeChips && chips % kCubeChips == 0) {
    std::vector<int> shape = most_cubic_factorization(chips / kCubeChips);
    for (int& dim : shape) {
      dim *= kCubeEdge;
    }
    return shape;
  }
  throw UserError("compile_topology: '" + std::string(name) + "' is not a " + chip.name +
                      " slice size (legal sizes: " + legal_sizes_hint(chip) + ")",
                  "compile_topology");
}

std::vector<bool> wraparound_for_shape(const ChipSpec& chip, const std::vector<int>& shape) {
  std::vector<bool> wraps(shape.size(), false);
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    switch (chip.slice.wraparound) {
      case WraparoundRule::kFullCube:
        wraps[axis] = is_full_cube_shape(shape);
        break;
      case WraparoundRule::kAxis16:
        wraps[axis] = shape[axis] == 16;
        break;
      case WraparoundRule::kAll:
        wraps[axis] = shape[axis] > 2;
        break;
      case WraparoundRule::kNone:
        break;
    }
  }
  return wraps;
}

Slice parse_slice(std::string_view name, int num_slices, const HardwareCatalog& catalog) {
  // The largest multislice jobs span hundreds of slices; 10,000 bounds the work and memory of
  // building the topology (a million slices took 26 s and 2.9 GB).
  constexpr int kMaxSlices = 10000;
  if (num_slices < 1 || num_slices > kMaxSlices) {
    throw UserError("compile_topology_num_slices: " + std::to_string(num_slices) +
                        " must be from 1 to " + std::to_string(kMaxSlices),
                    "compile_topology_num_slices");
  }
  // A GPU node is named alone ("a3"): one node of the listed GPUs, nodes over the fabric.
  if (const ChipSpec* node = catalog.chip_for_slice_prefix(name);
      node != nullptr && node->slice.shape_rule == ShapeRule::kSwitched) {
    Slice slice;
    slice.chip = node;
    slice.name = std::string(name);
    slice.num_slices = num_slices;
    slice.devices_per_chip = static_cast<int>(node->devices_per_chip);
    slice.shape = node->slice.small_shapes.front();
    slice.chips = product(slice.shape);
    slice.wraparound.assign(slice.shape.size(), false);
    slice.switched = true;
    slice.chips_per_host = std::min(slice.chips, static_cast<int>(node->chips_per_host));
    slice.hosts = (slice.chips + slice.chips_per_host - 1) / slice.chips_per_host;
    return slice;
  }
  const size_t colon = name.find(':');
  const size_t dash = name.rfind('-');
  const bool explicit_shape = colon != std::string_view::npos;
  const size_t split = explicit_shape ? colon : dash;
  if (name.empty() || split == std::string_view::npos || split == 0 || split + 1 >= name.size()) {
    throw UserError("compile_topology: '" + std::string(name) +
                        "' is not a slice name like v5p-128, v6e-256, tpu7x-512, v5p:4x4x8 or a3",
                    "compile_topology");
  }
  const std::string_view prefix = name.substr(0, split);
  const ChipSpec* chip = catalog.chip_for_slice_prefix(prefix);
  if (chip != nullptr && chip->slice.shape_rule == ShapeRule::kSwitched) {
    throw UserError("compile_topology: '" + std::string(name) + "': a GPU node is named alone ('" +
                        std::string(prefix) +
                        "'); give the number of nodes as compile_topology_num_slices",
                    "compile_topology");
  }
  if (chip == nullptr) {
    throw UserError("compile_topology: unknown TPU generation '" + std::string(prefix) + "' in '" +
                        std::string(name) + "'" + did_you_mean(prefix, catalog.slice_prefixes()),
                    "compile_topology");
  }

  Slice slice;
  slice.chip = chip;
  slice.name = std::string(name);
  slice.num_slices = num_slices;
  slice.devices_per_chip = static_cast<int>(chip->devices_per_chip);
  const std::string_view rest = name.substr(split + 1);
  // xpk and GKE write a shape after the dash too: tpu7x-4x4x8, v5p-4x4x8, v6e-4x4.
  if (explicit_shape || rest.find('x') != std::string_view::npos) {
    slice.shape = parse_shape_text(rest, "compile_topology");
    const size_t rank = chip->slice.shape_rule == ShapeRule::kCube ? 3 : 2;
    const bool listed = std::find(chip->slice.small_shapes.begin(), chip->slice.small_shapes.end(),
                                  slice.shape) != chip->slice.small_shapes.end();
    const bool cube_ok =
        chip->slice.shape_rule == ShapeRule::kCube && is_full_cube_shape(slice.shape);
    if (slice.shape.size() != rank || !(listed || cube_ok)) {
      throw UserError("compile_topology: '" + std::string(name) + "' is not a legal " + chip->name +
                          " shape (" + std::to_string(rank) +
                          "D; legal shapes: " + legal_shapes_hint(*chip) + ")",
                      "compile_topology");
    }
    // Checked before it is narrowed to the int chip count: an overflowing product wrapped to 0
    // chips (a division by zero below) or to a negative count.
    const long long chips = checked_product(slice.shape);
    if (chips > static_cast<long long>(chip->max_slice_chips)) {
      throw UserError("compile_topology: '" + std::string(name) + "' has " +
                          (chips == std::numeric_limits<long long>::max() ? std::string("too many")
                                                                          : std::to_string(chips)) +
                          " chips, more than the largest " + chip->name + " slice (" +
                          std::to_string(static_cast<long long>(chip->max_slice_chips)) + " chips)",
                      "compile_topology");
    }
    slice.chips = static_cast<int>(chips);
  } else {
    long long count = 0;
    const auto [ptr, error] = std::from_chars(rest.data(), rest.data() + rest.size(), count);
    if (error != std::errc() || ptr != rest.data() + rest.size() || count <= 0 ||
        count > std::numeric_limits<int>::max()) {
      throw UserError("compile_topology: '" + std::string(name) + "': '" + std::string(rest) +
                          "' is not a positive core or chip count",
                      "compile_topology");
    }
    long long chips = count;
    if (chip->slice.name_counts == SliceNameUnit::kTensorCores) {
      const auto cores_per_chip = static_cast<long long>(chip->tensorcores_per_chip);
      if (count % cores_per_chip != 0) {
        throw UserError("compile_topology: '" + std::string(name) +
                            "' counts TensorCores and must be a multiple of " +
                            std::to_string(cores_per_chip),
                        "compile_topology");
      }
      chips = count / cores_per_chip;
    }
    if (chips > static_cast<long long>(chip->max_slice_chips)) {
      throw UserError("compile_topology: '" + std::string(name) + "' has " + std::to_string(chips) +
                          " chips, more than the largest " + chip->name + " slice (" +
                          std::to_string(static_cast<long long>(chip->max_slice_chips)) + " chips)",
                      "compile_topology");
    }
    slice.shape = shape_for_chip_count(*chip, static_cast<int>(chips), name);
    slice.chips = static_cast<int>(chips);
  }
  if (slice.chips > static_cast<int>(chip->max_slice_chips)) {
    throw UserError("compile_topology: '" + std::string(name) + "' is larger than the largest " +
                        chip->name + " slice",
                    "compile_topology");
  }
  slice.wraparound = wraparound_for_shape(*chip, slice.shape);
  slice.chips_per_host = std::min(slice.chips, static_cast<int>(chip->chips_per_host));
  slice.hosts = (slice.chips + slice.chips_per_host - 1) / slice.chips_per_host;
  return slice;
}

std::vector<std::string> example_slice_names(const ChipSpec& chip, int max_names) {
  const std::string prefix = chip.slice.name_prefixes.front();
  if (chip.slice.shape_rule == ShapeRule::kSwitched) {
    return {prefix};
  }
  const int unit = chip.slice.name_counts == SliceNameUnit::kTensorCores
                       ? static_cast<int>(chip.tensorcores_per_chip)
                       : 1;
  std::vector<std::string> names;
  for (const std::vector<int>& shape : chip.slice.small_shapes) {
    names.push_back(prefix + "-" + std::to_string(product(shape) * unit));
  }
  if (chip.slice.shape_rule == ShapeRule::kCube) {
    for (int chips = kCubeChips; chips <= static_cast<int>(chip.max_slice_chips) &&
                                 static_cast<int>(names.size()) < max_names;
         chips *= 2) {
      names.push_back(prefix + "-" + std::to_string(chips * unit));
    }
  }
  return names;
}

}  // namespace tpusim
