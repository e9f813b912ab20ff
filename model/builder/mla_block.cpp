// model/builder/mla_block.cpp: DeepSeek's multi-head latent attention (attention_type=mla), the
// attention of deepseek2/3 and kimi: the query through a low-rank latent (q_lora_rank), keys and
// values expanded per head from one shared latent (kv_lora_rank), and a rotary key part shared by
// all heads; the attention op and out projection are attention_block.cpp's.
//
// Example (deepseek3-671b, one layer, per token):
//   q_latent [q_lora=1536] = x [embed=7168] . mla/wq_a, normed; query [heads=128, 192] = . mla/wq_b
//   kv_latent [kv_lora=512] = x . mla/wkv_a, normed; key [128, nope=128], value [128, 128]
//   key_rope [qk_rope=64] = rope(x . mla/wk_rope)
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {

// DeepSeek multi-head latent attention: low-rank query (q_lora_rank > 0) and key/value
// (kv_lora_rank) projections, a shared rotary key, per-head nope+rope query/key dims.
TensorId ForwardBuilder::build_mla(int region, TensorId x) {
  const int64_t heads = dims_.num_query_heads;
  const int64_t q_lora = options_.q_lora_rank;
  const int64_t kv_lora = options_.kv_lora_rank;
  const int64_t nope = options_.qk_nope_head_dim;
  const int64_t rope_dim = options_.qk_rope_head_dim;
  const int64_t value_dim = options_.v_head_dim;
  const Dim embed_w{"embed", dims_.emb_dim, "embed"};
  const Dim heads_w{"heads", heads, "q_heads"};
  TensorId query = -1;
  const auto query_dims =
      head_dims(heads, "heads", "activation_heads", "qk_head_dim", nope + rope_dim);
  if (q_lora > 0) {
    const TensorId wq_a = weight("mla/wq_a", {embed_w, Dim{"q_lora", q_lora, "q_lora"}}, region,
                                 dense(dims_.emb_dim));
    TensorId q_latent = einsum(
        "mla/q_latent", x, wq_a, {"embed"},
        with_last(activation_dims(), {act("q_lora", q_lora, "activation_embed")}), region, "mla_q");
    q_latent = norm("mla/q_norm", q_latent, region);
    const TensorId wq_b = weight(
        "mla/wq_b",
        {Dim{"q_lora", q_lora, "q_lora"}, heads_w, Dim{"qk_head_dim", nope + rope_dim, "kv"}},
        region, dense(q_lora));
    query = einsum("mla/query", q_latent, wq_b, {"q_lora"}, query_dims, region, "query_proj");
  } else {
    const TensorId wq =
        weight("mla/wq", {embed_w, heads_w, Dim{"qk_head_dim", nope + rope_dim, "kv"}}, region,
               dense(dims_.emb_dim));
    query = einsum("mla/query", x, wq, {"embed"}, query_dims, region, "query_proj");
  }
  query = rope("mla/query_rope", query, region);
  const TensorId wkv_a = weight("mla/wkv_a", {embed_w, Dim{"kv_lora", kv_lora, "kv_lora"}}, region,
                                dense(dims_.emb_dim));
  TensorId kv_latent =
      einsum("mla/kv_latent", x, wkv_a, {"embed"},
             with_last(activation_dims(), {act("kv_lora", kv_lora, "activation_embed")}), region,
             "mla_kv");
  kv_latent = norm("mla/kv_norm", kv_latent, region);
  const TensorId wk_rope = weight("mla/wk_rope", {embed_w, Dim{"qk_rope", rope_dim, "kv"}}, region,
                                  dense(dims_.emb_dim));
  TensorId key_rope = einsum("mla/key_rope", x, wk_rope, {"embed"},
                             with_last(activation_dims(), {act("qk_rope", rope_dim, "")}), region);
  key_rope = rope("mla/key_rope_rotated", key_rope, region);
  const TensorId wk_b =
      weight("mla/wk_b", {Dim{"kv_lora", kv_lora, "kv_lora"}, heads_w, Dim{"qk_nope", nope, "kv"}},
             region, dense(kv_lora));
  const TensorId key =
      einsum("mla/key", kv_latent, wk_b, {"kv_lora"},
             head_dims(heads, "heads", "activation_heads", "qk_nope", nope), region, "key_proj");
  const TensorId wv_b = weight(
      "mla/wv_b", {Dim{"kv_lora", kv_lora, "kv_lora"}, heads_w, Dim{"v_head_dim", value_dim, "kv"}},
      region, dense(kv_lora));
  const TensorId value = einsum(
      "mla/value", kv_latent, wv_b, {"kv_lora"},
      head_dims(heads, "heads", "activation_heads", "v_head_dim", value_dim), region, "value_proj");
  LayerGroup mla;
  mla.attention = AttentionKind::kMla;
  const TensorId context = attention_op(
      mla, region, {query, key, value, key_rope}, heads, "v_head_dim", value_dim,
      query_scaling_from_config(config_, dims_.family(), nope + rope_dim).runtime_scale);
  return out_projection(region, context, "v_head_dim", value_dim);
}

}  // namespace tpusim::builder_detail
