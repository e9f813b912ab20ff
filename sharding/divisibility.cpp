#include "sharding/divisibility.h"

#include <map>
#include <sstream>

#include "common/error.h"

namespace tpusim {
namespace {

std::optional<UnevenSplit> first_uneven(const std::vector<UnevenSplit>& dims, const MeshShape& mesh,
                                        int64_t batch) {
  for (const UnevenSplit& dim : dims) {
    const int64_t size = batch > 0 ? batch : dim.size;
    const int64_t shards = mesh.product_of(dim.axes);
    if (size % shards != 0) {
      UnevenSplit uneven = dim;
      uneven.size = size;
      uneven.shards = shards;
      return uneven;
    }
  }
  return std::nullopt;
}

// "1.25 x 4 devices": how the microbatch came about.
std::string batch_origin(double per_device_batch_size, const MeshShape& mesh) {
  std::ostringstream out;
  out << per_device_batch_size << " x " << mesh.num_devices() << " devices";
  return out.str();
}

// The config key of the first axis of size > 1 (ICI before DCN), for --json's "key".
std::string first_axis_key(const UnevenSplit& split, const MeshShape& mesh) {
  for (const int axis : split.axes) {
    const std::string& name = mesh_axis_names()[static_cast<size_t>(axis)];
    if (mesh.ici[static_cast<size_t>(axis)] > 1) {
      return mesh_axis_key(false, name);
    }
    if (mesh.dcn[static_cast<size_t>(axis)] > 1) {
      return mesh_axis_key(true, name);
    }
  }
  return "";
}

// " (from num_experts)": the model key that sets a parameter dim, where one does.
std::string model_key(const std::string& dim) {
  static const std::map<std::string, std::string> keys = {{"embed", "base_emb_dim"},
                                                          {"heads", "base_num_query_heads"},
                                                          {"kv_heads", "base_num_kv_heads"},
                                                          {"vocab", "vocab_size"},
                                                          {"experts", "num_experts"}};
  const auto found = keys.find(dim);
  return found == keys.end() ? "" : " (from " + found->second + ")";
}

// "per_device_batch_size: <origin><verb>N sequences per microbatch, which do not split evenly
// over the batch's <axes>: N is not a multiple of S<why>".
UserError uneven_batch_error(const UnevenSplit& uneven, const MeshShape& mesh,
                             double per_device_batch_size, const std::string& verb,
                             const std::string& why) {
  return UserError("per_device_batch_size: " + batch_origin(per_device_batch_size, mesh) + verb +
                       std::to_string(uneven.size) +
                       " sequences per microbatch, which do not split evenly over the batch's " +
                       uneven.describe_axes(mesh) + ": " + std::to_string(uneven.size) +
                       " is not a multiple of " + std::to_string(uneven.shards) + why,
                   "per_device_batch_size");
}

}  // namespace

std::string UnevenSplit::describe_axes(const MeshShape& mesh) const {
  std::string text;
  for (const int axis : axes) {
    const auto index = static_cast<size_t>(axis);
    if (mesh.size(axis) == 1) {
      continue;
    }
    const std::string& name = mesh_axis_names()[index];
    std::string keys;
    if (mesh.ici[index] > 1) {
      keys = mesh_axis_key(false, name) + "=" + std::to_string(mesh.ici[index]);
    }
    if (mesh.dcn[index] > 1) {
      keys += (keys.empty() ? "" : " x ") + mesh_axis_key(true, name) + "=" +
              std::to_string(mesh.dcn[index]);
    }
    text += (text.empty() ? "" : ", ") + name + "=" + std::to_string(mesh.size(axis)) + " (" +
            keys + ")";
  }
  return text;
}

Divisibility::Divisibility(const TrainingStep& step, const LogicalAxisRules& rules) {
  for (const Tensor& tensor : step.graph.tensors()) {
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kInput) {
      continue;
    }
    const std::vector<std::vector<int>> axes = rules.shard_dims_on_every_axis(tensor.dims);
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      if (axes[dim].empty()) {
        continue;
      }
      const bool input = tensor.kind == TensorKind::kInput;
      UnevenSplit split;
      split.tensor = tensor.name;
      split.dim = tensor.dims[dim].name;
      split.input = input;
      split.size = tensor.dims[dim].size;
      if (input && split.dim == "length") {
        // num_vocab_tiling's head reads the targets in chunks (a repeated region); the argument
        // is the whole targets, which the chunks' padding does not touch.
        split.size *= step.graph.region(tensor.region).repeat;
      }
      split.axes = axes[dim];
      (input && dim == 0 ? batch_dims_ : fixed_dims_).push_back(std::move(split));
    }
  }
}

bool Divisibility::parameters_divide(const MeshShape& mesh) const {
  return !first_uneven_parameter(mesh).has_value();
}

bool Divisibility::batch_divides(const MeshShape& mesh, int64_t loaded_microbatch) const {
  return !first_uneven_batch(mesh, loaded_microbatch).has_value();
}

std::optional<UnevenSplit> Divisibility::first_uneven_parameter(const MeshShape& mesh) const {
  return first_uneven(fixed_dims_, mesh, /*batch=*/0);
}

std::optional<UnevenSplit> Divisibility::first_uneven_batch(const MeshShape& mesh,
                                                            int64_t batch) const {
  return first_uneven(batch_dims_, mesh, batch);
}

void Divisibility::require_divides(const MeshShape& mesh, const BatchPlan& plan,
                                   double per_device_batch_size) const {
  if (const std::optional<UnevenSplit> uneven = first_uneven_parameter(mesh)) {
    const std::string over = " does not split evenly over " + uneven->describe_axes(mesh) + ": " +
                             std::to_string(uneven->size) + " is not a multiple of " +
                             std::to_string(uneven->shards);
    if (uneven->input && uneven->dim == "length") {
      throw UserError("max_target_length: " + std::to_string(uneven->size) + over +
                          " (the inputs' sequence; as explore's axis_does_not_divide)",
                      "max_target_length");
    }
    const std::string key = first_axis_key(*uneven, mesh);
    throw UserError(key + ": " + (uneven->input ? "input " : "parameter ") + uneven->tensor +
                        "'s " + uneven->dim + " dim" + model_key(uneven->dim) + over +
                        " (JAX splits jit arguments evenly; as explore's axis_does_not_divide)",
                    key);
  }
  if (const std::optional<UnevenSplit> uneven = first_uneven_batch(mesh, plan.loaded_microbatch)) {
    throw uneven_batch_error(*uneven, mesh, per_device_batch_size, " loads ",
                             " (MaxText shards the loaded batch evenly; as explore's "
                             "axis_does_not_divide)");
  }
}

void Divisibility::require_train_batch_divides(const MeshShape& mesh, const BatchPlan& plan,
                                               double per_device_batch_size) const {
  if (const std::optional<UnevenSplit> uneven = first_uneven_batch(mesh, plan.microbatch)) {
    throw uneven_batch_error(*uneven, mesh, per_device_batch_size, " is ",
                             "; tpusim train computes only batches that split evenly (MaxText "
                             "loads one sequence per device and XLA pads the rest; estimate "
                             "models that)");
  }
}

}  // namespace tpusim
