// sim/train/trainer.h: `tpusim train`, the real sharded training loop on simulated devices.
//
// Every device of the slice is an Executor running the per-device program in its own thread, at
// most num_threads of them computing at once (execution_slots.h); collectives meet in an
// InProcessCommunicator (fixed reduction order, so results are bitwise identical whatever the
// thread count or the scheduling). A step: each device computes gradients on its shard of the
// global batch (MaxText's microbatching), the global gradient norm is clipped
// (gradient_clipping_threshold), then every device applies AdamW to its shard with the learning
// rate of the schedule (linear warm-up over warmup_steps_fraction, cosine decay to
// cosine_learning_rate_final_fraction over learning_rate_schedule_steps).
//
// With verify, an unsharded reference (one device, the same global batch) runs beside it and each
// step reports the largest relative difference in loss, gradients and updated weights.
//
// Example:
//   Trainer trainer(config);
//   std::vector<StepMetrics> curve = trainer.run({.verify = true}, std::cerr);
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "sharding/step_program.h"
#include "sim/functional/execution_slots.h"
#include "sim/functional/executor.h"
#include "sim/functional/in_process_communicator.h"
#include "sim/train/checkpoint.h"
#include "sim/train/dataset.h"

namespace tpusim {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of updates applied
  double loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  double tokens_per_s = 0;
  std::optional<double> eval_loss;
  std::optional<double> verify_max_rel_diff;  // the largest of the three below
  std::optional<double> verify_loss_rel_diff;
  std::optional<double> verify_gradient_rel_diff;
  std::optional<double> verify_weight_rel_diff;  // updated weights and Adam moments
  ExecutionCounters counters;                    // device 0's
};

struct TrainOptions {
  bool verify = false;
  bool progress = true;
  // When set: after the first step, write <dump>/initial, <dump>/gradients and <dump>/updated
  // (checkpoint format: the weights before the step, their gradients, the weights after it) and
  // <dump>/step.json (the batch and the loss), for comparisons with independent references.
  std::string dump_directory;
};

// One sharded model: the program, its devices and their communicator.
class ShardedModel {
 public:
  explicit ShardedModel(const Config& config);

  const StepProgram& program() const { return program_; }
  int num_devices() const { return static_cast<int>(executors_.size()); }

  // Gradients of one optimizer step's batch (microbatches x sequences): returns device 0's result
  // with the global gradient norm.
  StepResult compute_gradients(const std::vector<Batch>& microbatches);
  void apply_update(const DeviceContext::Optimizer& optimizer);

  // Global (unsharded) values by "<region>/<tensor>#<layer>": parameters, moments, gradients.
  std::map<std::string, std::vector<float>> global_state();
  std::map<std::string, std::vector<float>> global_gradients();

  // The model as a checkpoint (global arrays, whatever the sharding), and back: a checkpoint
  // written by one mesh restores into any other mesh of the same model.
  Checkpoint to_checkpoint(int64_t step);
  // Restores parameters (and moments, when `with_optimizer`); UserError naming a missing tensor.
  void restore(const Checkpoint& checkpoint, bool with_optimizer);

 private:
  template <typename Work>
  void on_every_device(const Work& work);

  StepProgram program_;
  std::unique_ptr<ExecutionSlots> slots_;
  std::unique_ptr<InProcessCommunicator> communicator_;
  std::vector<std::unique_ptr<Executor>> executors_;
};

class Trainer {
 public:
  explicit Trainer(const Config& config);

  std::vector<StepMetrics> run(const TrainOptions& options, std::ostream& progress);

  double learning_rate(int64_t step) const;  // for the update that makes `step` (1-based)

 private:
  Config config_;  // a copy: the trainer outlives the caller's temporaries
  Dataset data_;
};

// The config of the unsharded reference of `config`: one device, the same global batch.
Config unsharded_reference_config(const Config& config);

}  // namespace tpusim
