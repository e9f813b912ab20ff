#include "sim/explore/memory_floor.h"

#include <array>
#include <cstddef>
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

// The index of `dims`' sizes among the distinct ones in `shapes` (flattened, rank sizes each),
// added if new.
size_t shape_index(std::vector<int64_t>& shapes, const std::vector<Dim>& dims) {
  const size_t rank = dims.size();
  if (rank == 0) {
    return 0;  // a scalar: one shape of no sizes
  }
  const size_t count = shapes.size() / rank;
  for (size_t shape = 0; shape < count; ++shape) {
    const int64_t* sizes = shapes.data() + shape * rank;
    bool same = true;
    for (size_t dim = 0; dim < rank && same; ++dim) {
      same = sizes[dim] == dims[dim].size;
    }
    if (same) {
      return shape;
    }
  }
  for (const Dim& dim : dims) {
    shapes.push_back(dim.size);
  }
  return count;
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
    Group& group = groups_[found->second];
    Term term;
    term.shape = shape_index(group.shapes, tensor.dims);
    term.bytes_per_element = dtype_bytes(tensor.dtype);
    term.copies = static_cast<double>(state ? region.parameter_sets() : region.repeat);
    term.state = state;
    group.terms.push_back(term);
  }
  for (Group& group : groups_) {
    group.axes = rules.shard_dims_on_every_axis(group.dims);
  }
  merge_terms();
}

void MemoryFloor::merge_terms() {
  for (const Group& group : groups_) {
    const size_t rank = group.dims.size();
    merged_all_ = merged_all_ && rank <= kMostMergedRank;
    const size_t shapes = rank == 0 ? 1 : group.shapes.size() / rank;
    std::vector<std::array<int64_t, 2>> per_shape(shapes, {0, 0});  // state, saved
    for (const Term& term : group.terms) {
      per_shape[term.shape][term.state ? 0 : 1] +=
          static_cast<int64_t>(term.bytes_per_element) * static_cast<int64_t>(term.copies);
    }
    merged_.push_back(static_cast<int64_t>(rank));
    merged_.push_back(static_cast<int64_t>(shapes));
    for (const std::vector<int>& axes : group.axes) {
      merged_.push_back(static_cast<int64_t>(axes.size()));
      merged_.insert(merged_.end(), axes.begin(), axes.end());
    }
    for (size_t shape = 0; shape < shapes; ++shape) {
      merged_.insert(merged_.end(),
                     group.shapes.begin() + static_cast<std::ptrdiff_t>(shape * rank),
                     group.shapes.begin() + static_cast<std::ptrdiff_t>((shape + 1) * rank));
      merged_.insert(merged_.end(), per_shape[shape].begin(), per_shape[shape].end());
    }
  }
}

void MemoryFloor::local_elements(const Group& group, const MeshShape& mesh,
                                 std::vector<double>& elements) {
  const std::vector<std::vector<int>>& axes = group.axes;
  const size_t rank = axes.size();
  elements.assign(rank == 0 ? 1 : group.shapes.size() / rank, 1.0);
  for (size_t dim = 0; dim < rank; ++dim) {
    const int64_t split = mesh.product_of(axes[dim]);
    if (split == 1) {
      // Most dims are not split: a division costs more than the test.
      for (size_t shape = 0; shape < elements.size(); ++shape) {
        elements[shape] *= static_cast<double>(group.shapes[shape * rank + dim]);
      }
      continue;
    }
    for (size_t shape = 0; shape < elements.size(); ++shape) {
      const int64_t size = group.shapes[shape * rank + dim];
      const int64_t local = (size + split - 1) / split;  // padded up
      elements[shape] *= static_cast<double>(local);
    }
  }
}

MemoryFloor::Bytes MemoryFloor::bytes(const MeshShape& mesh) const {
  if (!merged_all_) {
    return bytes_by_term(mesh);
  }
  Bytes total;
  walk_merged(merged_, mesh, [&total](double elements, const int64_t* at) {
    total.state += elements * static_cast<double>(*at++);
    total.saved += elements * static_cast<double>(*at++);
    return at;
  });
  // Below 2^52 every product and partial sum is a whole number held exactly (merged_).
  constexpr double kExactBelow = 4503599627370496.0;  // 2^52
  if (total.state < kExactBelow && total.saved < kExactBelow) {
    return total;
  }
  return bytes_by_term(mesh);
}

MemoryFloor::Bytes MemoryFloor::bytes_by_term(const MeshShape& mesh) const {
  Bytes total;
  std::vector<double> elements;
  for (const Group& group : groups_) {
    local_elements(group, mesh, elements);
    for (const Term& term : group.terms) {
      (term.state ? total.state : total.saved) +=
          elements[term.shape] * term.bytes_per_element * term.copies;
    }
  }
  return total;
}

}  // namespace tpusim
