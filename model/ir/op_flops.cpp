#include "model/ir/op_flops.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace tpusim {
namespace {

constexpr double kFlopsPerMac = 2.0;
// Vector work per element, rough operation counts (assumption; refined by calibration later):
constexpr double kSimpleElementwiseFlops = 1.0;  // add, mul, scale, cast
constexpr double kActivationFlops = 4.0;         // silu/gelu/sigmoid: exp + divide + multiply
constexpr double kNormFlopsPerElement = 4.0;     // square, sum, scale, multiply
constexpr double kSoftmaxFlopsPerScore = 5.0;    // max, subtract, exp, sum, divide
constexpr double kSoftCapFlopsPerScore = 3.0;    // divide, tanh, multiply (a logit soft cap)
constexpr double kRopeFlopsPerElement = 3.0;     // two multiplies and an add
constexpr double kAdamFlopsPerParameter = 12.0;  // two moments, bias correction, sqrt, update
constexpr double kCrossEntropyFlopsPerLogit = 4.0;
constexpr double kAttentionGradMatmulFactor = 2.0;  // dq, dk, dv, dp vs q k^T, p v
// Sinkhorn (mHC): per matrix element, the softmax and the first column pass (add eps, sum,
// divide), then per iteration a row and a column pass (sum and divide each). Its VJP recomputes
// them and runs each pass backwards at about twice a pass's work (assumption): 3x the forward.
constexpr double kSinkhornFirstPassFlops = kSoftmaxFlopsPerScore + 3.0;
constexpr double kSinkhornFlopsPerIteration = 4.0;
constexpr double kSinkhornGradFactor = 3.0;
// A compressor's pooled entry: bias add, softmax (max, subtract, exp, sum, divide), multiply-add.
constexpr double kBlockPoolFlopsPerEntry = 1.0 + kSoftmaxFlopsPerScore + 2.0;
// CSA's top-k block selection (kBlockTopK), per index score: one for the causal mask plus
// ceil(log2 k) comparisons, as the stages of a selection network picking k (an assumption: no
// profile of XLA's TopK on a TPU was read).
double block_topk_flops_per_score(int64_t topk) {
  return 1.0 + std::ceil(std::log2(static_cast<double>(std::max<int64_t>(topk, 2))));
}

double elements(const Graph& graph, TensorId id) {
  return static_cast<double>(graph.tensor(id).num_elements());
}

// A grouped matmul (third input row_experts) multiplies only the rows routing fills.
double einsum_flops(const Graph& graph, const Op& op) {
  std::map<std::string, int64_t> sizes;
  for (size_t operand = 0; operand < 2; ++operand) {
    for (const Dim& dim : graph.tensor(op.inputs.at(operand)).dims) {
      sizes[dim.name] = dim.size;
    }
  }
  double product = kFlopsPerMac * op.attrs.routed_fraction;
  for (const auto& [name, size] : sizes) {
    product *= static_cast<double>(size);
  }
  return product;
}

int64_t dim_size(const Tensor& tensor, const std::string& name) {
  const int index = tensor.dim_index(name);
  return index < 0 ? 1 : tensor.dims[static_cast<size_t>(index)].size;
}

// q[batch,length,heads,head_dim], k[batch,kv_length,kv_heads,head_dim], v[...,v_head_dim].
OpFlops attention_forward_flops(const Graph& graph, const Op& op) {
  const Tensor& query = graph.tensor(op.inputs.at(0));
  const Tensor& key = graph.tensor(op.inputs.at(1));
  const Tensor& value = graph.tensor(op.inputs.at(2));
  const double batch = static_cast<double>(dim_size(query, "batch"));
  const int64_t query_length = dim_size(query, "length");
  const int64_t key_length = dim_size(key, "length");
  const double heads = static_cast<double>(dim_size(query, "heads"));
  const double qk_dim = static_cast<double>(query.dims.back().size);
  const double v_dim = static_cast<double>(value.dims.back().size);
  // Keys each query attends to on average: a fraction of the (whole) key length. With the
  // queries split over context devices (load-balanced), each device does its share of that.
  const double keys_per_query = static_cast<double>(key_length) *
                                attention_mask_fraction(op.attrs.mask, key_length, op.attrs.window);
  const double scores = batch * heads * static_cast<double>(query_length) * keys_per_query;
  const double vector_per_score =
      kSoftmaxFlopsPerScore + (op.attrs.logit_soft_cap > 0 ? kSoftCapFlopsPerScore : 0.0);
  return {kFlopsPerMac * scores * (qk_dim + v_dim), vector_per_score * scores};
}

// Inputs: dout, q, k, v, ...: forward q, k, v start at index 1.
OpFlops attention_gradient_flops(const Graph& graph, const Op& op) {
  Op forward = op;
  forward.inputs.erase(forward.inputs.begin());
  const OpFlops flops = attention_forward_flops(graph, forward);
  return {kAttentionGradMatmulFactor * flops.matmul, 2.0 * flops.vector};
}

}  // namespace

