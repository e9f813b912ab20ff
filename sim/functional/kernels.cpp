// sim/functional/kernels.cpp: run_kernel(), which maps each compute op kind to the kernel of its
// family through one table. The kernels live in sim/functional/kernels/, one file per op family
// (einsum, elementwise, reduce_sum, norm, rope, attention, embedding, cross_entropy, moe,
// optimizer, layout, sinkhorn); what they share (the op's context Ctx, the conventions of every
// kernel) is sim/functional/kernels/context.h.
//
// Example: a new op kind gets its kernel by one line in the table,
//   {OpKind::kRope, run_rope},
// and a test case in tests/sim/functional/kernels_test.cpp (KernelCoverage fails without one).
#include "sim/functional/kernels.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim {
namespace {

using kernels::Ctx;

struct KernelEntry {
  OpKind kind;
  void (*run)(const Ctx& ctx);
};

// Every compute op kind and its kernel. Collectives are not here (the Communicator runs them).
constexpr std::array kKernels = {
    KernelEntry{OpKind::kEinsum, kernels::run_einsum},
    KernelEntry{OpKind::kElementwise, kernels::run_elementwise},
    KernelEntry{OpKind::kReduceSum, kernels::run_reduce_sum},
    KernelEntry{OpKind::kRmsNorm, kernels::run_rms_norm},
    KernelEntry{OpKind::kLayerNorm, kernels::run_layer_norm},
    KernelEntry{OpKind::kNormGrad, kernels::run_norm_grad},
    KernelEntry{OpKind::kNormStatistics, kernels::run_norm_statistics},
    KernelEntry{OpKind::kRope, kernels::run_rope},
    KernelEntry{OpKind::kAttention, kernels::run_attention},
    KernelEntry{OpKind::kAttentionGrad, kernels::run_attention_grad},
    KernelEntry{OpKind::kEmbeddingLookup, kernels::run_embedding_lookup},
    KernelEntry{OpKind::kEmbeddingGrad, kernels::run_embedding_grad},
    KernelEntry{OpKind::kCrossEntropy, kernels::run_cross_entropy},
    KernelEntry{OpKind::kCrossEntropyStatistics, kernels::run_cross_entropy_statistics},
    KernelEntry{OpKind::kCrossEntropyGrad, kernels::run_cross_entropy_grad},
    KernelEntry{OpKind::kMoeRouter, kernels::run_moe_router},
    KernelEntry{OpKind::kRouterGrad, kernels::run_router_grad},
    KernelEntry{OpKind::kMoeDispatch, kernels::run_moe_dispatch},
    KernelEntry{OpKind::kMoeCombine, kernels::run_moe_combine},
    KernelEntry{OpKind::kAdamUpdate, kernels::run_adam_update},
    KernelEntry{OpKind::kDynamicSlice, kernels::run_dynamic_slice},
    KernelEntry{OpKind::kHostOffload, kernels::run_copy},
    KernelEntry{OpKind::kHostLoad, kernels::run_copy},
    KernelEntry{OpKind::kSinkhorn, kernels::run_sinkhorn},
    KernelEntry{OpKind::kSinkhornGrad, kernels::run_sinkhorn_grad},
    KernelEntry{OpKind::kBlockPool, kernels::run_block_pool},
    KernelEntry{OpKind::kBlockPoolGrad, kernels::run_block_pool_grad},
    KernelEntry{OpKind::kBlockTopK, kernels::run_block_topk},
};

}  // namespace

std::vector<OpKind> kernels::kernel_op_kinds() {
  std::vector<OpKind> kinds;
  for (const KernelEntry& entry : kKernels) {
    kinds.push_back(entry.kind);
  }
  return kinds;
}

void run_kernel(const Graph& graph, const Op& op, const std::vector<const TensorData*>& inputs,
                const std::vector<TensorData*>& outputs, const DeviceContext& device) {
  const auto entry =
      std::find_if(kKernels.begin(), kKernels.end(),
                   [&](const KernelEntry& candidate) { return candidate.kind == op.kind; });
  if (entry == kKernels.end()) {
    throw std::logic_error(std::string("not a compute op: ") + op_kind_name(op.kind) + " '" +
                           op.name + "'");
  }
  const Ctx ctx(graph, op, inputs, outputs, device);
  ctx.check_shapes();
  entry->run(ctx);
}

}  // namespace tpusim
