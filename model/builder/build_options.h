// model/builder/build_options.h: the config keys the forward builder reads beyond the model's
// dims (model_dims.h), read once per build by from_config.
//
// Example:
//   const BuildOptions options = BuildOptions::from_config(config);
//   options.attn_logits_soft_cap;  // 50 for gemma2's presets, else 0 (no cap)
#pragma once

#include <cstdint>
#include <string>

namespace tpusim {

class Config;

struct BuildOptions {
  std::string model_name;  // for messages
  // The step's shape and dtypes.
  int64_t max_target_length = 0;
  std::string dtype;                     // activations
  std::string weight_dtype;              // parameters
  int64_t trainable_position_size = 0;   // learned positions (gpt3); 0 = none
  int64_t dcn_pipeline_parallelism = 1;  // for messages: which key set the stages
  bool pipeline_fsdp_ag_once = false;
  // Embedding and head.
  bool use_iota_embed = false;
  int64_t num_vocab_tiling = 1;
  double final_logits_soft_cap = 0;
  bool normalize_embedding_logits = false;
  // Decoder layers.
  bool use_post_attn_norm = false;
  bool use_post_ffw_norm = false;
  double normalization_layer_epsilon = 0;
  int64_t rope_max_timescale = 0;
  int64_t sliding_window_size = 0;
  double attn_logits_soft_cap = 0;
  bool attention_bias = false;
  bool use_qk_norm_in_gdn = false;
  // Multi-head latent attention.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // Mixture of experts. The router's top-k weights are renormalized to sum to 1 when
  // norm_topk_prob is true or the decoder block always does so (RouterWeights::kSoftmaxOfChosen:
  // MaxText's softmax over the chosen logits, e.g. mixtral with norm_topk_prob false).
  bool normalize_router_top_k = false;
  double routed_scaling_factor = 1;
  // routed_score_func "sqrtsoftplus" (DeepSeek-V4): the router scores experts by
  // sqrt(softplus(logit)) (OpAttrs::sqrt_softplus_scores).
  bool sqrt_softplus_router_scores = false;
  // routed_bias (DeepSeek's auxiliary-loss-free balancing): every router but a hash-routed one
  // reads a learned [experts] bias, zeros at init, added to the scores for the choice of experts
  // only (moe/gate_bias; OpAttrs of kMoeRouter, sim/functional/kernels/moe.cpp).
  bool routed_bias = false;
  // MaxText's load_balance_loss_weight w (0: none): each routed MoE layer adds its load-balance
  // loss (moe.py load_balance_loss) to the step's loss; built for deepseek4
  // (feed_forward_block.cpp).
  double load_balance_loss_weight = 0;
  // MaxText's routed_bias_update_rate r (0: none; a MaxText key outside tpusim's base.yml): after
  // the optimizer step each routed layer's bias moves by r x sign(T k / E - the expert's choices
  // over the step's T tokens), built for deepseek4's biased routers (the router's VJP counts the
  // choices, the bias's AdamW update adds the step: model/autodiff/training_step.cpp).
  double routed_bias_update_rate = 0;
  double capacity_factor = 0;
  bool sparse_matmul = false;
  double ragged_buffer_factor = 0;
  // MaxText's mlp_activations_limit: > 0 clips the SwiGLU of deepseek's and deepseek4's routed
  // experts (moe.py apply_ffn_activation); <= 0 (its -1 default) clips nothing.
  double mlp_activations_limit = 0;

  static BuildOptions from_config(const Config& config);
};

// routed_bias_update_rate as the config sets it (MaxText's default 0 when unset); UserError naming
// the key when it is not a number or is negative.
double routed_bias_update_rate_from_config(const Config& config);

}  // namespace tpusim
