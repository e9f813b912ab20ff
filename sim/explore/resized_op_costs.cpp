#include "sim/explore/resized_op_costs.h"

#include <algorithm>
#include <stdexcept>

#include "model/ir/op_kind_traits.h"

namespace tpusim {
namespace {

void sort_unique(auto& values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
}

}  // namespace

ResizedOpCosts::ResizedOpCosts(const ResizableProgram& program, size_t kept_per_group)
    : kept_per_group_(kept_per_group) {
  const Graph& graph = program.graph();
  std::vector<TensorId> tensors;
  std::vector<uint32_t> sets;
  for (const Op& op : graph.ops()) {
    if (!is_compute(op.kind)) {
      continue;
    }
    tensors.clear();
    tensors_cost_reads(graph, op, tensors);
    sort_unique(tensors);
    sets.clear();
    for (const TensorId tensor : tensors) {
      program.split_sets_of(tensor, sets);
    }
    sort_unique(sets);
    auto group = std::find_if(groups_.begin(), groups_.end(),
                              [&](const Group& other) { return other.sets == sets; });
    if (group == groups_.end()) {
      group = groups_.emplace(groups_.end());
      group->sets = sets;
    }
    OpPlace& place = places_.emplace_back();
    place.op = op.id;
    place.group = static_cast<uint32_t>(group - groups_.begin());
    place.index = static_cast<uint32_t>(group->ops++);
    place.attention = op_kind_traits(op.kind).attention;
    place.attention_before = static_cast<uint32_t>(group->attention_ops);
    group->attention_ops += place.attention ? 1 : 0;
    place.tensors_begin = static_cast<uint32_t>(tensors_.size());
    tensors_.insert(tensors_.end(), tensors.begin(), tensors.end());
    place.tensors_end = static_cast<uint32_t>(tensors_.size());
  }
}

std::optional<ComputeBounds> ResizedOpCosts::bounds(ResizableProgram& program,
                                                    const MeshShape& mesh,
                                                    int64_t accumulation_steps,
                                                    const std::vector<CostContext>& contexts) {
  program.splits_on(mesh, splits_);
  if (!program.holds_on(mesh, splits_)) {
    return std::nullopt;
  }
  if (contexts != contexts_) {  // costs are kept for one list of contexts
    contexts_ = contexts;
    for (Group& group : groups_) {
      group.kept.clear();
    }
  }
  ++calls_;
  next_place_ = 0;
  for (Group& group : groups_) {
    meet(group);
  }
  ComputeBounds result = tensorcore_lower_bounds(
      program.graph(), accumulation_steps, contexts.size(), /*keep_forward_ops=*/true,
      [&](const Op& op, double* seconds) { seconds_of(program, op, seconds); },
      forward_like_.has_value() ? &*forward_like_ : nullptr);
  for (Group& group : groups_) {
    group.kept[group.current].complete = true;
  }
  if (!forward_like_.has_value()) {
    forward_like_ = result.forward_ops;  // the same ops, named alike, on every mesh
  }
  return result;
}

void ResizedOpCosts::meet(Group& group) {
  products_.clear();
  for (const uint32_t set : group.sets) {
    products_.push_back(splits_[set]);
  }
  for (size_t at = 0; at < group.kept.size(); ++at) {
    Kept& kept = group.kept[at];
    if (kept.complete && kept.products == products_) {
      kept.last_met = calls_;
      group.current = at;
      return;
    }
  }
  if (group.kept.size() < kept_per_group_) {
    group.kept.emplace_back();
    group.current = group.kept.size() - 1;
  } else {
    const auto oldest =
        std::min_element(group.kept.begin(), group.kept.end(),
                         [](const Kept& a, const Kept& b) { return a.last_met < b.last_met; });
    group.current = static_cast<size_t>(oldest - group.kept.begin());
  }
  Kept& kept = group.kept[group.current];
  kept.products = products_;
  kept.seconds.assign(group.ops + group.attention_ops * (contexts_.size() - 1), 0.0);
  kept.last_met = calls_;
  kept.complete = false;
}

void ResizedOpCosts::seconds_of(ResizableProgram& program, const Op& op, double* seconds) {
  const size_t contexts = contexts_.size();
  // tensorcore_lower_bounds asks for the compute ops in program order.
  if (next_place_ >= places_.size() || places_[next_place_].op != op.id) {
    throw std::logic_error("ResizedOpCosts: asked for the ops out of program order");
  }
  const OpPlace& place = places_[next_place_++];
  Group& group = groups_[place.group];
  Kept& current = group.kept[group.current];
  double* kept = current.seconds.data() + place.index +
                 static_cast<size_t>(place.attention_before) * (contexts - 1);
  const size_t width = place.attention ? contexts : 1;
  if (current.complete) {  // met complete (meet); a row being costed completes after the call
    std::copy_n(kept, width, seconds);
    std::fill(seconds + width, seconds + contexts, *kept);  // the others': the same in every one
    ++found_;
    return;
  }
  for (uint32_t at = place.tensors_begin; at < place.tensors_end; ++at) {
    program.resize_tensor(tensors_[at], splits_);
  }
  compute_op_seconds(program.graph(), op, contexts_, seconds);
  std::copy_n(seconds, width, kept);
  ++costed_;
}

}  // namespace tpusim