CompressedAttentionParts compressed_attention_parts(const Op& op) {
  const bool gradient = op.kind == OpKind::kAttentionGrad;
  const size_t first = gradient ? 1 : 0;  // the gradient's inputs: dout, forward inputs, out
  // CSA's selection (attrs.block_topk) follows the blocks.
  const size_t selection = op.attrs.block_topk > 0 ? 1 : 0;
  const size_t blocks_index = op.inputs.size() - (gradient ? 2 : 1) - selection;
  CompressedAttentionParts parts{op, op};
  parts.window.attrs.compress_ratio = 0;
  parts.window.attrs.block_topk = 0;
  parts.window.inputs.erase(
      parts.window.inputs.begin() + static_cast<std::ptrdiff_t>(blocks_index),
      parts.window.inputs.begin() + static_cast<std::ptrdiff_t>(blocks_index + 1 + selection));
  Op& blocks = parts.blocks;
  blocks.attrs.compress_ratio = 0;
  blocks.attrs.block_topk = 0;
  blocks.attrs.mask = AttentionMask::kCausal;
  blocks.attrs.window = 0;
  if (selection > 0) {
    // A query reads its top k blocks, or every complete one while there are fewer: charged as a
    // sliding window of k over the blocks.
    blocks.attrs.mask = AttentionMask::kSlidingWindow;
    blocks.attrs.window = op.attrs.block_topk;
  }
  blocks.inputs = {op.inputs[first], op.inputs[blocks_index], op.inputs[blocks_index]};
  if (gradient) {
    blocks.inputs.insert(blocks.inputs.begin(), op.inputs.front());
    blocks.inputs.push_back(op.inputs.back());
  }
  return parts;
}

double attention_mask_fraction(AttentionMask mask, int64_t length, int64_t window) {
  const double sequence = static_cast<double>(length);
  switch (mask) {
    case AttentionMask::kNone:
      return 1.0;
    case AttentionMask::kCausal:
      return 0.5;
    case AttentionMask::kSlidingWindow: {
      if (window <= 0 || window >= length) {
        return 0.5;
      }
      const double width = static_cast<double>(window);
      return (sequence * width - width * width / 2.0) / (sequence * sequence);
    }
    case AttentionMask::kChunked: {
      // Causal inside each chunk: S // C whole chunks of C^2 / 2 pairs and a last one of r^2 / 2
      // (derived; equals causal when S <= C).
      if (window <= 0 || window >= length) {
        return 0.5;
      }
      const double chunk = static_cast<double>(window);
      const double whole_chunks = std::floor(sequence / chunk);
      const double rest = sequence - whole_chunks * chunk;
      return (whole_chunks * chunk * chunk + rest * rest) / 2.0 / (sequence * sequence);
    }
  }
  return 1.0;
}

