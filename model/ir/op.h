// model/ir/op.h: one operation of the training-step graph.
//
// Ops read and write tensors by id. Einsums name the dims they contract, so the graph reads like
// Haliax: einsum(x[batch,length,embed], w[embed,mlp]) contracting {embed} -> h[batch,length,mlp].
// Backward ops are ops too (autodiff emits each op's vector-Jacobian product as ops), and so are
// collectives once the partitioner has run.
//
// Dropless MoE (capacity_factor <= 0, MaxText's sparse_matmul / megablox) groups tokens RAGGED:
// moe_dispatch writes the routed token-choices sorted by expert into the rows of
// grouped[experts, expert_tokens, ...] (read row-major as one buffer, one block per expert-
// parallel shard) and, as a second output, row_experts[experts, expert_tokens] = the expert of
// each row (-1: an empty row). An einsum with row_experts as a third input is a grouped matmul:
// each row meets the weights of ITS expert, not of its position in the experts dim.
//   einsum(grouped[experts,expert_tokens,embed], w[experts,embed,mlp], row_experts)
//       -> h[experts,expert_tokens,mlp]   (a row of expert e: h = x w[e])
//   einsum(dh[...,mlp], grouped[...,embed], row_experts) contract {expert_tokens}
//       -> dw[experts,embed,mlp]           (dw[e] sums the rows of expert e)
// Its routed_fraction counts only the rows routing fills when it is balanced, as megablox
// computes only routed rows and MaxText's FLOP formula counts B*S*k tokens.
#pragma once

#include <string>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "model/ir/tensor.h"

