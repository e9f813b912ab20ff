#include "sim/train/train_settings.h"

#include <string>

#include "common/error.h"
#include "model/builder/build_options.h"

namespace tpusim {

FunctionalSettings FunctionalSettings::from_config(const Config& config) {
  FunctionalSettings settings;
  settings.model_name = config.get_string("model_name");
  settings.per_device_batch_size = config.get_float("per_device_batch_size");
  settings.gradient_accumulation_steps = config.get_int("gradient_accumulation_steps");
  settings.num_vocab_tiling = config.get_int("num_vocab_tiling");
  settings.num_threads = config.get_int("num_threads");
  settings.init_weights_seed = config.get_int("init_weights_seed");
  settings.collective_timeout_seconds = config.get_float("collective_timeout_seconds");
  settings.bf16_matmul_inputs = config.get_string("functional_dtype") == "bfloat16_matmul";
  settings.fast_kernels = config.get_string("functional_precision") == "fast";
  return settings;
}

TrainNumerics TrainNumerics::from_config(const Config& config) {
  TrainNumerics numerics;
  numerics.rope_type = config.get_string("rope_type");
  numerics.enable_dropout = config.get_bool("enable_dropout");
  numerics.dropout_rate = config.get_float("dropout_rate");
  numerics.mlp_activations_limit = config.get_float("mlp_activations_limit");
  numerics.num_experts = config.get_int("num_experts");
  numerics.routed_score_func = config.get_string("routed_score_func");
  numerics.routed_bias = config.get_bool("routed_bias");
  numerics.n_routing_groups = config.get_int("n_routing_groups");
  numerics.load_balance_loss_weight = config.get_float("load_balance_loss_weight");
  numerics.final_logits_soft_cap = config.get_float("final_logits_soft_cap");
  numerics.logits_via_embedding = config.get_bool("logits_via_embedding");
  return numerics;
}

TrainSettings TrainSettings::from_config(const Config& config) {
  TrainSettings settings;
  settings.model_name = config.get_string("model_name");
  settings.tokenizer_path = config.get_string("tokenizer_path");
  settings.functional_dtype = config.get_string("functional_dtype");
  settings.functional_precision = config.get_string("functional_precision");
  settings.bf16_matmul_inputs = settings.functional_dtype == "bfloat16_matmul";
  settings.fast_kernels = settings.functional_precision == "fast";
  settings.steps = config.get_int("steps");
  settings.max_target_length = config.get_int("max_target_length");
  settings.eval_steps = config.get_int("eval_steps");
  settings.eval_interval = config.get_int("eval_interval");
  settings.gradient_clipping_threshold = config.get_float("gradient_clipping_threshold");
  settings.verify_tolerance = config.get_float("verify_tolerance");
  settings.abort_on_nan_loss = config.get_bool("abort_on_nan_loss");
  settings.abort_on_inf_loss = config.get_bool("abort_on_inf_loss");
  settings.schedule.peak = config.get_float("learning_rate");
  settings.schedule.schedule_steps = config.get_int("learning_rate_schedule_steps");
  settings.schedule.warmup_steps_fraction = config.get_float("warmup_steps_fraction");
  settings.schedule.final_fraction = config.get_float("cosine_learning_rate_final_fraction");
  settings.adamw.b1 = config.get_float("adam_b1");
  settings.adamw.b2 = config.get_float("adam_b2");
  settings.adamw.eps = config.get_float("adam_eps");
  settings.adamw.eps_root = config.get_float("adam_eps_root");
  settings.adamw.weight_decay = config.get_float("adam_weight_decay");
  // Read by the router biases' kAdamUpdate ops, which the program holds for deepseek4 only.
  settings.adamw.bias_update_rate = routed_bias_update_rate_from_config(config);
  settings.enable_checkpointing = config.get_bool("enable_checkpointing");
  settings.base_output_directory = config.get_string("base_output_directory");
  settings.run_name = config.get_string("run_name");
  settings.checkpoint_period = config.get_int("checkpoint_period");
  settings.load_parameters_path = config.get_string("load_parameters_path");
  settings.metrics_file = config.get_string("metrics_file");
  settings.token_viz_file = config.get_string("token_viz_file");
  settings.collective_timeout_seconds = config.get_float("collective_timeout_seconds");
  if (settings.steps == -1) {  // MaxText: steps -1 inherits learning_rate_schedule_steps
    settings.steps = settings.schedule.schedule_steps;
    if (settings.steps < 0) {
      throw UserError(
          "steps: -1 takes learning_rate_schedule_steps (as in MaxText), which is -1 "
          "too: give steps=N",
          "steps");
    }
  }
  return settings;
}

}  // namespace tpusim
