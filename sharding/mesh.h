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
#include <string>
#include <vector>

namespace tpusim {

class Config;
struct Slice;

inline constexpr int kNumMeshAxes = 12;

// MaxText's mesh axis names, in mesh order.
const std::array<std::string, kNumMeshAxes>& mesh_axis_names();

// "ici_fsdp_parallelism" for (ici, "fsdp"); "ici_pipeline_parallelism" for (ici, "stage").
std::string mesh_axis_key(bool dcn, const std::string& axis);

struct MeshShape {
  std::array<int, kNumMeshAxes> ici{};  // size of each axis inside a slice
  std::array<int, kNumMeshAxes> dcn{};  // size of each axis across slices

  // ici x dcn size of an axis.
  int size(int axis) const { return ici[axis] * dcn[axis]; }
  int size(const std::string& axis) const;
  int num_devices() const;
  // "fsdp=16 tensor=4" (axes of size > 1), for messages.
  std::string describe() const;
};

// The value of one parallelism key (ici_* or dcn_*): -1 (auto) or a size from 1 to 2^20;
// UserError naming the key otherwise. Every command reads mesh keys through it.
int64_t mesh_axis_value_from_config(const Config& config, bool dcn, int axis);

// Index of a mesh axis by name; UserError with a suggestion when unknown.
int mesh_axis_index(const std::string& axis);

// Sizes the mesh for `slice` from the config's parallelism keys; UserError naming the key when a
// value is invalid, more than one -1 appears in a group, or the product does not match.
MeshShape resolve_mesh(const Config& config, const Slice& slice);

}  // namespace tpusim
