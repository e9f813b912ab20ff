#include "sharding/partitioner_internal.h"

namespace tpusim::partitioner_internal {

void Partitioner::partition_reduction(const Op& op, const std::string& reduced_dim,
                                      OpKind statistics_kind, int statistics_values,
                                      ReduceOp reduce) {
  const TensorId input = op.inputs[0];
  const Tensor& tensor = global_.tensor(input);
  const int dim_index = tensor.dim_index(reduced_dim);
  const AxisList split = dim_index < 0 ? AxisList{} : layout(input)[static_cast<size_t>(dim_index)];
  if (split.empty()) {
    partition_following_output(op);
    return;
  }
  const AxesByName reference = by_name(input, layout(input));
  TensorIds inputs;
  for (const TensorId operand : op.inputs) {
    inputs.push_back(reshard(operand, follow(operand, reference), op.region));
  }
  // Statistics tensor: the input's dims without the reduced one, plus the values per row.
  std::vector<Dim> stat_dims;
  for (const Dim& dim : tensor.dims) {
    if (dim.name != reduced_dim) {
      stat_dims.push_back(dim);
    }
  }
  stat_dims.emplace_back("statistics", statistics_values, "");
  const TensorId global_stats = extra_.add_tensor(joined(op.name, "/statistics"), stat_dims,
                                                  DType::kF32, TensorKind::kActivation, op.region);
  Layout stat_layout;
  for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
    if (static_cast<int>(dim) != dim_index) {
      stat_layout.push_back(layout(input)[dim]);
    }
  }
  stat_layout.push_back({});
  const Tensor& stats_info = extra_.tensor(global_stats);
  const TensorId partial = make_local(stats_info, stat_layout, op.region, "/partial");
  OpAttrs stat_attrs;
  stat_attrs.contracted = {reduced_dim};
  // Cross-entropy statistics read the logits through the loss's transform (soft cap).
  stat_attrs.logit_soft_cap = op.attrs.logit_soft_cap;
  stat_attrs.logit_multiplier = op.attrs.logit_multiplier;
  add_op(statistics_kind, op.name, "/statistics", inputs, {partial}, stat_attrs, op.region);
  const TensorId full = collective(OpKind::kAllReduce, "/all_reduce", partial, stats_info,
                                   stat_layout, split, op.region, reduce);
  inputs.push_back(full);
  Layouts computed;
  AxisLists partials;
  for (const TensorId output : op.outputs) {
    computed.push_back(follow(output, reference));
    partials.push_back(op.kind == OpKind::kNormGrad && output != op.outputs[0]
                           ? summed_axes(input, layout(input), output)
                           : AxisList{});
  }
  emit_with_partials(op, inputs, computed, partials);
}

}  // namespace tpusim::partitioner_internal
