#include "sim/explore/batch_classes.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

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

// Regions alike but for their repeats and pipeline loops: the partitioner reads those only for
// the stage hand-over collectives (sharding/partition_pipeline.cpp), not for compute ops, and the
// bounds take each program's own repeats (bounds_from_regions).
bool same_regions(const Graph& a, const Graph& b) {
  return std::equal(a.regions().begin(), a.regions().end(), b.regions().begin(), b.regions().end(),
                    [](const Region& x, const Region& y) {
                      return x.name == y.name && x.phase == y.phase &&
                             x.forward_region == y.forward_region &&
                             x.shared_parameters == y.shared_parameters &&
                             x.pipelined() == y.pipelined();
                    });
}

bool same_tensors_but_sizes(const Graph& a, const Graph& b) {
  const auto same_dim_names = [](const Dim& x, const Dim& y) {
    return x.name == y.name && x.logical == y.logical;
  };
  return std::equal(a.tensors().begin(), a.tensors().end(), b.tensors().begin(), b.tensors().end(),
                    [&](const Tensor& x, const Tensor& y) {
                      return x.name == y.name && x.dtype == y.dtype && x.kind == y.kind &&
                             x.region == y.region && x.remat_name == y.remat_name &&
                             std::equal(x.dims.begin(), x.dims.end(), y.dims.begin(), y.dims.end(),
                                        same_dim_names);
                    });
}

bool same_ops(const Graph& a, const Graph& b) {
  return std::equal(a.ops().begin(), a.ops().end(), b.ops().begin(), b.ops().end(),
                    [](const Op& x, const Op& y) {
                      return x.kind == y.kind && x.name == y.name && x.inputs == y.inputs &&
                             x.outputs == y.outputs && x.phase == y.phase && x.region == y.region &&
                             x.attrs == y.attrs;
                    }) &&
         std::equal(a.carries().begin(), a.carries().end(), b.carries().begin(), b.carries().end(),
                    [](const Graph::Carry& x, const Graph::Carry& y) {
                      return x.from == y.from && x.to == y.to;
                    });
}

// The same graph but for dim sizes, repeats and pipeline loops (what the partitioner reads for
// compute ops besides the sizes).
bool same_but_sizes(const Graph& a, const Graph& b) {
  return same_regions(a, b) && same_tensors_but_sizes(a, b) && same_ops(a, b);
}

// Positions of dims: tensor x kMaxDims + dim.
constexpr int64_t kMaxDims = 64;

}  // namespace

BatchClasses::Member BatchClasses::member_of(size_t index, const Graph& graph) const {
  const Reference& reference = references_[index];
  Member member;
  member.reference = static_cast<int64_t>(index);
  for (size_t tensor = 0; tensor < graph.tensors().size(); ++tensor) {
    const std::vector<Dim>& dims = graph.tensors()[tensor].dims;
    const std::vector<Dim>& reference_dims = reference.step->graph.tensors()[tensor].dims;
    for (size_t dim = 0; dim < dims.size(); ++dim) {
      if (dims[dim].size == reference_dims[dim].size) {
        continue;
      }
      const auto found = std::find(reference.group_names.begin(), reference.group_names.end(),
                                   logical_names_key(dims));
      member.varying.push_back({static_cast<int64_t>(tensor) * kMaxDims + static_cast<int64_t>(dim),
                                static_cast<size_t>(found - reference.group_names.begin()), dim,
                                dims[dim].size, reference_dims[dim].size});
    }
  }
  return member;
}

std::optional<BatchClasses::Reference> BatchClasses::new_reference(
    const std::shared_ptr<const TrainingStep>& step, const std::vector<uint32_t>& atoms,
    const LogicalAxisRules& rules) {
  const Graph& graph = step->graph;
  Reference reference;
  reference.step = step;
  reference.atoms = atoms;
  reference.rules = rules.rules();
  reference.regions = graph.regions().size();
  reference.regions_of_tensor.resize(graph.tensors().size());
  for (const Op& op : graph.ops()) {
    for (const TensorIds* tensors : {&op.inputs, &op.outputs}) {
      for (const TensorId tensor : *tensors) {
        std::vector<int>& regions = reference.regions_of_tensor[static_cast<size_t>(tensor)];
        if (std::find(regions.begin(), regions.end(), op.region) == regions.end()) {
          regions.push_back(op.region);
        }
      }
    }
  }
  for (const Tensor& tensor : graph.tensors()) {
    if (tensor.dims.size() >= static_cast<size_t>(kMaxDims)) {
      return std::nullopt;  // positions would collide: no key
    }
    const std::string names = logical_names_key(tensor.dims);
    if (std::find(reference.group_names.begin(), reference.group_names.end(), names) ==
        reference.group_names.end()) {
      reference.group_names.push_back(names);
      reference.group_axes.push_back(rules.shard_dims_on_every_axis(tensor.dims));
    }
  }
  return reference;
}

