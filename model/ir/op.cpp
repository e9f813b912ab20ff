#include "model/ir/op.h"

namespace tpusim {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kEinsum:
      return "einsum";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kRmsNorm:
      return "rms_norm";
    case OpKind::kLayerNorm:
      return "layer_norm";
    case OpKind::kRope:
      return "rope";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kEmbeddingLookup:
      return "embedding_lookup";
    case OpKind::kCrossEntropy:
      return "cross_entropy";
    case OpKind::kMoeRouter:
      return "moe_router";
    case OpKind::kMoeDispatch:
      return "moe_dispatch";
    case OpKind::kMoeCombine:
      return "moe_combine";
    case OpKind::kNormGrad:
      return "norm_grad";
    case OpKind::kAttentionGrad:
      return "attention_grad";
    case OpKind::kEmbeddingGrad:
      return "embedding_grad";
    case OpKind::kCrossEntropyGrad:
      return "cross_entropy_grad";
    case OpKind::kRouterGrad:
      return "router_grad";
    case OpKind::kReduceSum:
      return "reduce_sum";
    case OpKind::kNormStatistics:
      return "norm_statistics";
    case OpKind::kCrossEntropyStatistics:
      return "cross_entropy_statistics";
    case OpKind::kDynamicSlice:
      return "dynamic_slice";
    case OpKind::kAdamUpdate:
      return "adam_update";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kCollectivePermute:
      return "collective_permute";
    case OpKind::kHostOffload:
      return "host_offload";
    case OpKind::kHostLoad:
      return "host_load";
  }
  return "?";
}

bool is_collective(OpKind kind) {
  return kind == OpKind::kAllGather || kind == OpKind::kReduceScatter ||
         kind == OpKind::kAllReduce || kind == OpKind::kAllToAll ||
         kind == OpKind::kCollectivePermute;
}

const char* elementwise_name(ElementwiseFn fn) {
  switch (fn) {
    case ElementwiseFn::kAdd:
      return "add";
    case ElementwiseFn::kMul:
      return "mul";
    case ElementwiseFn::kSilu:
      return "silu";
    case ElementwiseFn::kGelu:
      return "gelu";
    case ElementwiseFn::kRelu:
      return "relu";
    case ElementwiseFn::kSigmoid:
      return "sigmoid";
    case ElementwiseFn::kScale:
      return "scale";
    case ElementwiseFn::kCast:
      return "cast";
    case ElementwiseFn::kReshape:
      return "reshape";
    case ElementwiseFn::kSiluGrad:
      return "silu_grad";
    case ElementwiseFn::kGeluGrad:
      return "gelu_grad";
    case ElementwiseFn::kReluGrad:
      return "relu_grad";
    case ElementwiseFn::kSigmoidGrad:
      return "sigmoid_grad";
  }
  return "?";
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "fwd";
    case Phase::kBackward:
      return "bwd";
    case Phase::kRecompute:
      return "remat";
    case Phase::kOptimizer:
      return "opt";
  }
  return "?";
}

}  // namespace tpusim
