#include "sharding/partitioner_internal.h"

namespace tpusim::partitioner_internal {

void Partitioner::size_dropless_buffers() {
  for (const Op& op : global_.ops()) {
    if (op.kind != OpKind::kMoeDispatch || op.outputs.size() != 2) {
      continue;
    }
    decisions_.resizable = false;  // the buffers are sized from the tokens (not recorded)
    const Tensor& grouped = global_.tensor(op.outputs[0]);
    const Tensor& routing = global_.tensor(op.inputs[1]);
    const Layout& grouped_layout = layout(op.outputs[0]);
    const auto experts_dim = static_cast<size_t>(grouped.dim_index("experts"));
    const auto token_dim = static_cast<size_t>(grouped.dim_index("expert_tokens"));
    const int64_t experts = grouped.dims[experts_dim].size;
    const int64_t expert_shards = shards(grouped_layout[experts_dim]);
    if (experts % expert_shards != 0) {
      throw UserError("num_experts: " + std::to_string(experts) +
                      " experts do not split evenly over " + std::to_string(expert_shards) +
                      " expert-parallel shards (dropless MoE needs whole experts per shard)");
    }
    const int64_t local_experts = experts / expert_shards;
    int64_t local_tokens = 1;
    int64_t top_k = 1;
    double routed = 1;  // token choices of the whole batch
    for (size_t dim = 0; dim < routing.dims.size(); ++dim) {
      const Dim& info = routing.dims[dim];
      if (info.name == "route") {
        continue;
      }
      routed *= static_cast<double>(info.size);
      if (info.name == "top_k") {
        top_k = info.size;
        continue;
      }
      const int64_t split = shards(layout(op.inputs[1])[dim]);
      local_tokens *= (info.size + split - 1) / split;
    }
    int64_t per_block = local_tokens * std::min(local_experts, top_k);
    const double factor = op.attrs.ragged_buffer_factor;
    const bool bounded = factor > 0 && expert_shards > 1;
    if (bounded) {
      // ragged_buffer_factor: a multiple of the balanced share, dropping what exceeds it.
      const double balanced =
          static_cast<double>(local_tokens * top_k) / static_cast<double>(expert_shards);
      per_block = std::min(per_block, static_cast<int64_t>(std::ceil(factor * balanced)));
    }
    const int64_t local_rows = (per_block + local_experts - 1) / local_experts;
    const int64_t token_shards = shards(grouped_layout[token_dim]) * expert_shards;
    const int64_t built = grouped.dims[token_dim].size;
    const int64_t needed = local_rows * token_shards;
    dropless_expert_tokens_ = bounded ? needed : std::max(built, needed);
    // A bounded buffer smaller than the balanced rows is full (the rest is dropped).
    dropless_fraction_ = std::min(
        1.0, routed / static_cast<double>(experts) / static_cast<double>(dropless_expert_tokens_));
  }
}

Layout Partitioner::tokens_local_layout(TensorId tensor, const AxisList& expert_axes) const {
  const Tensor& info = global_.tensor(tensor);
  Layout result = layout(tensor);
  const int experts_dim = info.dim_index("experts");
  const int token_dim = info.dim_index("expert_tokens");
  if (experts_dim >= 0 && token_dim >= 0) {
    result[static_cast<size_t>(experts_dim)].clear();
    for (const int axis : expert_axes) {
      result[static_cast<size_t>(token_dim)].push_back(axis);
    }
  }
  return normalized(result);
}

TensorId Partitioner::exchange(TensorId value, const Tensor& global, const Layout& result,
                               const AxisList& expert_axes, int region, bool ragged,
                               TensorId into) {
  const TensorId output = collective(OpKind::kAllToAll, "/all_to_all", value, global, result,
                                     expert_axes, region, ReduceOp::kSum, into);
  if (ragged) {
    out_.mutable_op(out_.producer(output)).attrs.routed_fraction = dropless_fraction_;
  }
  return output;
}

void Partitioner::partition_moe_exchange(const Op& global_op, size_t grouped_input) {
  decisions_.resizable = false;  // routed fractions and capacities follow the tokens
  Op op = global_op;
  const bool dispatch = op.kind == OpKind::kMoeDispatch;
  const bool ragged = op.attrs.capacity_factor <= 0;
  const TensorId grouped_out = op.outputs[0];
  // Dispatch: tokens -> grouped; combine: grouped -> tokens. Let the grouped side be G.
  const TensorId grouped = dispatch ? grouped_out : op.inputs[grouped_input];
  const Tensor& grouped_tensor = global_.tensor(grouped);
  const int experts_dim = grouped_tensor.dim_index("experts");
  const AxisList expert_axes =
      experts_dim < 0 ? AxisList{} : layout(grouped)[static_cast<size_t>(experts_dim)];
  op.attrs.expert_shards = shards(expert_axes);
  // Compute with the expert axes on the token dim of the grouped tensor (tokens stay where they
  // are), then all-to-all them onto the experts dim.
  const Layout local_grouped = tokens_local_layout(grouped, expert_axes);
  if (dispatch) {
    TensorIds inputs;
    for (const TensorId input : op.inputs) {
      inputs.push_back(reshard(input, layout(input), op.region));
    }
    // An output already in its own layout (no expert parallelism: the experts dim is unsharded)
    // is written in place: MaxText's permute feeds its sorted rows straight to the grouped matmul,
    // and XLA emits no copy between them.
    TensorIds computed;
    for (const TensorId output : op.outputs) {
      const Layout computed_layout = tokens_local_layout(output, expert_axes);
      computed.push_back(
          computed_layout == layout(output)
              ? local(output)
              : make_local(global_.tensor(output), computed_layout, op.region, "/local"));
    }
    add_op(op.kind, op.name, "", inputs, computed, op.attrs, op.region);
    for (size_t index = 0; index < op.outputs.size(); ++index) {
      const TensorId output = op.outputs[index];
      if (computed[index] == local(output)) {
        continue;
      }
      const Tensor& output_tensor = global_.tensor(output);
      if (!expert_axes.empty()) {
        exchange(computed[index], output_tensor, layout(output), expert_axes, op.region, ragged,
                 local(output));
      } else {
        add_op(OpKind::kDynamicSlice, output_tensor.name, "/slice", {computed[index]},
               {local(output)}, {}, op.region);
      }
    }
    return;
  }
  TensorId value = local(grouped);
  if (!expert_axes.empty()) {
    value = exchange(value, grouped_tensor, local_grouped, expert_axes, op.region, ragged);
  }
  TensorIds inputs;
  for (size_t index = 0; index < op.inputs.size(); ++index) {
    inputs.push_back(index == grouped_input
                         ? value
                         : reshard(op.inputs[index], layout(op.inputs[index]), op.region));
  }
  // The routing-weight gradient sums d_combined x expert_out over embed: partial over the axes
  // that split it.
  const AxisList partial = op.kind == OpKind::kRouterGrad
                               ? summed_axes(op.inputs[0], layout(op.inputs[0]), op.outputs[0])
                               : AxisList{};
  emit(op, inputs, {layout(op.outputs[0])}, partial);
}

}  // namespace tpusim::partitioner_internal
