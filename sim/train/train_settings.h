// sim/train/train_settings.h: the typed settings `tpusim train` runs with, read from the config
// once by their from_config factories (the only place sim/train reads config keys, besides
// Dataset::from_config and the checks of what the functional engine builds).
//
// Example:
//   const TrainSettings settings = TrainSettings::from_config(config);
//   settings.steps;                      // 200 (steps=200)
//   settings.schedule.peak;              // learning_rate
//   const FunctionalSettings numerics = FunctionalSettings::from_config(config);
//   numerics.bf16_matmul_inputs;         // functional_dtype=bfloat16_matmul
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "sim/functional/device_context.h"

namespace tpusim {

// What one ShardedModel computes with: its numerics, threads, seed and batch.
struct FunctionalSettings {
  std::string model_name;
  double per_device_batch_size = 0;
  int64_t gradient_accumulation_steps = 1;
  int64_t num_vocab_tiling = 1;
  int64_t num_threads = 0;  // 0: as many as the host has (resolve_num_threads)
  int64_t init_weights_seed = 0;
  double collective_timeout_seconds = 0;
  bool bf16_matmul_inputs = false;  // functional_dtype=bfloat16_matmul
  bool fast_kernels = false;        // functional_precision=fast

  static FunctionalSettings from_config(const Config& config);
};

// Keys that change only the numbers a step computes, which the functional engine checks against
// the math it builds (check_functional_support refuses the others).
struct TrainNumerics {
  std::string rope_type;
  bool enable_dropout = false;
  double dropout_rate = 0;
  double mlp_activations_limit = 0;
  int64_t num_experts = 0;
  std::string routed_score_func;
  bool routed_bias = false;
  int64_t n_routing_groups = 0;
  double load_balance_loss_weight = 0;
  double final_logits_soft_cap = 0;
  bool logits_via_embedding = false;

  static TrainNumerics from_config(const Config& config);
};

// The training loop's settings: schedule, optimizer, evaluation, checkpoints, outputs.
struct TrainSettings {
  // Linear warm-up over warmup_steps_fraction of schedule_steps, then cosine decay to
  // final_fraction of peak (learning_rate_schedule_steps <= 0: over `steps`).
  struct Schedule {
    double peak = 0;             // learning_rate
    int64_t schedule_steps = 0;  // learning_rate_schedule_steps
    double warmup_steps_fraction = 0;
    double final_fraction = 0;  // cosine_learning_rate_final_fraction
  };

  std::string model_name;
  std::string tokenizer_path;
  std::string functional_dtype;      // as written, for messages
  std::string functional_precision;  // as written, for messages
  bool bf16_matmul_inputs = false;   // functional_dtype=bfloat16_matmul
  bool fast_kernels = false;         // functional_precision=fast
  int64_t steps = 0;
  int64_t max_target_length = 0;
  int64_t eval_steps = 0;
  int64_t eval_interval = 0;
  double gradient_clipping_threshold = 0;
  double verify_tolerance = 0;  // <= 0: by the numerics of the run
  bool abort_on_nan_loss = false;
  bool abort_on_inf_loss = false;
  Schedule schedule;
  DeviceContext::Optimizer adamw;  // b1, b2, eps, eps_root, weight_decay (the rest per step)
  // Checkpoints: <base_output_directory>/<run_name>/checkpoints/<step>.
  bool enable_checkpointing = false;
  std::string base_output_directory;
  std::string run_name;
  int64_t checkpoint_period = 0;
  std::string load_parameters_path;
  std::string metrics_file;
  std::string token_viz_file;
  double collective_timeout_seconds = 0;

  static TrainSettings from_config(const Config& config);
};

}  // namespace tpusim
