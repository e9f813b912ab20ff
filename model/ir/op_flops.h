// model/ir/op_flops.h: the floating-point work of one op, as the interpreters count it.
//
// Matmul FLOPs (MXU work) follow MaxText's convention so that the program's forward + backward
// matmul FLOPs equal calculate_tflops_training_per_device: an einsum costs 2 x the product of all
// distinct dim sizes of its two operands (a dropless MoE's grouped matmul x its routed_fraction:
// the B*S*k routed token-choices, not the rows of its buffer); causal attention counts half of
// the score matrix (PR #1988);
// a sliding window counts S*W - W^2/2 of S^2; an attention gradient costs 2 x its forward.
// use_iota_embed's one-hot embedding matmuls are MXU work MaxText's count leaves out:
// counted_by_maxtext() is false for them.
// Vector FLOPs (VPU work) are per-element estimates named below.
//
// Example:
//   einsum(x[batch:8,length:2048,embed:4096], w[embed:4096,mlp:14336]) -> 2*8*2048*4096*14336
#pragma once

#include "model/ir/graph.h"

namespace tpusim {

// VPU/EUP operations per attention score for the softmax: max, subtract, exp, sum, divide.
inline constexpr double kSoftmaxFlopsPerScore = 5.0;

struct OpFlops {
  double matmul = 0;  // MXU
  double vector = 0;  // VPU/EUP
};

OpFlops op_flops(const Graph& graph, const Op& op);

// False for the ops whose matmul FLOPs calculate_tflops_training_per_device does not count (the
// one-hot embedding lookup of use_iota_embed and its gradient).
inline bool counted_by_maxtext(const Op& op) {
  return !op.attrs.one_hot_embedding;
}

// Fraction of the Sq x Skv score matrix an attention op counts (MaxText convention).
double attention_mask_fraction(AttentionMask mask, int64_t length, int64_t window);

// An attention op (or its gradient) with compressed blocks (attrs.compress_ratio > 0, DeepSeek-V4)
// as the two attention ops whose work it does: its masked keys and sinks alone (`window`), and
// the blocks as keys and values of a causal attention (`blocks`: a query sees the blocks completed
// before it, about half of them; with CSA's selection, attrs.block_topk k, a sliding window of k
// over them). Counts and costs are the two parts' sum.
// Example: q[S], k[S], sinks, blocks[S/128] -> window (q, k, v, sinks), blocks (q, blocks, blocks).
struct CompressedAttentionParts {
  Op window;
  Op blocks;
};
CompressedAttentionParts compressed_attention_parts(const Op& op);

}  // namespace tpusim
