#include "sharding/mesh.h"

#include <algorithm>

#include "common/error.h"
#include "common/suggest.h"
#include "hw/slice.h"
#include "model/config.h"

namespace tpusim {
namespace {

// Fills one group (ici or dcn) of axis sizes so their product is `target`.
std::array<int, kNumMeshAxes> fill_group(const Config& config, bool dcn, int target,
                                         const std::string& target_what) {
  std::array<int, kNumMeshAxes> sizes{};
  int auto_axis = -1;
  constexpr long long kProductCap = 1LL << 40;
  long long known_product = 1;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    const std::string key = mesh_axis_key(dcn, mesh_axis_names()[axis]);
    const int64_t value = mesh_axis_value_from_config(config, dcn, axis);
    if (value == -1) {
      if (auto_axis >= 0) {
        throw UserError(key + ": only one " + (dcn ? "dcn" : "ici") +
                        "_*_parallelism may be -1 (auto), but " +
                        mesh_axis_key(dcn, mesh_axis_names()[auto_axis]) + " is -1 too");
      }
      auto_axis = axis;
      continue;
    }
    if (dcn && value > target) {
      // One slice per step of a DCN axis: more than there are slices can never be placed.
      throw UserError(key + "=" + std::to_string(value) + ": a DCN axis of " +
                          std::to_string(value) + " needs that many slices, but " + target_what +
                          " is " + std::to_string(target) + " (compile_topology_num_slices)",
                      key);
    }
    sizes[axis] = static_cast<int>(value);
    // Each size is at most 2^20 (mesh_axis_value_from_config), so capping the product at 2^40 keeps
    // it from overflowing over 12 axes; a capped product matches no device count.
    known_product = std::min(known_product * value, kProductCap);
  }
  const std::string group = dcn ? "dcn_*_parallelism" : "ici_*_parallelism";
  const std::string product_text = known_product == kProductCap
                                       ? "at least " + std::to_string(kProductCap)
                                       : std::to_string(known_product);
  if (auto_axis >= 0) {
    const std::string key = mesh_axis_key(dcn, mesh_axis_names()[auto_axis]);
    if (target % known_product != 0) {
      throw UserError(key + "=-1 cannot be filled: the other " + group + " multiply to " +
                      product_text + ", which does not divide " + target_what + " (" +
                      std::to_string(target) + ")");
    }
    sizes[auto_axis] = static_cast<int>(target / known_product);
  } else if (known_product != target) {
    throw UserError(group + " multiply to " + product_text + " but " + target_what + " is " +
                    std::to_string(target));
  }
  return sizes;
}

}  // namespace

int64_t mesh_axis_value_from_config(const Config& config, bool dcn, int axis) {
  constexpr int64_t kMaxAxisSize = int64_t{1} << 20;
  const std::string key = mesh_axis_key(dcn, mesh_axis_names()[static_cast<size_t>(axis)]);
  const int64_t value = config.get_int(key);
  if (value != -1 && (value < 1 || value > kMaxAxisSize)) {
    throw UserError(key + ": " + std::to_string(value) +
                        " must be -1 (auto) or a positive size up to " +
                        std::to_string(kMaxAxisSize),
                    key);
  }
  return value;
}

const std::array<std::string, kNumMeshAxes>& mesh_axis_names() {
  static const std::array<std::string, kNumMeshAxes> names = {
      {"diloco", "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses",
       "context_autoregressive", "tensor", "tensor_sequence", "expert", "autoregressive"}};
  return names;
}

std::string mesh_axis_key(bool dcn, const std::string& axis) {
  const std::string name = axis == "stage" ? "pipeline" : axis;
  return std::string(dcn ? "dcn_" : "ici_") + name + "_parallelism";
}

int mesh_axis_index(const std::string& axis) {
  const auto& names = mesh_axis_names();
  for (int index = 0; index < kNumMeshAxes; ++index) {
    if (names[index] == axis) {
      return index;
    }
  }
  throw UserError("unknown mesh axis '" + axis + "'" +
                  did_you_mean(axis, std::vector<std::string>(names.begin(), names.end())));
}

int MeshShape::size(const std::string& axis) const {
  return size(mesh_axis_index(axis));
}

int MeshShape::num_devices() const {
  int devices = 1;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    devices *= size(axis);
  }
  return devices;
}

std::string MeshShape::describe() const {
  std::string text;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    if (size(axis) > 1) {
      text +=
          (text.empty() ? "" : " ") + mesh_axis_names()[axis] + "=" + std::to_string(size(axis));
    }
  }
  return text.empty() ? "(single device)" : text;
}

MeshShape resolve_mesh(const Config& config, const Slice& slice) {
  MeshShape mesh;
  mesh.ici = fill_group(config, false, slice.devices(), "the devices per slice of " + slice.name);
  mesh.dcn = fill_group(config, true, slice.num_slices, "the number of slices");
  return mesh;
}

}  // namespace tpusim
