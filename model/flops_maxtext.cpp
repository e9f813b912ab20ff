#include "model/flops_maxtext.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "model/config.h"
#include "model/ir/op_flops.h"
#include "model/model_dims.h"

namespace tpusim {
namespace {

// A matmul of an [m, n] by an [n, p] matrix costs m.n.p multiply-adds, 2 FLOPs each.
constexpr double kFlopsPerMultiplyAdd = 2.0;
// Training costs the forward matmul plus two backward ones (input and weight gradients).
constexpr double kTrainingPassesPerForward = 3.0;
constexpr double kFlopsPerTflop = 1e12;
// Core attention is two matmuls per head: Q.K^T (scores) and P.V (weighted values).
constexpr double kAttentionMatmuls = 2.0;
// MaxText (since PR #1988) counts half of the S x S score matrix under the causal mask.
constexpr double kCausalFraction = 0.5;
// A sliding window W keeps S.W - W^2/2 of the S^2 (query, key) pairs.
constexpr double kWindowTriangleFraction = 0.5;
// A gemma4_small layer's per-layer input costs two matmuls of D x P: the gate and the output.
constexpr double kPerLayerInputMatmuls = 2.0;
// 2023 convention: 6 FLOPs per parameter per token (2 forward, 4 backward).
constexpr double kTrainingFlopsPerParamPerToken = 6.0;
// 2023 parameter count: RMSNorm scales before attention and before the MLP in each layer.
constexpr int64_t kNormsPerLayer = 2;

double as_double(int64_t value) {
  return static_cast<double>(value);
}

// 2.T.D.F.a (the a input matmuls: gate, up, ...) + 2.T.D.F (the output matmul), T tokens; D =
// `in_dim` (qwen3_custom_moe's experts: moe_expert_input_dim), emb_dim by default.
double ffn_flops(double tokens, const ModelDims& dims, int64_t mlp_dim, int64_t in_dim = 0) {
  const double activations = as_double(static_cast<int64_t>(dims.mlp_activations.size()));
  const double one_matmul = kFlopsPerMultiplyAdd * tokens *
                            as_double(in_dim > 0 ? in_dim : dims.emb_dim) * as_double(mlp_dim);
  return one_matmul * activations + one_matmul;
}

// Weights of one FFN: a input matrices and one output matrix of D x F.
double ffn_params(const ModelDims& dims, int64_t mlp_dim) {
  const double activations = as_double(static_cast<int64_t>(dims.mlp_activations.size()));
  return (activations + 1.0) * as_double(dims.emb_dim) * as_double(mlp_dim);
}

bool is_mla(const ModelDims& dims) {
  return dims.attention_type == "mla";
}

// The real depth: gemma2 counts (local, global) pairs in base_num_decoder_layers.
int64_t real_num_layers(const ModelDims& dims) {
  return dims.num_layers * dims.family().layers_per_decoder_layer;
}

struct FfnLayerCounts {
  int64_t dense = 0;
  int64_t moe = 0;
};

// MoE models: layers past first_num_dense_layers (DeepSeek) that are every
// interleave_moe_layer_step-th (llama4: 2; 1 for the others) are MoE (ModelDims::is_moe_layer).
FfnLayerCounts ffn_layer_counts(const ModelDims& dims, int64_t num_layers) {
  FfnLayerCounts counts;
  for (int64_t index = 0; index < num_layers; ++index) {
    (dims.is_moe_layer(index) ? counts.moe : counts.dense) += 1;
  }
  return counts;
}

struct AttentionLayerCounts {
  int64_t global = 0;
  int64_t local = 0;
  int64_t chunked = 0;
};

// The attention period MaxText counts with (DecoderFamily::maxtext_attention); UserError when
// it comes from an inhomogeneous_layer_cycle_interval below 1 (gpt_oss).
int64_t counted_period(const ModelDims& dims) {
  const AttentionPattern& pattern = dims.family().maxtext_attention;
  if (pattern.period == AttentionPattern::kFromCycleInterval &&
      dims.inhomogeneous_layer_cycle_interval < 1) {
    throw UserError("inhomogeneous_layer_cycle_interval: " +
                    std::to_string(dims.inhomogeneous_layer_cycle_interval) +
                    " must be >= 1 for decoder_block " + dims.family().name);
  }
  return pattern.period_for(dims.inhomogeneous_layer_cycle_interval);
}

// Which layers use sliding-window attention, per MaxText's accounting
// (DecoderFamily::maxtext_attention): gemma2 alternates (local, global); gemma3 has one global
// layer per 6; gpt_oss one per inhomogeneous_layer_cycle_interval (MaxText PRs #2009/#2030 name
// only these blocks). olmo3's sliding-window layers are counted as global too: beyond its
// 4096-token window MaxText's logged TFLOP/s count more attention than the model does (the program
// computes the windows). Other blocks count every layer as global, whatever attention_type says
// (MaxText does the same). Without a sliding window every layer is global, as the model builder
// lays it.
AttentionLayerCounts attention_layer_counts(const ModelDims& dims, int64_t num_layers) {
  switch (dims.family().maxtext_attention.layout) {
    case AttentionLayout::kGatedDeltaNet: {
      // Only the full-attention layers (the others are Gated DeltaNet layers, counted apart).
      int64_t full = 0;
      for (int64_t index = 0; index < num_layers; ++index) {
        full += dims.is_gated_delta_net_layer(index) ? 0 : 1;
      }
      return {full, 0, 0};
    }
    case AttentionLayout::kUniform:
    case AttentionLayout::kMla:
    case AttentionLayout::kCompressed:
      return {num_layers, 0, 0};
    case AttentionLayout::kChunkedNopeGlobal: {
      if (dims.chunk_attn_window_size <= 0) {
        return {num_layers, 0, 0};
      }
      // Every nope_layer_interval-th layer global, the others chunked.
      const int64_t global =
          dims.nope_layer_interval > 0 ? num_layers / dims.nope_layer_interval : 0;
      return {global, 0, num_layers - global};
    }
    case AttentionLayout::kGlobalEveryN: {
      if (dims.sliding_window_size <= 0) {
        return {num_layers, 0, 0};
      }
      const int64_t global = num_layers / counted_period(dims);
      return {global, num_layers - global, 0};
    }
    case AttentionLayout::kLocalEveryN: {
      if (dims.sliding_window_size <= 0) {
        return {num_layers, 0, 0};
      }
      const int64_t period = counted_period(dims);
      const int64_t local = (num_layers + period - 1) / period;
      return {num_layers - local, local, 0};
    }
  }
  return {num_layers, 0, 0};
}

// Query + key/value projections of one MLA layer (MaxText calculate_mla_tflops_per_device).
double mla_qkv_flops(double tokens, const ModelDims& dims) {
  const double emb = as_double(dims.emb_dim);
  const double heads = as_double(dims.num_query_heads);
  const double qk_head_dim = as_double(dims.qk_nope_head_dim + dims.qk_rope_head_dim);
  const double q_lora = as_double(dims.q_lora_rank);
  const double kv_lora = as_double(dims.kv_lora_rank);
  const double query_macs = dims.q_lora_rank > 0
                                ? emb * q_lora + q_lora * heads * qk_head_dim  // down, then up
                                : emb * heads * qk_head_dim;
  const double kv_macs = emb * (kv_lora + as_double(dims.qk_rope_head_dim)) +
                         kv_lora * heads * as_double(dims.qk_nope_head_dim + dims.v_head_dim);
  return kFlopsPerMultiplyAdd * tokens * (query_macs + kv_macs);
}

double mla_params(const ModelDims& dims) {
  return mla_qkv_flops(1.0, dims) / kFlopsPerMultiplyAdd +
         as_double(dims.num_query_heads * dims.v_head_dim * dims.emb_dim);
}

// gemma4_small's kv-shared layers (no K/V projection; a double-wide MLP with use_double_wide_mlp)
// and per-layer inputs; nothing for other blocks. Global layers are every
// maxtext_attention.period-th, as in attention_layer_counts.
void add_gemma4_small_terms(const ModelDims& dims, double tokens, MaxTextForwardFlops& forward) {
  for (int64_t index = 0; index < forward.num_layers; ++index) {
    if (dims.is_kv_shared_layer(index)) {
      ++forward.num_kv_shared_layers;
      if (dims.sliding_window_size <= 0 || (index + 1) % counted_period(dims) == 0) {
        ++forward.num_kv_shared_global_layers;
      }
      forward.kv_shared_dense_ffn = ffn_flops(tokens, dims, dims.layer_mlp_dim(index));
    }
  }
  const double emb = as_double(dims.emb_dim);
  const double kv_projections = 2.0;
  forward.kv_projection = kFlopsPerMultiplyAdd * tokens * emb * kv_projections *
                          as_double(dims.num_kv_heads * dims.head_dim);
  const double global_kv = dims.global_layer_shares_kv() ? 1.0 : kv_projections;
  forward.global_kv_projection =
      kFlopsPerMultiplyAdd * tokens * emb * global_kv *
      as_double(dims.global_layer_kv_heads() * dims.global_layer_head_dim());
  if (dims.has_per_layer_inputs()) {
    const double width = as_double(dims.hidden_size_per_layer_input);
    const double layers = as_double(forward.num_layers);
    forward.per_layer_inputs =
        kFlopsPerMultiplyAdd * tokens * emb * width * layers * (1.0 + kPerLayerInputMatmuls);
  }
}

// qwen3_next / qwen3_5 (derived from the architecture, docs/reference/maxtext.md §2a; not
// MaxText's formula): the Gated DeltaNet layer's projections, its chunked delta rule, and the
// shared expert's per-token gate, for `tokens` tokens.
void add_gated_delta_net_terms(const ModelDims& dims, double tokens, MaxTextForwardFlops& forward) {
  if (!dims.is_gated_delta_net_block()) {
    return;
  }
  for (int64_t index = 0; index < forward.num_layers; ++index) {
    forward.num_gated_delta_net_layers += dims.is_gated_delta_net_layer(index) ? 1 : 0;
  }
  const double emb = as_double(dims.emb_dim);
  const double key_heads = as_double(dims.gdn_num_key_heads);
  const double value_heads = as_double(dims.gdn_num_value_heads);
  const double key_dim = as_double(dims.gdn_key_head_dim);
  const double value_dim = as_double(dims.gdn_value_head_dim);
  const double chunk = as_double(dims.gdn_chunk_size);
  // q and k (key heads), v and the output gate z (value heads), beta and the decay (one each per
  // value head); then out_proj from the value heads.
  const double projected =
      2.0 * key_heads * key_dim + 2.0 * value_heads * value_dim + 2.0 * value_heads;
  forward.gated_delta_net_projections =
      kFlopsPerMultiplyAdd * tokens * emb * (projected + value_heads * value_dim);
  // Per token and value head: the chunk matrices (k.beta) k^T and (q.exp g) k^T (C.dk each), the
  // UT-form products with the values and keys (C.dv + C.dk), the chunk output P V (C.dv); the
  // state S = k^T U, W S and (q.exp g) S (dk.dv each). Multiply-adds, x2.
  constexpr double kChunkKeyMatmuls = 3.0;    // A, W, P
  constexpr double kChunkValueMatmuls = 2.0;  // U, P V
  constexpr double kStateMatmuls = 3.0;       // S, W S, (q.exp g) S
  const double per_token_head =
      chunk * (kChunkKeyMatmuls * key_dim + kChunkValueMatmuls * value_dim) +
      kStateMatmuls * key_dim * value_dim;
  forward.gated_delta_net_core = kFlopsPerMultiplyAdd * tokens * value_heads * per_token_head;
  if (dims.has_shared_experts()) {
    forward.shared_expert_gate = kFlopsPerMultiplyAdd * tokens * emb;
  }
}

struct BatchShape {
  double batch = 0;     // B, sequences per device per microbatch
  double sequence = 0;  // S
  int64_t gradient_accumulation_steps = 1;
  double tokens() const { return batch * sequence; }
};

BatchShape batch_shape_from_config(const Config& config) {
  BatchShape shape;
  shape.batch = config.get_float("per_device_batch_size");
  shape.sequence = as_double(config.get_int("max_target_length"));
  shape.gradient_accumulation_steps = config.get_int("gradient_accumulation_steps");
  return shape;
}

}  // namespace

double MaxTextForwardFlops::learnable_weight_flops() const {
  return dense_ffn * as_double(num_dense_layers) +
         (moe_ffn + router + shared_expert_gate) * as_double(num_moe_layers) +
         (qkv + out_proj) *
             as_double(num_layers - num_global_attention_layers - num_gated_delta_net_layers) +
         gated_delta_net_projections * as_double(num_gated_delta_net_layers) +
         (global_qkv + global_out_proj) * as_double(num_global_attention_layers) + unembed -
         kv_projection * as_double(num_kv_shared_layers - num_kv_shared_global_layers) -
         global_kv_projection * as_double(num_kv_shared_global_layers) +
         (kv_shared_dense_ffn - dense_ffn) * as_double(num_kv_shared_layers) + per_layer_inputs +
         layer_up_projection * as_double(num_layers);
}

double MaxTextForwardFlops::attention_flops() const {
  return global_attention * as_double(num_global_attention_layers) +
         local_attention * as_double(num_local_attention_layers) +
         chunked_attention * as_double(num_chunked_attention_layers) +
         gated_delta_net_core * as_double(num_gated_delta_net_layers);
}

double MaxTextFlops::kv_shared_projection_tflops() const {
  const double forward_flops =
      forward.kv_projection *
          as_double(forward.num_kv_shared_layers - forward.num_kv_shared_global_layers) +
      forward.global_kv_projection * as_double(forward.num_kv_shared_global_layers);
  return kTrainingPassesPerForward * as_double(gradient_accumulation_steps) * forward_flops /
         kFlopsPerTflop;
}

MaxTextFlops maxtext_training_flops_per_device(const Config& config) {
  const ModelDims dims = ModelDims::from_config(config);
  const BatchShape shape = batch_shape_from_config(config);
  const double tokens = shape.tokens();
  const double emb = as_double(dims.emb_dim);
  const double heads = as_double(dims.num_query_heads);
  const double head_dim = as_double(dims.head_dim);

  MaxTextForwardFlops forward;
  forward.num_layers = real_num_layers(dims);
  const FfnLayerCounts ffn_layers = ffn_layer_counts(dims, forward.num_layers);
  forward.num_dense_layers = ffn_layers.dense;
  forward.num_moe_layers = ffn_layers.moe;
  const AttentionLayerCounts attention_layers = attention_layer_counts(dims, forward.num_layers);
  forward.num_global_attention_layers = attention_layers.global;
  forward.num_local_attention_layers = attention_layers.local;
  forward.num_chunked_attention_layers = attention_layers.chunked;

  forward.dense_ffn = ffn_flops(tokens, dims, dims.mlp_dim);
  if (dims.is_moe()) {
    // qwen3_custom_moe's router and experts work at moe_expert_input_dim; emb_dim otherwise.
    const int64_t expert_in = dims.expert_input_dim();
    forward.router =
        kFlopsPerMultiplyAdd * tokens * as_double(expert_in) * as_double(dims.num_experts);
    // Shared experts only in the DeepSeek, Llama4 and Gemma4 blocks (Gemma4's as wide as the dense
    // MLP); the generic MoE path ignores them, deepseek4's included (it takes that path).
    const int64_t shared = dims.has_shared_experts() && dims.family().maxtext_counts_shared_experts
                               ? dims.shared_experts
                               : 0;
    forward.moe_ffn =
        as_double(shared) * ffn_flops(tokens, dims, dims.shared_expert_mlp_dim()) +
        as_double(dims.num_experts_per_tok) * ffn_flops(tokens, dims, dims.moe_mlp_dim, expert_in);
  }

  // Non-causal core attention is kAttentionMatmuls x 2.B.S^2.H.(per-head width of the matmul);
  // for MLA the two matmuls have widths qk_nope + qk_rope (scores) and v_head_dim (values).
  const double score_pairs = shape.batch * shape.sequence * shape.sequence;
  if (is_mla(dims)) {
    forward.qkv = mla_qkv_flops(tokens, dims);
    forward.out_proj = kFlopsPerMultiplyAdd * tokens * emb * heads * as_double(dims.v_head_dim);
    const double head_widths =
        as_double(dims.qk_nope_head_dim + dims.qk_rope_head_dim + dims.v_head_dim);
    forward.global_attention =
        kCausalFraction * kFlopsPerMultiplyAdd * score_pairs * heads * head_widths;
  } else {
    forward.qkv = kFlopsPerMultiplyAdd * tokens * emb *
                  as_double(dims.num_query_heads + 2 * dims.num_kv_heads) * head_dim;
    forward.out_proj = kFlopsPerMultiplyAdd * tokens * emb * heads * head_dim;
    // gemma4's global layers (ModelDims::global_layer_*); for other blocks the same as local.
    const double global_head_dim = as_double(dims.global_layer_head_dim());
    const int64_t kv_projections = dims.global_layer_shares_kv() ? 1 : 2;
    // Qwen3-Next's gated attention: the query projection yields the query and an output gate.
    const int64_t query_projections = dims.is_gated_delta_net_block() ? 2 : 1;
    forward.global_qkv = kFlopsPerMultiplyAdd * tokens * emb *
                         as_double(query_projections * dims.num_query_heads +
                                   kv_projections * dims.global_layer_kv_heads()) *
                         global_head_dim;
    forward.global_out_proj = kFlopsPerMultiplyAdd * tokens * emb * heads * global_head_dim;
    forward.global_attention = kCausalFraction * kAttentionMatmuls * kFlopsPerMultiplyAdd *
                               score_pairs * heads * global_head_dim;
  }
  if (is_mla(dims)) {
    forward.global_qkv = forward.qkv;
    forward.global_out_proj = forward.out_proj;
  }
  if (forward.num_local_attention_layers > 0) {
    // A window longer than the sequence is the whole (causal) sequence: S.W - W^2/2 = S^2/2.
    const double window = std::min(as_double(dims.sliding_window_size), shape.sequence);
    const double window_pairs =
        shape.batch * (shape.sequence * window - kWindowTriangleFraction * window * window);
    forward.local_attention =
        kAttentionMatmuls * kFlopsPerMultiplyAdd * window_pairs * heads * head_dim;
  }
  if (forward.num_chunked_attention_layers > 0) {
    // Causal within each chunk: n = S // C chunks of C^2/2 pairs and the rest r^2/2 (derived: equal
    // to the causal count when S <= C, as for the published recipes at S = C = 8192).
    const double chunk_pairs =
        score_pairs * attention_mask_fraction(AttentionMask::kChunked,
                                              static_cast<int64_t>(shape.sequence),
                                              dims.chunk_attn_window_size);
    forward.chunked_attention =
        kAttentionMatmuls * kFlopsPerMultiplyAdd * chunk_pairs * heads * head_dim;
  }
  if (dims.family().latent_moe) {
    // qwen3_custom_moe: the out projection ends at attention_output_dim (2.T.A.H.h), and a layer
    // up projection takes the experts' output back to emb_dim (2.T.A.D).
    const double output_dim = as_double(dims.attention_output_dim);
    forward.out_proj = kFlopsPerMultiplyAdd * tokens * output_dim * heads * head_dim;
    forward.global_out_proj = forward.out_proj;
    forward.layer_up_projection = kFlopsPerMultiplyAdd * tokens * output_dim * emb;
  }
  forward.unembed = kFlopsPerMultiplyAdd * tokens * emb * as_double(dims.vocab_size);
  add_gemma4_small_terms(dims, tokens, forward);
  add_gated_delta_net_terms(dims, tokens, forward);

  MaxTextFlops flops;
  flops.forward = forward;
  flops.gradient_accumulation_steps = shape.gradient_accumulation_steps;
  const double per_step = kTrainingPassesPerForward * as_double(shape.gradient_accumulation_steps);
  flops.learnable_weight_tflops = per_step * forward.learnable_weight_flops() / kFlopsPerTflop;
  flops.attention_tflops = per_step * forward.attention_flops() / kFlopsPerTflop;
  return flops;
}

MaxText2023Flops maxtext_2023_flops_per_device(const Config& config) {
  const ModelDims dims = ModelDims::from_config(config);
  const BatchShape shape = batch_shape_from_config(config);
  const int64_t num_layers = real_num_layers(dims);
  const FfnLayerCounts ffn_layers = ffn_layer_counts(dims, num_layers);
  const double emb = as_double(dims.emb_dim);
  const double heads = as_double(dims.num_query_heads);
  const double head_dim = as_double(dims.head_dim);

  const double attention_params =
      is_mla(dims) ? mla_params(dims)
                   : emb * as_double(dims.num_query_heads + 2 * dims.num_kv_heads) * head_dim +
                         heads * head_dim * emb;
  const double moe_params =
      as_double(dims.num_experts + dims.shared_experts) * ffn_params(dims, dims.moe_mlp_dim) +
      emb * as_double(dims.num_experts);  // experts + router
  const double layer_params = attention_params + as_double(kNormsPerLayer) * emb;
  const double embedding_params = as_double(dims.vocab_size) * emb;

  MaxText2023Flops flops;
  flops.num_params = layer_params * as_double(num_layers) +
                     ffn_params(dims, dims.mlp_dim) * as_double(ffn_layers.dense) +
                     moe_params * as_double(ffn_layers.moe) + embedding_params +
                     (dims.logits_via_embedding ? 0.0 : embedding_params) + emb;  // + final norm
  const double accumulation = as_double(shape.gradient_accumulation_steps);
  flops.weight_tflops = kTrainingFlopsPerParamPerToken * flops.num_params * shape.tokens() *
                        accumulation / kFlopsPerTflop;
  flops.attention_tflops = kTrainingPassesPerForward * kAttentionMatmuls * kFlopsPerMultiplyAdd *
                           as_double(num_layers) * heads * head_dim * shape.sequence *
                           shape.sequence * shape.batch * accumulation / kFlopsPerTflop;
  return flops;
}

}  // namespace tpusim