BatchClasses::Member BatchClasses::join(const std::shared_ptr<const TrainingStep>& step,
                                        const std::vector<uint32_t>& atoms,
                                        const LogicalAxisRules& rules) {
  if (routes_experts(step->graph)) {
    return {};
  }
  for (size_t index = 0; index < references_.size(); ++index) {
    const Reference& reference = references_[index];
    if (reference.atoms == atoms && reference.rules == rules.rules() &&
        same_but_sizes(reference.step->graph, step->graph)) {
      return member_of(index, step->graph);
    }
  }
  // A new reference: it is its own class's origin (no dim differs from itself).
  std::optional<Reference> reference = new_reference(step, atoms, rules);
  if (!reference) {
    return {};
  }
  Member member;
  member.reference = static_cast<int64_t>(references_.size());
  references_.push_back(std::move(*reference));
  return member;
}

size_t BatchClasses::add_schedule(
    const std::vector<std::shared_ptr<const TrainingStep>>& none_steps,
    const std::vector<uint32_t>& atoms, const LogicalAxisRules& rules) {
  std::vector<Member> members;
  members.reserve(none_steps.size());
  for (const std::shared_ptr<const TrainingStep>& step : none_steps) {
    members.push_back(join(step, atoms, rules));
  }
  schedules_.push_back(std::move(members));
  return schedules_.size() - 1;
}

const BatchClasses::Member* BatchClasses::member_with_key(size_t schedule, size_t batch) const {
  if (schedule >= schedules_.size() || batch >= schedules_[schedule].size()) {
    return nullptr;
  }
  const Member& member = schedules_[schedule][batch];
  return member.reference < 0 ? nullptr : &member;
}

std::optional<int64_t> BatchClasses::differing_local_size(const Reference& reference,
                                                          const Varying& varying,
                                                          const MeshShape& mesh) const {
  const int64_t split = mesh.product_of(reference.group_axes[varying.group][varying.dim]);
  const int64_t local = (varying.size + split - 1) / split;
  if (local == (varying.reference_size + split - 1) / split) {
    return std::nullopt;
  }
  return local;
}

std::vector<std::vector<int64_t>> BatchClasses::region_keys(size_t schedule, const MeshShape& mesh,
                                                            size_t batch) const {
  std::vector<std::vector<int64_t>> keys;
  const Member* member = member_with_key(schedule, batch);
  if (member == nullptr) {
    return keys;
  }
  const Reference& reference = references_[static_cast<size_t>(member->reference)];
  keys.resize(reference.regions);
  for (size_t region = 0; region < reference.regions; ++region) {
    keys[region] = {member->reference, static_cast<int64_t>(region)};
  }
  for (const Varying& varying : member->varying) {
    const std::optional<int64_t> local = differing_local_size(reference, varying, mesh);
    if (!local) {
      continue;
    }
    for (const int region : reference.regions_of_tensor[varying.position / kMaxDims]) {
      keys[static_cast<size_t>(region)].push_back(varying.position);
      keys[static_cast<size_t>(region)].push_back(*local);
    }
  }
  return keys;
}

std::vector<int64_t> BatchClasses::key(size_t schedule, const MeshShape& mesh, size_t batch) const {
  std::vector<int64_t> key;
  const Member* member = member_with_key(schedule, batch);
  if (member == nullptr) {
    return key;
  }
  const Reference& reference = references_[static_cast<size_t>(member->reference)];
  key.push_back(member->reference);
  for (const Varying& varying : member->varying) {
    if (const std::optional<int64_t> local = differing_local_size(reference, varying, mesh)) {
      key.push_back(varying.position);
      key.push_back(*local);
    }
  }
  return key;
}

}  // namespace tpusim
