#include "sim/explore/memory_floor.h"

#include <map>
#include <utility>

#include "model/autodiff/remat_policy.h"
#include "model/ir/dtype.h"

namespace tpusim {
namespace {

bool has_dropless_dim(const Tensor& tensor) {
  for (const Dim& dim : tensor.dims) {
    if (dim.name == "expert_tokens") {
      return true;
    }
  }
  return false;
}

}  // namespace

MemoryFloor::MemoryFloor(const TrainingStep& step, const LogicalAxisRules* rules) {
  const Graph& graph = step.graph;
  std::map<std::string, size_t> group_of_names;
  for (const Tensor& tensor : graph.tensors()) {
    const Region& region = graph.region(tensor.region);
    const bool state =
        graph.producer(tensor.id) < 0 &&
        (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kOptimizerState);
    bool saved = false;
    if (!state && region.phase == Phase::kForward) {
      const auto decision = step.saved.find(tensor.id);
      saved = decision != step.saved.end() ? decision->second != RematDecision::kOffload
                                           : tensor.kind == TensorKind::kInput;
    }
    if ((!state && !saved) || has_dropless_dim(tensor)) {
      continue;
    }
    std::string names;
    for (const Dim& dim : tensor.dims) {
      names += dim.logical;
      names += '\0';
    }
    const auto [found, added] = group_of_names.try_emplace(names, groups_.size());
    if (added) {
      Group group;
      group.dims = tensor.dims;
      groups_.push_back(std::move(group));
    }
    Term term;
    for (const Dim& dim : tensor.dims) {
      term.sizes.push_back(dim.size);
    }
    term.bytes_per_element = dtype_bytes(tensor.dtype);
    term.copies = static_cast<double>(state ? region.parameter_sets() : region.repeat);
    term.state = state;
    groups_[found->second].terms.push_back(std::move(term));
  }
  if (rules != nullptr) {
    MeshShape every_axis;  // every axis larger than 1: shard_dims drops none of its axes
    every_axis.ici.fill(2);
    every_axis.dcn.fill(1);
    for (Group& group : groups_) {
      group.axes = rules->shard_dims(group.dims, every_axis);
      group.resolved = true;
    }
  }
}

MemoryFloor::Bytes MemoryFloor::bytes(const MeshShape& mesh, const LogicalAxisRules& rules) const {
  Bytes total;
  std::vector<int64_t> splits;
  for (const Group& group : groups_) {
    std::vector<std::vector<int>> resolved_now;
    const std::vector<std::vector<int>>& axes =
        group.resolved ? group.axes : (resolved_now = rules.shard_dims(group.dims, mesh));
    splits.assign(axes.size(), 1);
    for (size_t dim = 0; dim < axes.size(); ++dim) {
      for (const int axis : axes[dim]) {
        splits[dim] *= mesh.size(axis);
      }
    }
    for (const Term& term : group.terms) {
      double elements = 1;
      for (size_t dim = 0; dim < term.sizes.size(); ++dim) {
        const int64_t local = (term.sizes[dim] + splits[dim] - 1) / splits[dim];  // padded up
        elements *= static_cast<double>(local);
      }
      (term.state ? total.state : total.saved) += elements * term.bytes_per_element * term.copies;
    }
  }
  return total;
}

}  // namespace tpusim
