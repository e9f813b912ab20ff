// model/model_dims.h: the model's actual dimensions from a config, as MaxText derives them.
//
// MaxText scales the base_* dims by global_parameter_scale (pyconfig get_individual_scales):
// with s = 2^k and (b, r) = divmod(k, 3), heads and mlp dims grow by 2^(b + (r > 0)), emb by
// 2^(b + (r > 1)) and layers by 2^b; head_dim and vocab are not scaled.
//
// Example:
//   ModelDims dims = ModelDims::from_config(config);  // llama3.1-8b
//   dims.emb_dim == 4096; dims.num_kv_heads == 8; dims.mlp_dim == 14336; dims.num_layers == 32
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "model/decoder_family.h"

namespace tpusim {

class Config;

struct ModelDims {
  int64_t emb_dim = 0;
  int64_t num_query_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t mlp_dim = 0;
  int64_t moe_mlp_dim = 0;
  int64_t num_layers = 0;
  int64_t vocab_size = 0;
  std::vector<std::string> mlp_activations;
  // decoder_block, parsed once here; its traits row: family().
  DecoderBlock decoder_block = DecoderBlock::kLlama2;
  int64_t num_experts = 1;
  int64_t num_experts_per_tok = 1;
  int64_t shared_experts = 0;
  int64_t first_num_dense_layers = 0;
  bool logits_via_embedding = false;
  // Attention pattern (attention_type): global, local_sliding, mla, chunk, full.
  std::string attention_type = "global";
  // Window in tokens of local sliding-window layers (gemma2/gemma3/gpt_oss); 0 = none.
  int64_t sliding_window_size = 0;
  // Period of repeating non-identical layers (gpt_oss: 2 = sliding-window, then global).
  int64_t inhomogeneous_layer_cycle_interval = 1;
  // gemma4's global layers: their head width and kv heads (global_head_dim and
  // global_num_kv_heads, 0 = as the local layers) and one shared K/V projection.
  int64_t global_head_dim = 0;
  int64_t global_num_kv_heads = 0;
  bool share_kv_projections = false;
  // llama4: chunked attention window and the period of its global (no-RoPE) layers.
  int64_t chunk_attn_window_size = 0;
  int64_t nope_layer_interval = -1;
  // Every interleave_moe_layer_step-th layer of a MoE model is MoE (llama4: 2).
  int64_t interleave_moe_layer_step = 1;
  // MLA (attention_type "mla"); not scaled by global_parameter_scale, as in MaxText.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // gemma4_small (gemma4-e2b/e4b): per-layer inputs of hidden_size_per_layer_input (each layer
  // looks its tokens up in its own table of vocab_size_per_layer_input rows, projects the residual
  // stream to that width, gates and projects back); the last num_kv_shared_layers layers reuse an
  // earlier layer's keys and values (no K/V projection), their MLP twice as wide with
  // use_double_wide_mlp.
  int64_t hidden_size_per_layer_input = 0;
  int64_t vocab_size_per_layer_input = 0;
  int64_t num_kv_shared_layers = 0;
  bool use_double_wide_mlp = false;
  // qwen3_next / qwen3_5: Gated DeltaNet (linear attention) layers, except every
  // inhomogeneous_layer_cycle_interval-th layer, which is gated full attention. Key heads and
  // their width, value heads (sharing key heads in groups of gdn_num_value_heads /
  // gdn_num_key_heads) and their width, the depthwise convolution's width and the delta rule's
  // chunk (model/builder/gated_delta_net.cpp).
  int64_t gdn_num_key_heads = 0;
  int64_t gdn_num_value_heads = 0;
  int64_t gdn_key_head_dim = 0;
  int64_t gdn_value_head_dim = 0;
  int64_t gdn_conv_kernel_dim = 0;
  int64_t gdn_chunk_size = 0;
  // qwen3_custom_moe (DecoderFamily::latent_moe): the attention's output width and the routed
  // experts' input width (equal in MaxText), -1 = not set.
  int64_t attention_output_dim = -1;
  int64_t moe_expert_input_dim = -1;
  // deepseek4 (model/builder/compressed_attention.cpp): each layer's compression ratio, the
  // grouped low-rank out projection, the indexer of its compressed sparse attention layers, the
  // residual streams of its hyper-connections and its hash-routed layers. mhc_expansion_rate and
  // the indexer_* keys are MaxText keys tpusim's base.yml does not hold (other presets set them
  // without tpusim modeling them): read from the config's MaxText keys, MaxText's default when
  // unset.
  std::vector<int64_t> compress_ratios;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t first_num_hash_layers = 0;
  int64_t mhc_expansion_rate = 1;
  int64_t sinkhorn_iterations = 20;  // mHC's residual matrix (MaxText's default)
  int64_t indexer_n_heads = 0;
  int64_t indexer_head_dim = 0;
  int64_t indexer_topk = 0;
  // The RoPE wavelength of the layers with a compress ratio > 0 (their queries, keys, blocks).
  int64_t compressed_rope_max_timescale = 0;

