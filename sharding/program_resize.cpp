#include "sharding/program_resize.h"

#include <algorithm>
#include <utility>

#include "sharding/reassociate_reductions.h"

namespace tpusim {

std::optional<ResizableProgram> ResizableProgram::from(const PartitionedProgram& program,
                                                       const MeshShape& mesh) {
  if (!program.size_decisions.resizable) {
    return std::nullopt;
  }
  ResizableProgram result;
  result.program_ = program;
  result.structure_ = axes_above_one(mesh);
  result.primary_tensors_ = program.local_of_global.size();
  for (const Tensor& tensor : program.graph.tensors()) {
    result.tensor_dims_.push_back(result.split_dims_.size());
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      const Dim& info = tensor.dims[dim];
      const uint32_t axes = mesh_axis_bits(info.sharded_over);
      if (info.global_size > 0 && axes != 0) {
        result.split_dims_.push_back(
            {tensor.id, static_cast<uint32_t>(dim), axes, result.set_of(axes), info.global_size});
      }
    }
  }
  result.tensor_dims_.push_back(result.split_dims_.size());
  for (const Op& op : program.graph.ops()) {
    if (!op.attrs.mesh_axes.empty()) {
      result.group_ops_.push_back({op.id, mesh_axis_bits(op.attrs.mesh_axes)});
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

uint32_t ResizableProgram::set_of(uint32_t axes) {
  const auto found = std::find(split_axes_.begin(), split_axes_.end(), axes);
  if (found != split_axes_.end()) {
    return static_cast<uint32_t>(found - split_axes_.begin());
  }
  split_axes_.push_back(axes);
  return static_cast<uint32_t>(split_axes_.size() - 1);
}

void ResizableProgram::splits_on(const MeshShape& mesh, std::vector<int64_t>& splits) const {
  splits.resize(split_axes_.size());
  for (size_t set = 0; set < split_axes_.size(); ++set) {
    splits[set] = mesh.product_of(split_axes_[set]);
  }
}

void ResizableProgram::split_sets_of(TensorId tensor, std::vector<uint32_t>& sets) const {
  const auto id = static_cast<size_t>(tensor);
  for (size_t at = tensor_dims_[id]; at < tensor_dims_[id + 1]; ++at) {
    sets.push_back(split_dims_[at].set);
  }
}

void ResizableProgram::point_sizes() {
  sizes_.at.clear();
  for (const SplitDim& split_dim : split_dims_) {
    sizes_.at.push_back(&program_.graph.mutable_tensor(split_dim.tensor).dims[split_dim.dim].size);
  }
}

void ResizableProgram::resize_dims(size_t begin, size_t end, const std::vector<int64_t>& splits) {
  if (sizes_.at.size() != split_dims_.size()) {
    point_sizes();
  }
  for (size_t at = begin; at < end; ++at) {
    const SplitDim& split_dim = split_dims_[at];
    const int64_t split = splits[split_dim.set];
    *sizes_.at[at] = (split_dim.global + split - 1) / split;
  }
}

void ResizableProgram::resize_tensor(TensorId tensor, const std::vector<int64_t>& splits) {
  const auto id = static_cast<size_t>(tensor);
  resize_dims(tensor_dims_[id], tensor_dims_[id + 1], splits);
}

bool ResizableProgram::holds_on(const MeshShape& mesh, const std::vector<int64_t>& splits) {
  if (axes_above_one(mesh) != structure_) {
    return false;
  }
  for (const SizeDecision& decision : program_.size_decisions.recorded) {
    if (decision.kind != SizeDecision::Kind::kDivides) {  // compares two tensors' local sizes
      resize_tensor(decision.a, splits);
      resize_tensor(decision.b, splits);
    }
  }
  return std::all_of(program_.size_decisions.recorded.begin(),
                     program_.size_decisions.recorded.end(),
                     [&](const SizeDecision& decision) { return holds(decision, mesh); });
}

bool ResizableProgram::resize(const MeshShape& mesh) {
  splits_on(mesh, splits_);
  if (!holds_on(mesh, splits_)) {
    return false;
  }
  resize_dims(0, split_dims_.size(), splits_);
  Graph& graph = program_.graph;
  for (const GroupOp& group : group_ops_) {
    graph.mutable_op(group.op).attrs.group_size = mesh.product_of(group.axes);
  }
  note_padding();
  return true;
}

void ResizableProgram::note_padding() {
  // As make_local notes them: the global tensors' own local tensors, in order, each dim an axis
  // split does not divide.
  program_.padding.clear();
  for (const SplitDim& split_dim : split_dims_) {
    if (static_cast<size_t>(split_dim.tensor) >= primary_tensors_) {
      break;  // split_dims_ follow the tensor ids
    }
    const int64_t split = splits_[split_dim.set];
    if (split > 1 && split_dim.global % split != 0) {
      const Tensor& tensor = program_.graph.tensor(split_dim.tensor);
      const int64_t local = tensor.dims[split_dim.dim].size;
      program_.padding.push_back({tensor.name, tensor.dims[split_dim.dim].name.str(),
                                  split_dim.global, split, local * split});
    }
  }
}

bool ResizableProgram::holds(const SizeDecision& decision, const MeshShape& mesh) const {
  bool outcome = false;
  switch (decision.kind) {
    case SizeDecision::Kind::kBytesLess:
      // The partitioner's own expression (partition_einsum.cpp), so that the two round alike.
      outcome = decision.factor * static_cast<double>(program_.graph.tensor(decision.a).bytes()) <
                static_cast<double>(program_.graph.tensor(decision.b).bytes());
      break;
    case SizeDecision::Kind::kDivides:
      outcome = decision.value % mesh.product_of(decision.axes) == 0;
      break;
    case SizeDecision::Kind::kShapesEqual:
      outcome =
          same_local_shape(program_.graph.tensor(decision.a), program_.graph.tensor(decision.b));
      break;
  }
  return outcome == decision.outcome;
}

bool same_program(const PartitionedProgram& a, const PartitionedProgram& b) {
  return a.padding == b.padding && a.local_of_global == b.local_of_global &&
         a.graph.to_text() == b.graph.to_text();
}

}  // namespace tpusim
