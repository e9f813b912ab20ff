// model/builder/compressed_attention.cpp: DeepSeek-V4's compressed attention (decoder_block
// deepseek4, attention_type compressed), as MaxText's CompressedAttention lays it out
// (layers/attention_compressed.py; docs/reference/deepseek4.md): a low-rank query, one shared
// key/value head, sliding-window attention over the layer's own tokens plus, by the layer's
// compress_ratio r, attention over compressed blocks of r tokens, and a grouped low-rank out
// projection.
//   r = 0: the sliding window only;
//   r = 4 (compressed sparse attention, CSA): overlapping blocks pooled from 2 x head_dim
//     projections (kBlockPool with overlapping_windows: block c pools the first half of block
//     c - 1's tokens and the second half of its own); the indexer (its own such blocks, rotated
//     at their positions) scores every block for every query and kBlockTopK keeps each query's
//     indexer_topk best complete blocks, a selection the attention op reads as its last input
//     (OpAttrs::block_topk): the window's keys, the selected blocks and the sinks in one softmax;
//   r > 4 (heavily compressed attention, HCA): blocks pooled from head_dim projections; each
//     query attends to every block completed at or before it, in ONE softmax with the window's
//     keys and the sinks (the attention op's blocks input, OpAttrs::compress_ratio), as
//     MaxText's attention_op takes the window's kv and the blocks together.
// A block pools its tokens by a softmax over learned gates plus a position bias (kBlockPool),
// then an RMSNorm and RoPE at its first token's position. Layers with r > 0 rotate at
// compressed_rope_max_timescale. The indexer's scores only pick blocks: no gradient flows through
// them (as in MaxText, where top_k's indices end the path). MaxText scales the indexer's relu
// scores by indexer_head_dim^-0.5 and its head weights by indexer_n_heads^-0.5: positive
// constants, which top_k's order does not see, so the program leaves them out.
//
// Example (deepseek4-284b, one CSA layer, per token):
//   q_latent [q_lora=1024] = x [embed=4096] . attention/wq_a; query [heads=64, head_dim=512]
//   kv [kv_heads=1, 512] = x . attention/wkv; one softmax over the window (128), its top 512 of
//   the S/4 blocks and the sink; out: [64 x 512] in 8 groups -> [8, o_lora=1024] -> [embed=4096]
#include <cmath>

