// model/builder/attention_block.cpp: a decoder layer's softmax attention (MHA, GQA, sliding-window
// and chunked local, gemma4's global layers, qwen3-next's gated attention): the query/key/value
// projections (with attention_bias), qk-norm, RoPE, the attention op and the out projection; the
// attention op, RoPE and out projection also serve multi-head latent attention (mla_block.cpp).
//
// Example (llama3.1-8b, one layer, per token):
//   query [heads=32, head_dim=128] = x [embed=4096] . attention/query; key, value: kv_heads=8
//   attention/context = attention(rope(query), rope(key), value)   (causal)
//   out = attention/context . attention/out   -> [embed=4096]
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {

// gemma4_small's kv-shared layers (group.kv_shared) project their own keys and values here,
// where MaxText reuses those of the last earlier layer of the same attention kind: the program
// has no tensors that cross from one scanned region into a later one. That adds 2.D.2K.h FLOPs
// per token and layer (0.7% of gemma4-e2b's step); model/flops_maxtext.cpp counts MaxText's.
TensorId ForwardBuilder::build_attention(const LayerGroup& group, int region, TensorId x) {
  // gemma4's global layers: their own head width and kv heads, one K/V projection.
  const bool global = group.attention == AttentionKind::kGlobal;
  const int64_t head_dim = global ? dims_.global_layer_head_dim() : dims_.head_dim;
  const int64_t kv_heads = global ? dims_.global_layer_kv_heads() : dims_.num_kv_heads;
  const bool shared_kv = global && dims_.global_layer_shares_kv();
  // llama4's global layers use no position encoding (NoPE); gpt3 adds learned positions.
  const PositionEncoding positions = dims_.family().positions;
  const bool rotary = positions == PositionEncoding::kRope ||
                      (positions == PositionEncoding::kRopeExceptGlobal && !global);
  const QueryScaling scaling = query_scaling_from_config(config_, dims_.family(), head_dim);
  auto projection = [&](const std::string& name, const std::string& heads_name, int64_t heads,
                        const std::string& weight_logical, const std::string& act_logical,
                        const std::string& remat) {
    // Fan-in = embed (the contracted axis); the query's init carries the folded 1/sqrt(d).
    const double divisor = name == "query" ? scaling.init_divisor : 1.0;
    const TensorId w =
        weight("attention/" + name,
               {Dim{"embed", dims_.emb_dim, "embed"}, Dim{heads_name, heads, weight_logical},
                Dim{"head_dim", head_dim, "kv"}},
               region, dense(dims_.emb_dim, divisor, true));
    const TensorId projected =
        einsum("attention/" + name, x, w, {"embed"},
               head_dims(heads, heads_name, act_logical, "head_dim", head_dim), region, remat);
    return with_bias("attention/" + name, projected,
                     {Dim{heads_name, heads, weight_logical}, Dim{"head_dim", head_dim, "kv"}},
                     region);
  };
  TensorId query = projection("query", "heads", dims_.num_query_heads, "q_heads",
                              "activation_heads", "query_proj");
  TensorId key =
      projection("key", "kv_heads", kv_heads, "kv_heads", "activation_kv_heads", "key_proj");
  // Shared K/V: the values are the key projection as computed, before RoPE.
  const TensorId value = shared_kv ? key
                                   : projection("value", "kv_heads", kv_heads, "kv_heads",
                                                "activation_kv_heads", "value_proj");
  if (qk_norm_from_config(config_, dims_.family())) {
    // MaxText's Attention with use_qk_norm (attentions.py, qwen3's layers): an RMSNorm over
    // head_dim of every head of the projected query and of the projected key, each with its own
    // learned [head_dim] scale (initialized to ones, kernel axis "norm") and epsilon
    // normalization_layer_epsilon, applied before RoPE; the values are not normalized. The
    // query is then scaled by query_pre_attn_scalar = head_dim^-0.5 at run time (scaling above).
    // llama4's qk-norm (a scale-free L2 norm after RoPE) is another function: tpusim train
    // refuses it, tpusim estimate charges it as this norm (the same traffic and vector work).
    query = norm("attention/query_norm", query, region);
    key = norm("attention/key_norm", key, region);
  }
  if (rotary) {
    query = rope("attention/query_rope", query, region);
    key = rope("attention/key_rope", key, region);
  }
  TensorId context = attention_op(group, region, {query, key, value}, dims_.num_query_heads,
                                  "head_dim", head_dim, scaling.runtime_scale);
  if (dims_.is_gated_delta_net_block()) {
    // Qwen3-Next's gated attention (Hugging Face Qwen3NextAttention): the query projection also
    // yields a gate as wide as the query (q_proj: D -> 2.H.h), and the context is multiplied by
    // sigmoid(gate) before the out projection. A separate einsum here, the same FLOPs.
    TensorId gate =
        projection("gate", "heads", dims_.num_query_heads, "q_heads", "activation_heads", "");
    gate = elementwise("attention/gate_sigmoid", ElementwiseFn::kSigmoid, {gate}, region);
    context = elementwise("attention/gated_context", ElementwiseFn::kMul, {context, gate}, region);
  }
  return out_projection(region, context, "head_dim", head_dim,
                        dims_.family().latent_moe ? dims_.attention_output_dim : 0);
}

TensorId ForwardBuilder::rope(const std::string& name, TensorId x, int region, bool reverse) {
  const TensorId out = activation(name, graph().tensor(x).dims, region);
  OpAttrs attrs;
  attrs.rope_max_timescale = static_cast<double>(options_.rope_max_timescale);
  attrs.reverse_rotation = reverse;
  graph().add_op(OpKind::kRope, name, {x}, {out}, attrs, region);
  return out;
}

TensorId ForwardBuilder::attention_op(const LayerGroup& group, int region,
                                      std::vector<TensorId> inputs, int64_t heads,
                                      const std::string& out_dim, int64_t out_dim_size,
                                      double runtime_scale) {
  const TensorId context = activation(
      "attention/context", head_dims(heads, "heads", "activation_heads", out_dim, out_dim_size),
      region, "context");
  OpAttrs attrs;
  attrs.mask = group.attention == AttentionKind::kSlidingWindow ? AttentionMask::kSlidingWindow
               : group.attention == AttentionKind::kChunked     ? AttentionMask::kChunked
                                                                : AttentionMask::kCausal;
  attrs.window = group.attention == AttentionKind::kChunked ? dims_.chunk_attn_window_size
                                                            : options_.sliding_window_size;
  attrs.attention_scale = runtime_scale;
  // MaxText's attn_logits_soft_cap (AttentionOp, attention_op.py): the scaled logits become
  // cap tanh(logits / cap) before the mask and the softmax. MaxText's presets set it for gemma2
  // (50); tpusim applies it in whichever block the config sets it.
  attrs.logit_soft_cap = options_.attn_logits_soft_cap;
  graph().add_op(OpKind::kAttention, "attention", std::move(inputs), {context}, attrs, region);
  return context;
}

TensorId ForwardBuilder::out_projection(int region, TensorId context,
                                        const std::string& head_dim_name, int64_t head_dim_size,
                                        int64_t out_width) {
  const int64_t width = out_width > 0 ? out_width : dims_.emb_dim;
  const TensorId wo =
      weight("attention/out",
             {Dim{"heads", dims_.num_query_heads, "heads"}, Dim{head_dim_name, head_dim_size, "kv"},
              Dim{"embed", width, "embed"}},
             region, dense(dims_.num_query_heads * head_dim_size, 1, true));
  const std::vector<Dim> out_dims =
      out_width > 0 ? with_last(activation_dims(), {act("embed", width, "activation_embed")})
                    : activation_dims();
  const TensorId out =
      einsum("attention/out", context, wo, {"heads", head_dim_name}, out_dims, region, "out_proj");
  return with_bias("attention/out", out, {Dim{"embed", width, "norm"}}, region);
}

// With attention_bias (qwen2, gpt-oss), MaxText's attention projections (query, key, value and
// out) add a learned bias over their output features; otherwise `x` as it is.
TensorId ForwardBuilder::with_bias(const std::string& name, TensorId x, std::vector<Dim> bias_dims,
                                   int region) {
  if (!options_.attention_bias) {
    return x;
  }
  // MaxText's bias_init: zeros.
  const TensorId bias =
      parameter_tensor(name + "/bias", std::move(bias_dims), region, constant_init(0));
  return elementwise(name + "/add_bias", ElementwiseFn::kAdd, {x, bias}, region);
}

}  // namespace tpusim::builder_detail
