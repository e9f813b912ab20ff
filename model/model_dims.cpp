#include "model/model_dims.h"

#include "common/error.h"
#include "model/config.h"

namespace tpusim {

ParameterScales individual_scales(int64_t global_parameter_scale) {
  int log2_scale = 0;
  while ((int64_t{1} << (log2_scale + 1)) <= global_parameter_scale) {
    ++log2_scale;
  }
  if ((int64_t{1} << log2_scale) != global_parameter_scale) {
    throw UserError("global_parameter_scale: " + std::to_string(global_parameter_scale) +
                    " must be a power of two");
  }
  const int base = log2_scale / 3;
  const int remainder = log2_scale % 3;
  ParameterScales scales;
  scales.heads = base + (remainder > 0 ? 1 : 0);
  scales.mlp = scales.heads;
  scales.emb = base + (remainder > 1 ? 1 : 0);
  scales.layers = base;
  return scales;
}

ModelDims ModelDims::from_config(const Config& config) {
  const ParameterScales scales = individual_scales(config.get_int("global_parameter_scale"));
  ModelDims dims;
  dims.emb_dim = config.get_int("base_emb_dim") << scales.emb;
  dims.num_query_heads = config.get_int("base_num_query_heads") << scales.heads;
  dims.num_kv_heads = config.get_int("base_num_kv_heads") << scales.heads;
  dims.head_dim = config.get_int("head_dim");
  dims.mlp_dim = config.get_int("base_mlp_dim") << scales.mlp;
  // MaxText: base_moe_mlp_dim -1 (its default) means the experts are as wide as the dense MLP.
  const int64_t moe_mlp_dim = config.get_int("base_moe_mlp_dim");
  dims.moe_mlp_dim = (moe_mlp_dim == -1 ? config.get_int("base_mlp_dim") : moe_mlp_dim)
                     << scales.mlp;
  dims.num_layers = config.get_int("base_num_decoder_layers") << scales.layers;
  dims.vocab_size = config.get_int("vocab_size");
  dims.mlp_activations = config.get_string_list("mlp_activations");
  dims.decoder_block = parse_decoder_block(config.get_string("decoder_block"));
  dims.global_head_dim = config.get_int("global_head_dim");
  dims.global_num_kv_heads = config.get_int("global_num_kv_heads") << scales.heads;
  dims.share_kv_projections = config.get_bool("share_kv_projections");
  dims.chunk_attn_window_size = config.get_int("chunk_attn_window_size");
  dims.nope_layer_interval = config.get_int("nope_layer_interval");
  dims.interleave_moe_layer_step = config.get_int("interleave_moe_layer_step");
  dims.num_experts = config.get_int("num_experts");
  dims.num_experts_per_tok = config.get_int("num_experts_per_tok");
  dims.shared_experts = config.get_int("shared_experts");
  dims.first_num_dense_layers = config.get_int("first_num_dense_layers");
  dims.logits_via_embedding = config.get_bool("logits_via_embedding");
  dims.attention_type = config.get_string("attention_type");
  dims.sliding_window_size = config.get_int("sliding_window_size");
  dims.inhomogeneous_layer_cycle_interval = config.get_int("inhomogeneous_layer_cycle_interval");
  dims.q_lora_rank = config.get_int("q_lora_rank");
  dims.kv_lora_rank = config.get_int("kv_lora_rank");
  dims.qk_nope_head_dim = config.get_int("qk_nope_head_dim");
  dims.qk_rope_head_dim = config.get_int("qk_rope_head_dim");
  dims.v_head_dim = config.get_int("v_head_dim");
  dims.hidden_size_per_layer_input = config.get_int("hidden_size_per_layer_input");
  dims.vocab_size_per_layer_input = config.get_int("vocab_size_per_layer_input");
  dims.num_kv_shared_layers = config.get_int("num_kv_shared_layers");
  dims.use_double_wide_mlp = config.get_bool("use_double_wide_mlp");
  dims.gdn_num_key_heads = config.get_int("gdn_num_key_heads");
  dims.gdn_num_value_heads = config.get_int("gdn_num_value_heads");
  dims.gdn_key_head_dim = config.get_int("gdn_key_head_dim");
  dims.gdn_value_head_dim = config.get_int("gdn_value_head_dim");
  dims.gdn_conv_kernel_dim = config.get_int("gdn_conv_kernel_dim");
  dims.gdn_chunk_size = config.get_int("gdn_chunk_size");
  return dims;
}

}  // namespace tpusim
