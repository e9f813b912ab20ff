#include "model/ir/op_kind_traits.h"
#include "sharding/partitioner_internal.h"

namespace tpusim::partitioner_internal {

TensorId Partitioner::pipeline_hand_over(const Graph::Carry& carry) {
  const Tensor& from = global_.tensor(carry.from);
  const Region& region = global_.region(from.region);
  const TensorId source = local(carry.from);
  if (!region.pipelined() || global_.tensor(carry.to).region != from.region) {
    return source;
  }
  const Tensor& local_from = out_.tensor(source);
  const TensorId moved =
      out_.add_tensor(local_from.name + "/stage_permute", local_from.dims, local_from.dtype,
                      local_from.kind, from.region, local_from.remat_name);
  OpAttrs attrs;
  attrs.mesh_axes = {"stage"};
  attrs.group_size = mesh_.shape.size("stage");
  attrs.every = region.pipeline.layers_per_stage;
  current_phase_ = region.phase;
  // Forward: the stage output to the next stage, the input stream toward stage 0, the last
  // stage's output to stage 0's storage; the backward loop sends their gradients back.
  const int64_t forward = region.phase == Phase::kForward ? 1 : -1;
  attrs.ring_shift = forward;
  add_op(OpKind::kCollectivePermute, local_from.name, "/stage_permute", {source}, {moved}, attrs,
         from.region);
  std::vector<std::pair<std::string, int64_t>> side = {{"/stream_permute", -forward}};
  if (region.pipeline.circular_storage) {
    side.emplace_back("/storage_permute", forward);
  }
  for (const auto& [suffix, shift] : side) {
    const TensorId buffer = out_.add_tensor(local_from.name + suffix, local_from.dims,
                                            local_from.dtype, TensorKind::kActivation, from.region);
    attrs.ring_shift = shift;
    add_op(OpKind::kCollectivePermute, local_from.name, suffix, {source}, {buffer}, attrs,
           from.region);
  }
  return region.pipeline.delayed_forwarding ? source : moved;
}

void Partitioner::gather_pipeline_weights_once() {
  auto from_parameter = [&](TensorId id) {
    if (out_.tensor(id).kind == TensorKind::kParameter) {
      return true;
    }
    const int producer = out_.producer(id);
    return producer >= 0 &&
           out_.ops()[static_cast<size_t>(producer)].kind == OpKind::kElementwise &&
           out_.tensor(out_.ops()[static_cast<size_t>(producer)].inputs[0]).kind ==
               TensorKind::kParameter;  // its cast to dtype
  };
  for (const Op& op : out_.ops()) {
    const Region& region = out_.region(op.region);
    if (!region.pipelined() || !region.pipeline.weights_gathered_once) {
      continue;
    }
    const bool gather = op.kind == OpKind::kAllGather && from_parameter(op.inputs[0]);
    const bool reduction = is_reducing_collective(op.kind) &&
                           out_.tensor(op.outputs[0]).kind == TensorKind::kParameterGrad;
    if (gather || reduction) {
      out_.mutable_op(op.id).attrs.iteration_share =
          static_cast<double>(region.parameter_sets()) / static_cast<double>(region.repeat);
    }
  }
}

}  // namespace tpusim::partitioner_internal
