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

MemoryFloor::MemoryFloor(const TrainingStep& step, const LogicalAxisRules& rules) {
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
    const auto [found, added] =
        group_of_names.try_emplace(logical_names_key(tensor.dims), groups_.size());
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
  for (Group& group : groups_) {
    group.axes = rules.shard_dims_on_every_axis(group.dims);
  }
}

MemoryFloor::Bytes MemoryFloor::bytes(const MeshShape& mesh) const {
  Bytes total;
  std::vector<int64_t> splits;
  for (const Group& group : groups_) {
    const std::vector<std::vector<int>>& axes = group.axes;
    splits.assign(axes.size(), 1);
    for (size_t dim = 0; dim < axes.size(); ++dim) {
      for (const int axis : axes[dim]) {
        splits[dim] *= mesh.size(axis);
      }
    }
    for (const Term& term : group.terms) {
      double elements = 1;
      for (size_t dim = 0; dim < term.sizes.size(); ++dim) {
        const int64_t split = splits[dim];
        // Padded up; most dims are not split, and a division costs more than the test.
        const int64_t local = split == 1 ? term.sizes[dim] : (term.sizes[dim] + split - 1) / split;
        elements *= static_cast<double>(local);
      }
      (term.state ? total.state : total.saved) += elements * term.bytes_per_element * term.copies;
    }
  }
  return total;
}

}  // namespace tpusim
