// sim/functional/kernels/families.h: the entry point of every kernel of the functional engine,
// one per op kind (or per form of one), grouped by the file of the op family that implements it.
//
// run_kernel() (sim/functional/kernels.cpp) maps each compute OpKind to one of these through one
// table; each entry point checks its input/output counts and shapes, then computes. The semantics
// of each op are documented at the top of its family's file.
//
// Example:
//   run_rope(Ctx(graph, op, inputs, outputs, device));   // what run_kernel does for kRope
#pragma once

#include <vector>

#include "model/ir/op.h"

namespace tpusim::kernels {

class Ctx;

// einsum.cpp: dense and grouped (dropless MoE) contractions.
void run_einsum(const Ctx& ctx);
// elementwise.cpp: activations, add/mul and their gradients.
void run_elementwise(const Ctx& ctx);
// reduce_sum.cpp: sums over the dims the output lacks.
void run_reduce_sum(const Ctx& ctx);
// norm.cpp: RMSNorm and LayerNorm, their statistics over a split dim, and their VJP.
void run_rms_norm(const Ctx& ctx);
void run_layer_norm(const Ctx& ctx);
void run_norm_statistics(const Ctx& ctx);
void run_norm_grad(const Ctx& ctx);
// rope.cpp: rotary position embedding and its VJP.
void run_rope(const Ctx& ctx);
// attention.cpp: fused attention and its VJP.
void run_attention(const Ctx& ctx);
void run_attention_grad(const Ctx& ctx);
// embedding.cpp: table lookup and its scatter-add VJP.
void run_embedding_lookup(const Ctx& ctx);
void run_embedding_grad(const Ctx& ctx);
// cross_entropy.cpp: the loss, its statistics over a split vocab, and its VJP.
void run_cross_entropy(const Ctx& ctx);
void run_cross_entropy_statistics(const Ctx& ctx);
void run_cross_entropy_grad(const Ctx& ctx);
// moe.cpp: router, dispatch, combine and the router's VJP.
void run_moe_router(const Ctx& ctx);
void run_router_grad(const Ctx& ctx);
void run_moe_dispatch(const Ctx& ctx);
void run_moe_combine(const Ctx& ctx);
// block_pool.cpp: DeepSeek-V4's compressors' softmax-gated pooling and its VJP.
void run_block_pool(const Ctx& ctx);
void run_block_pool_grad(const Ctx& ctx);
// block_topk.cpp: the CSA indexer's selection of each query's top-k complete blocks.
void run_block_topk(const Ctx& ctx);
// optimizer.cpp: the AdamW update.
void run_adam_update(const Ctx& ctx);
// layout.cpp: dynamic slice, and the copy of host offload/load.
void run_dynamic_slice(const Ctx& ctx);
void run_copy(const Ctx& ctx);
// sinkhorn.cpp: mHC's Sinkhorn normalization and its VJP.
void run_sinkhorn(const Ctx& ctx);
void run_sinkhorn_grad(const Ctx& ctx);

// The op kinds run_kernel() executes (the keys of its table, in table order): what the kernel
// tests must each cover (tests/sim/functional/kernels_test.cpp).
std::vector<OpKind> kernel_op_kinds();

}  // namespace tpusim::kernels
