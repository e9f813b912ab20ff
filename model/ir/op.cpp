#include "model/ir/op.h"

#include "model/ir/op_kind_traits.h"

namespace tpusim {

const char* op_kind_name(OpKind kind) {
  // "?" for a value past the last kind (tests walk the kinds until they see it).
  return static_cast<size_t>(kind) < kOpKindCount ? op_kind_traits(kind).name : "?";
}

bool is_collective(OpKind kind) {
  return op_kind_traits(kind).collective != Collective::kNone;
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