OpFlops op_flops(const Graph& graph, const Op& op) {
  switch (op.kind) {
    case OpKind::kEinsum:
      return {einsum_flops(graph, op), 0};
    case OpKind::kAttention:
    case OpKind::kAttentionGrad:
      if (op.attrs.compress_ratio > 0) {
        const CompressedAttentionParts parts = compressed_attention_parts(op);
        const OpFlops window = op_flops(graph, parts.window);
        const OpFlops blocks = op_flops(graph, parts.blocks);
        return {window.matmul + blocks.matmul, window.vector + blocks.vector};
      }
      if (op.kind == OpKind::kAttention) {
        return attention_forward_flops(graph, op);
      }
      return attention_gradient_flops(graph, op);
    case OpKind::kElementwise: {
      if (op.attrs.function == ElementwiseFn::kReshape) {
        return {};  // moves (or relabels) elements, computes nothing
      }
      const bool simple =
          op.attrs.function == ElementwiseFn::kAdd || op.attrs.function == ElementwiseFn::kMul ||
          op.attrs.function == ElementwiseFn::kScale || op.attrs.function == ElementwiseFn::kCast;
      return {0, elements(graph, op.outputs.at(0)) *
                     (simple ? kSimpleElementwiseFlops : kActivationFlops)};
    }
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kNormGrad:
      return {0, kNormFlopsPerElement * elements(graph, op.inputs.at(0))};
    case OpKind::kRope:
      return {0, kRopeFlopsPerElement * elements(graph, op.inputs.at(0))};
    case OpKind::kCrossEntropy:
    case OpKind::kCrossEntropyGrad: {
      // The tied head's transform of each logit (multiply, then soft cap) fused into the loss.
      const double transform = (op.attrs.logit_soft_cap > 0 ? kSoftCapFlopsPerScore : 0.0) +
                               (op.attrs.logit_multiplier != 1.0 ? kSimpleElementwiseFlops : 0.0);
      return {0, (kCrossEntropyFlopsPerLogit + transform) * elements(graph, op.inputs.at(0))};
    }
    case OpKind::kAdamUpdate:
      return {0, kAdamFlopsPerParameter * elements(graph, op.inputs.at(0))};
    case OpKind::kEmbeddingGrad:
      if (op.attrs.one_hot_embedding) {
        // one_hot(tokens)^T . dy: [V, T] x [T, D] -> the table's [V, D].
        return {2.0 * elements(graph, op.inputs.at(1)) * elements(graph, op.outputs.at(0)), 0};
      }
      return {0, elements(graph, op.inputs.at(0))};
    case OpKind::kEmbeddingLookup:
      if (op.attrs.one_hot_embedding) {
        // one_hot(tokens) . table: [T, V] x [V, D].
        return {2.0 * elements(graph, op.inputs.at(0)) * elements(graph, op.inputs.at(1)), 0};
      }
      return {0, 0};
    case OpKind::kReduceSum:
    case OpKind::kNormStatistics:
    case OpKind::kCrossEntropyStatistics:
    case OpKind::kMoeRouter:
    case OpKind::kRouterGrad:
    case OpKind::kMoeCombine:
      return {0, elements(graph, op.inputs.at(0))};
    case OpKind::kSinkhorn:
    case OpKind::kSinkhornGrad: {
      const double per_element =
          kSinkhornFirstPassFlops +
          kSinkhornFlopsPerIteration * static_cast<double>(op.attrs.sinkhorn_iterations);
      const double factor = op.kind == OpKind::kSinkhornGrad ? kSinkhornGradFactor : 1.0;
      return {0, factor * per_element * elements(graph, op.outputs.at(0))};
    }
    case OpKind::kBlockPool:
      // Per pooled entry: the gate's bias add, the softmax, the weighted sum (kv's elements).
      return {0, kBlockPoolFlopsPerEntry * elements(graph, op.inputs.at(0))};
    case OpKind::kBlockPoolGrad:
      // dkv = dy w, dgate = dy w (kv - y) and the bias's sum, plus the softmax recomputed.
      return {0, 2.0 * kBlockPoolFlopsPerEntry * elements(graph, op.inputs.at(1))};
    case OpKind::kBlockTopK:
      // Per score: the causal mask and log2(k) comparisons (a selection network's stages).
      return {0,
              block_topk_flops_per_score(op.attrs.block_topk) * elements(graph, op.inputs.at(0))};
    case OpKind::kDynamicSlice:
    case OpKind::kMoeDispatch:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kAllToAll:
    case OpKind::kCollectivePermute:
    case OpKind::kHostOffload:
    case OpKind::kHostLoad:
      return {};
  }
  return {};
}

}  // namespace tpusim
