#include "sim/explore/divisibility.h"

#include <algorithm>

namespace tpusim {

Divisibility::Divisibility(const TrainingStep& step, const LogicalAxisRules& rules) {
  MeshShape every_axis;  // all axes > 1: nothing is dropped
  every_axis.ici.fill(2);
  every_axis.dcn.fill(1);
  for (const Tensor& tensor : step.graph.tensors()) {
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kInput) {
      continue;
    }
    const std::vector<std::vector<int>> axes = rules.shard_dims(tensor.dims, every_axis);
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      if (axes[dim].empty()) {
        continue;
      }
      const bool batch = tensor.kind == TensorKind::kInput && dim == 0;
      (batch ? batch_dims_ : fixed_dims_).push_back({tensor.dims[dim].size, axes[dim]});
    }
  }
}

bool Divisibility::parameters_divide(const MeshShape& mesh) const {
  return std::all_of(fixed_dims_.begin(), fixed_dims_.end(),
                     [&](const SplitDim& dim) { return dim.size % dim.shards(mesh) == 0; });
}

bool Divisibility::batch_divides(const MeshShape& mesh, int64_t microbatch) const {
  return std::all_of(batch_dims_.begin(), batch_dims_.end(),
                     [&](const SplitDim& dim) { return microbatch % dim.shards(mesh) == 0; });
}

int64_t Divisibility::SplitDim::shards(const MeshShape& mesh) const {
  int64_t product = 1;
  for (const int axis : axes) {
    product *= mesh.size(axis);
  }
  return product;
}

}  // namespace tpusim