#include "common/error.h"
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {
namespace {

// A CSA block pools 2 x head_dim projections of two overlapping token windows (MaxText
// csa_overlap_pooling); an HCA block one head_dim projection of its own window.
constexpr int64_t kOverlappingWindows = 2;

}  // namespace

// Pools `kv` and `gate` ([batch, length, width x head_dim]) into [batch, length = blocks,
// <prefix>_dim] blocks of `ratio` tokens: per feature, softmax(gate + position bias) over a
// block's width x ratio entries weighs kv (kBlockPool; MaxText's position_bias [r, width x h]).
// With width 2 (CSA) the entries are MaxText's overlapping windows: the blocks keep both halves
// of the projection ([batch, blocks, r, 2h]) and the op pools block c - 1's first half with
// block c's second (OpAttrs::overlapping_windows).
TensorId ForwardBuilder::pool_blocks(const std::string& prefix, int region, TensorId kv,
                                     TensorId gate, int64_t ratio, int64_t width,
                                     int64_t head_dim) {
  const int64_t blocks = length_ / ratio;
  const bool overlapping = width == kOverlappingWindows;
  // The blocks are positions along "length" (RoPE and the attention op read it).
  const Dim feature_dim = overlapping ? Dim{prefix + "_projected", width * head_dim, "kv"}
                                      : Dim{prefix + "_dim", head_dim, "kv"};
  const Dim positions_dim{prefix + "_block_pos", overlapping ? ratio : width * ratio, ""};
  const std::vector<Dim> block_dims = {
      act("batch", batch_, batch_logical_), act("length", blocks, "activation_length"),
      act(positions_dim.name, positions_dim.size, ""),
      act(feature_dim.name, feature_dim.size, overlapping ? "" : "activation_kv")};
  const TensorId kv_blocks = reshape(prefix + "/kv_blocks", kv, block_dims, region);
  const TensorId gate_blocks = reshape(prefix + "/gate_blocks", gate, block_dims, region);
  const TensorId bias = parameter_tensor(prefix + "/position_bias", {positions_dim, feature_dim},
                                         region, constant_init(0));
  const TensorId pooled = activation(
      prefix + "/pooled",
      {block_dims[0], block_dims[1], act(prefix + "_dim", head_dim, "activation_kv")}, region);
  OpAttrs attrs;
  attrs.contracted = {prefix + "_block_pos"};
  attrs.overlapping_windows = overlapping;
  graph().add_op(OpKind::kBlockPool, prefix + "/pooled", {kv_blocks, gate_blocks, bias}, {pooled},
                 attrs, region);
  return pooled;
}

// The projections one pooled set of blocks reads: kv and gate, [embed] -> [width x head_dim].
TensorId ForwardBuilder::compressed_blocks(const std::string& prefix, int region, TensorId x,
                                           int64_t ratio, int64_t head_dim) {
  const int64_t width = ratio == kCompressedSparseRatio ? kOverlappingWindows : 1;
  const Dim projected_w{prefix + "_projected", width * head_dim, "kv"};
  const std::vector<Dim> projected_dims =
      with_last(activation_dims(), {act(prefix + "_projected", width * head_dim, "")});
  const Dim embed_w{"embed", dims_.emb_dim, "embed"};
  const TensorId w_kv =
      weight(prefix + "/kv_proj", {embed_w, projected_w}, region, dense(dims_.emb_dim));
  const TensorId w_gate =
      weight(prefix + "/gate_proj", {embed_w, projected_w}, region, dense(dims_.emb_dim));
  const TensorId kv = einsum(prefix + "/kv_proj", x, w_kv, {"embed"}, projected_dims, region);
  const TensorId gate = einsum(prefix + "/gate_proj", x, w_gate, {"embed"}, projected_dims, region);
  TensorId pooled = pool_blocks(prefix, region, kv, gate, ratio, width, head_dim);
  pooled = norm(prefix + "/norm", pooled, region);
  // MaxText rotates block c at its first token's position, c r.
  return compressed_rope(prefix + "/rope", pooled, region, ratio);
}

// RoPE at compressed_rope_max_timescale (MaxText's rotary embedding of a layer with a compress
// ratio > 0), position i x `position_stride` along "length".
TensorId ForwardBuilder::compressed_rope(const std::string& name, TensorId x, int region,
                                         int64_t position_stride, bool reverse) {
  const TensorId out = rope(name, x, region, reverse);
  OpAttrs& attrs = graph().mutable_op(graph().producer(out)).attrs;
  attrs.rope_max_timescale = static_cast<double>(dims_.compressed_rope_max_timescale);
  attrs.rope_position_stride = position_stride;
  return out;
}

// The CSA indexer: its query from the query latent, its own pooled blocks, per-head weights from
// x, the score of every block for every query, sum over heads of weight x relu(q . block), and
// the selection of each query's indexer_topk best complete blocks (kBlockTopK), returned.
TensorId ForwardBuilder::build_indexer(int region, TensorId x, TensorId q_latent) {
  const int64_t heads = dims_.indexer_n_heads;
  const int64_t head_dim = dims_.indexer_head_dim;
  const int64_t q_lora = dims_.q_lora_rank;
  const TensorId w_query =
      weight("indexer/q_proj",
             {Dim{"q_lora", q_lora, "q_lora"}, Dim{"indexer_heads", heads, "indexer_q"},
              Dim{"indexer_dim", head_dim, "kv"}},
             region, dense(q_lora));
  TensorId query = einsum("indexer/query", q_latent, w_query, {"q_lora"},
                          with_last(activation_dims(), {act("indexer_heads", heads, ""),
                                                        act("indexer_dim", head_dim, "")}),
                          region);
  query = compressed_rope("indexer/query_rope", query, region, 1);
  // Pooled and rotated along "length" (the positions RoPE reads), then named apart from the
  // query's length, which they meet in the score einsum.
  TensorId blocks = compressed_blocks("indexer", region, x, kCompressedSparseRatio, head_dim);
  const int64_t num_blocks = length_ / kCompressedSparseRatio;
  blocks = reshape(
      "indexer/blocks", blocks,
      {act("batch", batch_, batch_logical_), act("indexer_blocks", num_blocks, "activation_length"),
       act("indexer_dim", head_dim, "activation_kv")},
      region);
  const TensorId w_weights =
      weight("indexer/weights_proj",
             {Dim{"embed", dims_.emb_dim, "embed"}, Dim{"indexer_heads", heads, "indexer_weights"}},
             region, dense(dims_.emb_dim));
  const TensorId head_weights =
      einsum("indexer/weights", x, w_weights, {"embed"},
             with_last(activation_dims(), {act("indexer_heads", heads, "")}), region);
  std::vector<Dim> score_dims = with_last(
      activation_dims(), {act("indexer_heads", heads, ""), act("indexer_blocks", num_blocks, "")});
  TensorId scores = einsum("indexer/scores", query, blocks, {"indexer_dim"}, score_dims, region);
  scores = elementwise("indexer/relu", ElementwiseFn::kRelu, {scores}, region);
  score_dims.erase(score_dims.begin() + 2);  // the heads
  const TensorId index_scores =
      einsum("indexer/index_scores", scores, head_weights, {"indexer_heads"}, score_dims, region);
  const TensorId selection = activation("indexer/selection", score_dims, region);
  OpAttrs attrs;
  attrs.compress_ratio = kCompressedSparseRatio;
  attrs.block_topk = dims_.indexer_topk;
  graph().add_op(OpKind::kBlockTopK, "indexer/selection", {index_scores}, {selection}, attrs,
                 region);
  return selection;
}

// An attention op of `name` over (q, k, v) under `mask` (window: the sliding window, or for
// kSlidingWindow over blocks the number of blocks a query attends to at most).
TensorId ForwardBuilder::compressed_attention_op(const std::string& name, int region,
                                                 std::vector<TensorId> inputs, AttentionMask mask,
                                                 int64_t window, double scale) {
  const TensorId context = activation(
      name,
      head_dims(dims_.num_query_heads, "heads", "activation_heads", "head_dim", dims_.head_dim),
      region, "context");
  OpAttrs attrs;
  attrs.mask = mask;
  attrs.window = window;
  attrs.attention_scale = scale;
  graph().add_op(OpKind::kAttention, name, std::move(inputs), {context}, attrs, region);
  return context;
}

// The out projection in o_groups groups of heads: each group's [heads / G x head_dim] down to
// o_lora_rank (one grouped matmul), then the [G x o_lora_rank] latent to emb_dim.
TensorId ForwardBuilder::grouped_out_projection(int region, TensorId context) {
  const int64_t groups = dims_.o_groups;
  const int64_t per_group = dims_.num_query_heads * dims_.head_dim / groups;
  const int64_t rank = dims_.o_lora_rank;
  // A group is heads / G whole heads, so the heads' split carries over to the groups (as XLA
  // propagates it through the reshape): the shard of heads a device holds is its shard of groups.
  const std::vector<Dim> grouped_dims =
      with_last(activation_dims(),
                {act("o_groups", groups, "activation_heads"), act("o_group_in", per_group, "")});
  const TensorId grouped = reshape("attention/o_grouped", context, grouped_dims, region);
  const TensorId w_a =
      weight("attention/o_a_proj",
             {Dim{"o_groups", groups, "o_groups"}, Dim{"o_group_in", per_group, "q_heads"},
              Dim{"o_lora", rank, "o_lora_up_proj"}},
             region, dense(per_group));
  const TensorId latent = einsum(
      "attention/o_a_proj", grouped, w_a, {"o_group_in"},
      with_last(activation_dims(), {act("o_groups", groups, ""), act("o_lora", rank, "")}), region);
  const TensorId w_b =
      weight("attention/o_b_proj",
             {Dim{"o_groups", groups, "o_lora_up_proj"}, Dim{"o_lora", rank, "o_lora_up_proj"},
              Dim{"embed", dims_.emb_dim, "embed"}},
             region, dense(groups * rank));
  return einsum("attention/o_b_proj", latent, w_b, {"o_groups", "o_lora"}, activation_dims(),
                region, "out_proj");
}

TensorId ForwardBuilder::build_compressed_attention(const LayerGroup& group, int region,
                                                    TensorId x) {
  const int64_t heads = dims_.num_query_heads;
  const int64_t kv_heads = dims_.num_kv_heads;
  const int64_t head_dim = dims_.head_dim;
  const int64_t q_lora = dims_.q_lora_rank;
  const int64_t ratio = group.compress_ratio;
  if (ratio >= kCompressedSparseRatio && length_ % ratio != 0) {
    throw UserError("max_target_length: " + std::to_string(length_) +
                        " must be a multiple of every compress_ratios entry of 4 or more (" +
                        std::to_string(ratio) + ") for decoder_block " + dims_.family().name,
                    "max_target_length");
  }
  if (ratio >= kCompressedSparseRatio && kv_heads != 1) {
    // MaxText concatenates the one-head blocks to the window's kv along the keys: one kv head.
    throw UserError("base_num_kv_heads: " + std::to_string(kv_heads) +
                        " must be 1 in a layer with compressed blocks (compress_ratios " +
                        std::to_string(ratio) + ") for decoder_block " + dims_.family().name,
                    "base_num_kv_heads");
  }
  const Dim embed_w{"embed", dims_.emb_dim, "embed"};
  const TensorId wq_a = weight("attention/wq_a", {embed_w, Dim{"q_lora", q_lora, "q_lora"}}, region,
                               dense(dims_.emb_dim));
  TensorId q_latent =
      einsum("attention/q_latent", x, wq_a, {"embed"},
             with_last(activation_dims(), {act("q_lora", q_lora, "activation_embed")}), region);
  q_latent = norm("attention/q_norm", q_latent, region);
  const TensorId wq_b = weight("attention/wq_b",
                               {Dim{"q_lora", q_lora, "q_lora"}, Dim{"heads", heads, "q_heads"},
                                Dim{"head_dim", head_dim, "kv"}},
                               region, dense(q_lora));
  TensorId query = einsum("attention/query", q_latent, wq_b, {"q_lora"},
                          head_dims(heads, "heads", "activation_heads", "head_dim", head_dim),
                          region, "query_proj");
  query = norm("attention/q_up_norm", query, region, /*with_scale=*/false);  // unweighted
  // MaxText: a layer with a compress ratio > 0 rotates at compressed_rope_max_timescale.
  const auto layer_rope = [&](const std::string& name, TensorId input, bool reverse) {
    return ratio > 0 ? compressed_rope(name, input, region, 1, reverse)
                     : rope(name, input, region, reverse);
  };
  query = layer_rope("attention/query_rope", query, false);
  const TensorId wkv = weight(
      "attention/wkv",
      {embed_w, Dim{"kv_heads", kv_heads, "kv_heads"}, Dim{"head_dim", head_dim, "kv_head_dim"}},
      region, dense(dims_.emb_dim));
  TensorId kv = einsum("attention/kv", x, wkv, {"embed"},
                       head_dims(kv_heads, "kv_heads", "activation_kv_heads", "head_dim", head_dim),
                       region, "kv_proj");
  kv = norm("attention/kv_norm", kv, region);
  kv = layer_rope("attention/kv_rope", kv, false);
  // MaxText: the query is scaled by head_dim^-0.5 before the attention.
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // The attention sinks: one learned logit per query head in every softmax (zeros at init,
  // replicated as MaxText's sharding (None,) has them).
  const TensorId sinks =
      parameter_tensor("attention/sinks", {Dim{"heads", heads, ""}}, region, constant_init(0));
  std::vector<TensorId> attention_inputs = {query, kv, kv, sinks};
  TensorId selection = -1;
  if (ratio >= kCompressedSparseRatio) {
    if (ratio == kCompressedSparseRatio) {
      selection = build_indexer(region, x, q_latent);
    }
    const TensorId pooled = compressed_blocks("compressor", region, x, ratio, head_dim);
    // The blocks as keys (and values) of one kv head, their position as the key length.
    attention_inputs.push_back(reshape(
        "compressor/keys", pooled,
        {act("batch", batch_, batch_logical_), act("length", length_ / ratio, "activation_length"),
         act("kv_heads", 1, "activation_kv_heads"), act("head_dim", head_dim, "activation_kv")},
        region));
  }
  if (selection >= 0) {
    attention_inputs.push_back(selection);
  }
  // The window's keys, the visible (for CSA: selected) blocks and the sinks in one softmax.
  TensorId context =
      compressed_attention_op("attention/context", region, attention_inputs,
                              AttentionMask::kSlidingWindow, options_.sliding_window_size, scale);
  if (ratio >= kCompressedSparseRatio) {
    OpAttrs& attrs = graph().mutable_op(graph().producer(context)).attrs;
    attrs.compress_ratio = ratio;
    attrs.block_topk = selection >= 0 ? dims_.indexer_topk : 0;
  }
  // MaxText undoes the values' rotation on the attention output before the out projection.
  context = layer_rope("attention/context_unrope", context, true);
  return grouped_out_projection(region, context);
}

}  // namespace tpusim::builder_detail
