// sharding/mesh.h: MaxText's device mesh, its 12 axes sized from ici_*/dcn_* parallelism keys.
//
// Axes, in MaxText's order: diloco, data, stage, fsdp, fsdp_transpose, context,
// context_usp_ulysses, context_autoregressive, tensor, tensor_sequence, expert, autoregressive.
// Each has an ICI size (inside a slice; the product must equal the devices of one slice) and a DCN
// size (across slices; the product must equal the number of slices). One -1 per group is filled
// with what is left (MaxText fill_unspecified_mesh_axes). The `stage` axis is sized by
// ici_pipeline_parallelism / dcn_pipeline_parallelism, as in MaxText.
//
// Example (v5p-128 = 64 devices):
//   ici_fsdp_parallelism=-1 ici_tensor_parallelism=4  -> fsdp 16, tensor 4
//   ici_fsdp_parallelism=-1 ici_tensor_parallelism=5  -> UserError "... 5 does not divide 64 ..."
#pragma once

#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <ranges>
#include <string>
#include <vector>

namespace tpusim {

class Config;
struct Slice;

inline constexpr int kNumMeshAxes = 12;

// A set of mesh axes: bit `axis` (1 << mesh_axis_index) for each axis in the set.
// Example: {fsdp, tensor} = 1 << 3 | 1 << 8.
using MeshAxisBits = uint32_t;
static_assert(kNumMeshAxes <= 32, "MeshAxisBits holds one bit per mesh axis");

// MaxText's mesh axis names, in mesh order.
const std::array<std::string, kNumMeshAxes>& mesh_axis_names();

// "ici_fsdp_parallelism" for (ici, "fsdp"); "ici_pipeline_parallelism" for (ici, "stage").
std::string mesh_axis_key(bool dcn, const std::string& axis);

// Index of a mesh axis by name; UserError with a suggestion when unknown.
int mesh_axis_index(const std::string& axis);

// The set of `axes`, given as mesh axis indices or names (std::string, Name; a name that is no
// mesh axis is a UserError, as in mesh_axis_index).
// Example: mesh_axis_bits(std::vector<int>{3, 8}) = 1 << 3 | 1 << 8
//          = mesh_axis_bits(std::vector<std::string>{"fsdp", "tensor"}).
template <std::ranges::input_range Axes>
MeshAxisBits mesh_axis_bits(const Axes& axes) {
  MeshAxisBits bits = 0;
  for (const auto& axis : axes) {
    if constexpr (std::integral<std::ranges::range_value_t<Axes>>) {
      bits |= MeshAxisBits{1} << static_cast<unsigned>(axis);
    } else {
      bits |= MeshAxisBits{1} << static_cast<unsigned>(mesh_axis_index(axis));
    }
  }
  return bits;
}

struct MeshShape {
  std::array<int, kNumMeshAxes> ici{};  // size of each axis inside a slice
  std::array<int, kNumMeshAxes> dcn{};  // size of each axis across slices

  // ici x dcn size of an axis.
  int size(int axis) const { return ici[axis] * dcn[axis]; }
  int size(const std::string& axis) const;
  int num_devices() const;
  // The product of the sizes (ICI x DCN) of a set of axes: the shards of a dim split over them,
  // the devices of a collective group spanning them; 1 for no axis. The set is given as bits or
  // as a list of axis indices.
  // Example: data=2 fsdp=4 tensor=8: product_of(1 << 3 | 1 << 8) = 32 (fsdp x tensor),
  // product_of(std::vector<int>{1, 8}) = 16 (data x tensor), product_of(0) = 1.
  int64_t product_of(MeshAxisBits axes) const {
    int64_t product = 1;
    for (; axes != 0; axes &= axes - 1) {
      product *= size(std::countr_zero(axes));
    }
    return product;
  }
  template <std::ranges::input_range Axes>
  requires std::integral<std::ranges::range_value_t<Axes>> int64_t product_of(const Axes& axes)
  const {
    int64_t product = 1;
    for (const auto axis : axes) {
      product *= size(static_cast<int>(axis));
    }
    return product;
  }
  // "fsdp=16 tensor=4" (axes of size > 1), for messages.
  std::string describe() const;
};

// The value of one parallelism key (ici_* or dcn_*): -1 (auto) or a size from 1 to 2^20;
// UserError naming the key otherwise. Every command reads mesh keys through it.
int64_t mesh_axis_value_from_config(const Config& config, bool dcn, int axis);

// Sizes the mesh for `slice` from the config's parallelism keys; UserError naming the key when a
// value is invalid, more than one -1 appears in a group, or the product does not match.
MeshShape resolve_mesh(const Config& config, const Slice& slice);

}  // namespace tpusim