namespace tpusim {

enum class OpKind {
  kEinsum,           // contracts attrs.contracted dims; every other dim passes through
  kElementwise,      // attrs.function over inputs of the output's shape (broadcast by dim name);
                     // kReshape: one input, the same elements under other dims
  kRmsNorm,          // x, scale -> y (over attrs.reduced dims)
  kLayerNorm,        // x, scale, bias -> y
  kRope,             // rotary position embedding on head_dim (attrs.reverse_rotation: undone)
  kAttention,        // q, k, v[, k_rope][, sinks][, blocks] -> out (fused softmax(q k^T) v)
  kEmbeddingLookup,  // tokens, table -> x
  kCrossEntropy,     // logits, targets -> loss (mean over tokens)
  kMoeRouter,        // router logits -> top-k weights and expert assignment
  kMoeDispatch,      // tokens, routing -> expert-grouped tokens[, row_experts (dropless)]
  kMoeCombine,       // expert outputs, weights -> tokens
  // Backward-only kinds (vector-Jacobian products that are not einsums or elementwise).
  kNormGrad,          // d(norm) for RMSNorm/LayerNorm: dy, x, scale -> dx (and dscale)
  kAttentionGrad,     // dout, q, k, v, out -> dq, dk, dv
  kEmbeddingGrad,     // dx, tokens -> dtable (scatter-add)
  kCrossEntropyGrad,  // logits, targets -> dlogits
  kRouterGrad,        // d(router weights) -> d(router logits)
  kReduceSum,         // sums attrs.contracted dims (bias and scale gradients)
  // Partial statistics of a reduction over a dim split across devices (inserted by the
  // partitioner before the all-reduce that completes them).
  kNormStatistics,          // x -> per-row sum of squares (and sum, for LayerNorm)
  kCrossEntropyStatistics,  // logits, targets -> per-token max, sum of exp, target logit
  kDynamicSlice,            // keeps this device's part of a replicated dim (no communication)
  // Optimizer.
  kAdamUpdate,  // param, grad, mu, nu -> param', mu', nu'
  // Collectives, inserted by the partitioner.
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kCollectivePermute,
  // Host offload (remat policy "offload").
  kHostOffload,
  kHostLoad,
  // DeepSeek-V4's mHC residual mixing (sim/functional/kernels/sinkhorn.cpp): logits -> the
  // doubly stochastic matrix over their last two dims (attrs.sinkhorn_iterations, epsilon).
  kSinkhorn,
  kSinkhornGrad,  // dy, logits -> dlogits (recomputes the iterations, then their VJP)
  // DeepSeek-V4's compressors: kv, gate, bias -> each block's softmax(gate + bias)-weighted sum
  // of kv over attrs.contracted (the positions in a block), and its VJP dy, kv, gate, bias ->
  // dkv, dgate, dbias.
  kBlockPool,
  kBlockPoolGrad,
  // DeepSeek-V4's CSA indexer (sim/functional/kernels/block_topk.cpp): scores [batch, length,
  // blocks] -> a 0/1 selection of each query's attrs.block_topk best causally visible blocks
  // (attrs.compress_ratio tokens each; jax.lax.top_k's order). Its output gets no gradient.
  kBlockTopK,
};

const char* op_kind_name(OpKind kind);
bool is_collective(OpKind kind);

enum class ElementwiseFn {
  kAdd,
  kMul,
  kSilu,
  kGelu,
  kRelu,
  kSigmoid,
  kScale,
  kCast,
  // The same elements under other dims (row-major, one input): splits or merges dims, e.g.
  // x[batch, length, embed] -> x[batch, gdn_chunks, gdn_chunk, embed] with length = chunks x
  // chunk. Its VJP is the reshape back.
  kReshape,
  kSiluGrad,
  kGeluGrad,
  kReluGrad,
  kSigmoidGrad
};

const char* elementwise_name(ElementwiseFn fn);

// Which part of the step an op belongs to.
enum class Phase { kForward, kBackward, kRecompute, kOptimizer };

const char* phase_name(Phase phase);

// kCausal: key j <= query p; kSlidingWindow: also p - j < window; kChunked: causal within chunks
// of `window` tokens (j / window == p / window, llama4); kNone: every key.
enum class AttentionMask { kCausal, kSlidingWindow, kChunked, kNone };

// How a reducing collective combines values: sums, or the (max, sum of exp) pairs of a softmax
// split over devices.
enum class ReduceOp { kSum, kLogSumExp };

struct OpAttrs {
  std::vector<std::string> contracted;  // einsum / reduce: dim names summed over
  ElementwiseFn function = ElementwiseFn::kAdd;
  AttentionMask mask = AttentionMask::kCausal;
  int64_t window = 0;          // sliding window size
  int64_t top_k = 0;           // MoE router
  double capacity_factor = 0;  // MoE dispatch (<= 0: dropless)
  // Dropless MoE dispatch/combine/routing gradient: the expert-parallel shards the grouped buffer
  // is exchanged over (one block of rows per shard's experts).
  int64_t expert_shards = 1;
  // Dropless MoE under expert parallelism: > 0 bounds each block at this x its balanced rows and
  // drops the choices beyond it (MaxText ragged_buffer_factor); <= 0: the worst case, no drops.
  double ragged_buffer_factor = 0;
  // Grouped matmuls (einsums with row_experts) and the all-to-alls of ragged buffers: the
  // fraction of the rows routing fills when balanced. FLOPs, costs and collective bytes count
  // that fraction (megablox multiplies only routed rows; a ragged all-to-all moves only them).
  double routed_fraction = 1;
  std::vector<std::string> mesh_axes;  // collectives: the mesh axes they span
  int64_t group_size = 1;              // collectives: devices in each group
  ReduceOp reduce = ReduceOp::kSum;    // all-reduce / reduce-scatter combination
  double epsilon = 1e-6;               // norms: added to the variance
  double rope_max_timescale = 10000;   // rope: the longest wavelength (MaxText rope_max_timescale)
  // Rope: rotate by -angle (DeepSeek-V4 undoes the values' rotation on the attention output).
  bool reverse_rotation = false;
  // Embedding lookup and its gradient: MaxText's use_iota_embed, the lookup as a one-hot matmul
  // on the MXU (one_hot(tokens, vocab) . table; the gradient one_hot^T . dy), 2.T.V.D FLOPs each,
  // the same values as the gather.
  bool one_hot_embedding = false;
  // MoE router: the top-k weights renormalized to sum to 1 (MaxText's norm_topk_prob), then
  // multiplied by route_scale (routed_scaling_factor).
  bool normalize_top_k = false;
  double route_scale = 1;
  // MoE router: hash routing (DeepSeek-V4's first first_num_hash_layers layers): each token's
  // top_k choices come from MaxText's tid2eid table at its token id instead of the top-k of the
  // scores. That table is all zeros from initialization (nothing trains it), so every choice is
  // expert 0; the weights still come from the chosen scores.
  bool hash_routing = false;
  // MoE router: the experts' scores are sqrt(softplus(logit)) instead of the logits (MaxText's
  // routed_score_func "sqrtsoftplus", DeepSeek-V4): the top-k and the softmax over the chosen
  // take those scores. Same cost as the logits' pass (the router op is one VPU pass).
  bool sqrt_softplus_scores = false;
  // The SwiGLU of deepseek's routed experts clipped at MaxText's mlp_activations_limit L (> 0;
  // 0 = no clip): kSilu(x) = silu(min(x, L)); kMul(a, b) = a clip(b, -L, L) (b: the up
  // projection). Their VJPs carry it: kSiluGrad(dy, x) = dy silu'(x) [x < L]; kMul(dy, b) =
  // dy clip(b, -L, L); kMul(dy, a, b) = dy a [|b| < L] (the up projection's gradient).
  double activation_limit = 0;
  // Attention: multiplies the logits q.k. MaxText's default Attention uses 1 (its query kernel's
  // initializer carries 1/sqrt(head_dim)); see model/builder/initializers.h for each family.
  double attention_scale = 1;
  // Attention: soft-caps the scaled logits s to cap tanh(s / cap) before the mask and softmax
  // (MaxText's attn_logits_soft_cap); 0 = off. Cross-entropy (its statistics and gradient): the
  // logits x it reads are first transformed to z = cap tanh(m x / cap), or z = m x when the cap is
  // 0, with m = logit_multiplier (MaxText's tied output head: normalize_embedding_logits and
  // final_logits_soft_cap), as XLA fuses them into the loss.
  double logit_soft_cap = 0;
  double logit_multiplier = 1;
  // Cross-entropy (and its gradient): the loss is the mean over `token_chunks` x the op's tokens;
  // > 1 when the head runs once per chunk of the tokens (num_vocab_tiling), each iteration of its
  // region adding its chunk's share.
  int64_t token_chunks = 1;
  // The op runs once every `every` iterations of its region (after iterations every-1,
  // 2 every-1, ...): a pipeline stage's hand-over after its layers_per_stage layers. Counts and
  // costs take repeat / every runs.
  int64_t every = 1;
  // The op runs in this share of its region's iterations, wherever they fall (a pipeline stage's
  // weight gathers under pipeline_fsdp_ag_once: once per layer it holds, not per iteration).
  double iteration_share = 1;
  // A collective permute around its group's ring (a pipeline's hand-over over `stage`): member p
  // receives the input of member p - ring_shift (mod the group). 0: a permute between layouts.
  int64_t ring_shift = 0;
  // MoE router with MaxText's load-balance loss (load_balance_loss_weight w > 0): c = w E /
  // (B S^2 L) for E experts, B sequences of S tokens, L routed layers. kMoeRouter's second and
  // third outputs are c x softmax(scores + bias) and the one-hot choices per token; kRouterGrad
  // adds c x count[b, e] (the choices of expert e in sequence b, an extra input) to d softmax.
  double load_balance_scale = 0;
  // Sinkhorn (mHC's residual matrix): the row-then-column normalizations after the first softmax
  // and column pass (MaxText mhc.py sinkhorn_iterations); its epsilon is `epsilon` above.
  int64_t sinkhorn_iterations = 0;
  // Attention with compressed blocks (DeepSeek-V4's HCA, compress_ratio r > 0): one more input,
  // the pooled blocks of r tokens, joins the keys and values of one softmax (with the window's
  // keys and the sinks); block c is visible to query position p when c < (p + 1) / r.
  int64_t compress_ratio = 0;
  // Rope: the position of global index i along "length" is i x this (DeepSeek-V4's compressed
  // blocks of r tokens rotate at their first token's position, c r).
  int64_t rope_position_stride = 1;
  // DeepSeek-V4's CSA (compress_ratio 4). kAttention with blocks: > 0 adds a last input, the
  // indexer's 0/1 selection [batch, length, blocks] (kBlockTopK's k), which masks the blocks
  // further and gets no gradient. kBlockPool: MaxText's csa_overlap_pooling (the features are
  // two halves: block c pools the first half of block c - 1's positions and its own second).
  int64_t block_topk = 0;
  bool overlapping_windows = false;

  // Every attribute equal (sim/explore/batch_classes.cpp compares two steps' ops by it).
  bool operator==(const OpAttrs& other) const = default;
};

// An op's inputs or outputs, inline up to 4 (most ops read one to three tensors and write one;
// attention's gradient reads up to eight): the partitioner adds thousands of ops per program, and
// two lists on the heap were two allocations each.
using TensorIds = boost::container::small_vector<TensorId, 4>;

struct Op {
  int id = -1;
  OpKind kind = OpKind::kEinsum;
  std::string name;
  TensorIds inputs;
  TensorIds outputs;
  OpAttrs attrs;
  Phase phase = Phase::kForward;
  int region = 0;
};

// The share of its region's iterations an op runs in (1 / every x iteration_share): counts and
// costs of the region multiply by it.
inline double share_of_iterations(const Op& op) {
  return op.attrs.iteration_share / static_cast<double>(op.attrs.every);
}

}  // namespace tpusim