  static ModelDims from_config(const Config& config);

  const DecoderFamily& family() const { return decoder_family(decoder_block); }
  bool is_moe() const { return num_experts > 1; }
  // gemma4's and gemma4_small's global layers have their own head width, kv heads and shared K/V
  // projection.
  bool global_layers_differ() const { return family().global_layers_own_shape; }
  int64_t global_layer_head_dim() const {
    return global_layers_differ() && global_head_dim > 0 ? global_head_dim : head_dim;
  }
  int64_t global_layer_kv_heads() const {
    return global_layers_differ() && global_num_kv_heads > 0 ? global_num_kv_heads : num_kv_heads;
  }
  bool global_layer_shares_kv() const { return global_layers_differ() && share_kv_projections; }
  // Blocks whose MoE layers add shared_experts (DecoderFamily::moe_shared_experts; MaxText:
  // DeepSeek, Llama4, Gemma4, Qwen3-Next and Qwen3.5; the generic path of mixtral/qwen3_moe/gpt_oss
  // has none), and the width of a shared expert (Gemma4: base_mlp_dim; the others:
  // base_moe_mlp_dim).
  bool has_shared_experts() const { return shared_experts > 0 && family().moe_shared_experts; }
  int64_t shared_expert_mlp_dim() const {
    return family().shared_expert_width == SharedExpertWidth::kMlpDim ? mlp_dim : moe_mlp_dim;
  }
  // Layer `index` (0-based) of a MoE model is MoE: past first_num_dense_layers, and every
  // interleave_moe_layer_step-th (MaxText: (index + 1) % step == 0).
  bool is_moe_layer(int64_t index) const {
    return is_moe() && index >= first_num_dense_layers &&
           (index + 1) % std::max<int64_t>(1, interleave_moe_layer_step) == 0;
  }
  // qwen3_next and qwen3_5 (the same text decoder: Qwen3-Next's hybrid layout): Gated DeltaNet
  // layers, gated attention, a sigmoid-gated shared expert.
  bool is_gated_delta_net_block() const { return family().has_gated_delta_net(); }
  // Layer `index` (0-based) is a Gated DeltaNet layer: all but every
  // inhomogeneous_layer_cycle_interval-th (Hugging Face Qwen3NextConfig.layer_types:
  // "full_attention" when (index + 1) % full_attention_interval == 0).
  bool is_gated_delta_net_layer(int64_t index) const {
    if (!is_gated_delta_net_block()) {
      return false;
    }
    const AttentionPattern& pattern = family().program_attention;
    return (index + 1) % pattern.period_for(inhomogeneous_layer_cycle_interval) != 0;
  }
  // gemma4_small: every layer adds a per-layer input (hidden_size_per_layer_input > 0).
  bool has_per_layer_inputs() const {
    return family().per_layer_inputs && hidden_size_per_layer_input > 0;
  }
  // gemma4_small: layer `index` (0-based) is one of the last num_kv_shared_layers, which reuse an
  // earlier layer's keys and values.
  bool is_kv_shared_layer(int64_t index) const {
    return family().kv_shared_layers && num_kv_shared_layers > 0 &&
           index >= num_layers - num_kv_shared_layers;
  }
  // deepseek4: layer `index`'s compression ratio (0 = sliding-window attention only).
  int64_t compress_ratio(int64_t index) const {
    return index >= 0 && index < static_cast<int64_t>(compress_ratios.size())
               ? compress_ratios[static_cast<size_t>(index)]
               : 0;
  }
  // deepseek4: layer `index` routes by token id (MaxText: layer_idx < first_num_hash_layers).
  bool is_hash_routing_layer(int64_t index) const {
    return family().hash_routing && is_moe() && index < first_num_hash_layers;
  }
  // deepseek4: the residual stream's streams (1 = a plain residual stream).
  int64_t residual_streams() const {
    return family().hyper_connections ? std::max<int64_t>(1, mhc_expansion_rate) : 1;
  }
  // qwen3_custom_moe: the width its experts read and write (emb_dim otherwise).
  int64_t expert_input_dim() const {
    return family().latent_moe && moe_expert_input_dim > 0 ? moe_expert_input_dim : emb_dim;
  }
  // The dense MLP width of layer `index`: twice mlp_dim on gemma4_small's kv-shared layers with
  // use_double_wide_mlp.
  int64_t layer_mlp_dim(int64_t index) const {
    return use_double_wide_mlp && is_kv_shared_layer(index) ? 2 * mlp_dim : mlp_dim;
  }
};

// MaxText get_individual_scales: {emb, heads, mlp, layers} exponents of two for a scale.
struct ParameterScales {
  int emb = 0;
  int heads = 0;
  int mlp = 0;
  int layers = 0;
};
ParameterScales individual_scales(int64_t global_parameter_scale);

}  // namespace tpusim
