#include "sharding/program_resize.h"

#include <utility>

#include "sharding/reassociate_reductions.h"

namespace tpusim {
namespace {

int64_t split_of(uint32_t axes, const MeshShape& mesh) {
  int64_t split = 1;
  for (int axis = 0; axes != 0; ++axis, axes >>= 1U) {
    if ((axes & 1U) != 0) {
      split *= mesh.size(axis);
    }
  }
  return split;
}

}  // namespace

std::optional<ResizableProgram> ResizableProgram::from(const PartitionedProgram& program,
                                                       const MeshShape& mesh) {
  if (!program.size_decisions.resizable) {
    return std::nullopt;
  }
  ResizableProgram result;
  result.graph_ = program.graph;
  result.decisions_ = program.size_decisions;
  result.structure_ = axes_above_one(mesh);
  for (const Tensor& tensor : result.graph_.tensors()) {
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      const Dim& info = tensor.dims[dim];
      uint32_t axes = 0;
      for (const Name& axis : info.sharded_over) {
        axes |= 1U << static_cast<unsigned>(mesh_axis_index(axis.str()));
      }
      if (info.global_size > 0 && axes != 0) {
        result.split_dims_.push_back(
            {tensor.id, static_cast<uint32_t>(dim), axes, info.global_size});
      }
    }
  }
  return result;
}

uint32_t ResizableProgram::axes_above_one(const MeshShape& mesh) {
  uint32_t axes = 0;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    if (mesh.size(axis) > 1) {
      axes |= 1U << static_cast<unsigned>(axis);
    }
  }
  return axes;
}

bool ResizableProgram::resize(const MeshShape& mesh) {
  if (axes_above_one(mesh) != structure_) {
    return false;
  }
  for (const SplitDim& split_dim : split_dims_) {
    const int64_t split = split_of(split_dim.axes, mesh);
    graph_.mutable_tensor(split_dim.tensor).dims[split_dim.dim].size =
        (split_dim.global + split - 1) / split;
  }
  for (const SizeDecision& decision : decisions_.recorded) {
    if (!holds(decision, mesh)) {
      return false;
    }
  }
  return true;
}

bool ResizableProgram::holds(const SizeDecision& decision, const MeshShape& mesh) const {
  bool outcome = false;
  switch (decision.kind) {
    case SizeDecision::Kind::kBytesLess:
      // The partitioner's own expression (partition_einsum.cpp), so that the two round alike.
      outcome = decision.factor * static_cast<double>(graph_.tensor(decision.a).bytes()) <
                static_cast<double>(graph_.tensor(decision.b).bytes());
      break;
    case SizeDecision::Kind::kDivides:
      outcome = decision.value % split_of(decision.axes, mesh) == 0;
      break;
    case SizeDecision::Kind::kShapesEqual:
      outcome = same_local_shape(graph_.tensor(decision.a), graph_.tensor(decision.b));
      break;
  }
  return outcome == decision.outcome;
}

}  // namespace tpusim
