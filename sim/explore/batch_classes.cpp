#include "sim/explore/batch_classes.h"

#include <algorithm>
#include <map>
#include <string>

namespace tpusim {
namespace {

// MoE routing: the partitioner sizes dropless expert buffers and routed fractions from the
// tokens, which a dim's local size alone does not show.
bool routes_experts(const Graph& graph) {
  const bool router = std::any_of(graph.ops().begin(), graph.ops().end(),
                                  [](const Op& op) { return op.attrs.top_k > 0; });
  return router ||
         std::any_of(graph.tensors().begin(), graph.tensors().end(), [](const Tensor& tensor) {
           return std::any_of(tensor.dims.begin(), tensor.dims.end(),
                              [](const Dim& dim) { return dim.name == "expert_tokens"; });
         });
}

bool same_regions(const Graph& a, const Graph& b) {
  if (a.regions().size() != b.regions().size()) {
    return false;
  }
  for (size_t index = 0; index < a.regions().size(); ++index) {
    const Region& x = a.regions()[index];
    const Region& y = b.regions()[index];
    if (x.name != y.name || x.repeat != y.repeat || x.phase != y.phase ||
        x.forward_region != y.forward_region || x.shared_parameters != y.shared_parameters ||
        x.pipeline != y.pipeline) {
      return false;
    }
  }
  return true;
}

bool same_tensors_but_sizes(const Graph& a, const Graph& b) {
  if (a.tensors().size() != b.tensors().size()) {
    return false;
  }
  for (size_t index = 0; index < a.tensors().size(); ++index) {
    const Tensor& x = a.tensors()[index];
    const Tensor& y = b.tensors()[index];
    if (x.name != y.name || x.dtype != y.dtype || x.kind != y.kind || x.region != y.region ||
        x.remat_name != y.remat_name || x.dims.size() != y.dims.size()) {
      return false;
    }
    for (size_t dim = 0; dim < x.dims.size(); ++dim) {
      if (x.dims[dim].name != y.dims[dim].name || x.dims[dim].logical != y.dims[dim].logical) {
        return false;
      }
    }
  }
  return true;
}

bool same_ops(const Graph& a, const Graph& b) {
  if (a.ops().size() != b.ops().size() || a.carries().size() != b.carries().size()) {
    return false;
  }
  for (size_t index = 0; index < a.ops().size(); ++index) {
    const Op& x = a.ops()[index];
    const Op& y = b.ops()[index];
    if (x.kind != y.kind || x.name != y.name || x.inputs != y.inputs || x.outputs != y.outputs ||
        x.phase != y.phase || x.region != y.region || x.attrs != y.attrs) {
      return false;
    }
  }
  return std::equal(a.carries().begin(), a.carries().end(), b.carries().begin(),
                    [](const Graph::Carry& x, const Graph::Carry& y) {
                      return x.from == y.from && x.to == y.to;
                    });
}

// The same graph but for dim sizes (what the partitioner reads besides the sizes).
bool same_but_sizes(const Graph& a, const Graph& b) {
  return same_regions(a, b) && same_tensors_but_sizes(a, b) && same_ops(a, b);
}

}  // namespace

BatchClasses::BatchClasses(const std::vector<const TrainingStep*>& none_steps,
                           const LogicalAxisRules& rules) {
  if (none_steps.size() < 2 || routes_experts(none_steps.front()->graph)) {
    return;
  }
  const Graph& first = none_steps.front()->graph;
  comparable_.assign(none_steps.size(), false);
  for (size_t batch = 0; batch < none_steps.size(); ++batch) {
    comparable_[batch] = batch == 0 || same_but_sizes(first, none_steps[batch]->graph);
  }
  // The dims whose size differs between the comparable batches, grouped by logical names.
  std::map<std::string, size_t> group_of_names;
  for (size_t tensor = 0; tensor < first.tensors().size(); ++tensor) {
    const Tensor& global = first.tensors()[tensor];
    for (size_t dim = 0; dim < global.dims.size(); ++dim) {
      bool varies = false;
      for (size_t batch = 1; batch < none_steps.size(); ++batch) {
        varies = varies ||
                 (comparable_[batch] && none_steps[batch]->graph.tensors()[tensor].dims[dim].size !=
                                            global.dims[dim].size);
      }
      if (!varies) {
        continue;
      }
      const auto [found, added] =
          group_of_names.try_emplace(logical_names_key(global.dims), groups_.size());
      if (added) {
        Group group;
        group.axes = rules.shard_dims_on_every_axis(global.dims);
        group.sizes.resize(none_steps.size());
        groups_.push_back(std::move(group));
      }
      Group& group = groups_[found->second];
      group.dims.push_back(dim);
      for (size_t batch = 0; batch < none_steps.size(); ++batch) {
        group.sizes[batch].push_back(
            comparable_[batch] ? none_steps[batch]->graph.tensors()[tensor].dims[dim].size : 0);
      }
    }
  }
}

std::vector<int64_t> BatchClasses::key(const MeshShape& mesh, size_t batch) const {
  std::vector<int64_t> key;
  if (batch >= comparable_.size() || !comparable_[batch]) {
    return key;
  }
  key.push_back(1);  // non-empty even with nothing varying
  for (const Group& group : groups_) {
    for (size_t entry = 0; entry < group.dims.size(); ++entry) {
      int64_t split = 1;
      for (const int axis : group.axes[group.dims[entry]]) {
        split *= mesh.size(axis);
      }
      const int64_t size = group.sizes[batch][entry];
      key.push_back((size + split - 1) / split);  // padded up, as make_local
    }
  }
  return key;
}

}  // namespace tpusim
