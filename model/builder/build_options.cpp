#include "model/builder/build_options.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "model/config.h"
#include "model/decoder_family.h"

namespace tpusim {

double routed_bias_update_rate_from_config(const Config& config) {
  const std::string key = "routed_bias_update_rate";
  double rate = 0;
  for (const Config::PassthroughKey& entry : config.passthrough_keys()) {
    if (entry.key != key || entry.is_maxtext_default) {
      continue;
    }
    const std::string& text = entry.value;
    char* end = nullptr;
    rate = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size()) {
      throw UserError(key + ": '" + text + "' is not a number", key);
    }
    if (!std::isfinite(rate) || rate < 0) {
      throw UserError(key + ": " + text + " must be a finite number >= 0 (0: no update)", key);
    }
  }
  return rate;
}

BuildOptions BuildOptions::from_config(const Config& config) {
  BuildOptions options;
  options.model_name = config.get_string("model_name");
  options.max_target_length = config.get_int("max_target_length");
  options.dtype = config.get_string("dtype");
  options.weight_dtype = config.get_string("weight_dtype");
  options.trainable_position_size = config.get_int("trainable_position_size");
  options.dcn_pipeline_parallelism = config.get_int("dcn_pipeline_parallelism");
  options.pipeline_fsdp_ag_once = config.get_bool("pipeline_fsdp_ag_once");
  options.use_iota_embed = config.get_bool("use_iota_embed");
  options.num_vocab_tiling = config.get_int("num_vocab_tiling");
  options.final_logits_soft_cap = config.get_float("final_logits_soft_cap");
  options.normalize_embedding_logits = config.get_bool("normalize_embedding_logits");
  options.use_post_attn_norm = config.get_bool("use_post_attn_norm");
  options.use_post_ffw_norm = config.get_bool("use_post_ffw_norm");
  options.normalization_layer_epsilon = config.get_float("normalization_layer_epsilon");
  options.rope_max_timescale = config.get_int("rope_max_timescale");
  options.sliding_window_size = config.get_int("sliding_window_size");
  options.attn_logits_soft_cap = config.get_float("attn_logits_soft_cap");
  options.attention_bias = config.get_bool("attention_bias");
  options.use_qk_norm_in_gdn = config.get_bool("use_qk_norm_in_gdn");
  options.q_lora_rank = config.get_int("q_lora_rank");
  options.kv_lora_rank = config.get_int("kv_lora_rank");
  options.qk_nope_head_dim = config.get_int("qk_nope_head_dim");
  options.qk_rope_head_dim = config.get_int("qk_rope_head_dim");
  options.v_head_dim = config.get_int("v_head_dim");
  const DecoderFamily& family =
      decoder_family(parse_decoder_block(config.get_string("decoder_block")));
  options.normalize_router_top_k =
      config.get_bool("norm_topk_prob") || family.router_weights == RouterWeights::kSoftmaxOfChosen;
  options.routed_scaling_factor = config.get_float("routed_scaling_factor");
  options.sqrt_softplus_router_scores = config.get_string("routed_score_func") == "sqrtsoftplus";
  options.routed_bias = config.get_bool("routed_bias");
  options.load_balance_loss_weight = config.get_float("load_balance_loss_weight");
  options.routed_bias_update_rate = routed_bias_update_rate_from_config(config);
  options.capacity_factor = config.get_float("capacity_factor");
  options.sparse_matmul = config.get_bool("sparse_matmul");
  options.ragged_buffer_factor = config.get_float("ragged_buffer_factor");
  options.mlp_activations_limit = config.get_float("mlp_activations_limit");
  return options;
}

}  // namespace tpusim
