// sim/train/trainer.h: `tpusim train`, the real sharded training loop on simulated devices.
//
// Every device of the slice is an Executor running the per-device program in its own thread, at
// most num_threads of them computing at once (execution_slots.h); collectives meet in an
// InProcessCommunicator, or, under mpirun, the devices are spread over the ranks and collectives
// between ranks go through MPI (transport.h). The reduction order is fixed, so results are bitwise
// identical whatever the thread count, the scheduling or the number of ranks. A step: each device
// computes gradients on its shard of the global batch (MaxText's microbatching), the global
// gradient norm is clipped (gradient_clipping_threshold), then every device applies AdamW to its
// shard with the learning rate of the schedule (linear warm-up over warmup_steps_fraction, cosine
// decay to cosine_learning_rate_final_fraction over learning_rate_schedule_steps).
//
// With verify, an unsharded reference (one device, the same global batch) runs beside it and each
// step reports the largest relative difference in loss, gradients and updated weights.
//
// Example:
//   Trainer trainer(config);
//   std::vector<StepMetrics> curve = trainer.run({.verify = true}, std::cerr);
#pragma once

#include <array>
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
#include "sim/train/checkpoint.h"
#include "sim/train/dataset.h"
#include "sim/train/sharded_model.h"
#include "sim/train/train_settings.h"
#include "sim/transport/transport.h"

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
  // Under mpirun: what the step's collectives sent between ranks, summed over the ranks.
  std::optional<CrossProcessTraffic> traffic;
};

struct TrainOptions {
  bool verify = false;
  bool progress = true;
  // When set: after the first step, write <dump>/initial, <dump>/gradients and <dump>/updated
  // (checkpoint format: the weights before the step, their gradients, the weights after it) and
  // <dump>/step.json (the batch and the loss), for comparisons with independent references.
  std::string dump_directory;
};

// The functional engine computes MaxText's math for the switches it builds; a switch it does not
// build would silently train another model, so `tpusim train` refuses it: UserError naming the key.
// Every key configs/maxtext/train_keys.tsv classes as refused (sim/train/train_keys.h), set away
// from MaxText's default, plus the checks that depend on other keys' values (qk-norm with MLA).
void check_functional_support(const Config& config);

class Trainer {
 public:
  // `transport` nullptr: one process executes every device. Under MpiTransport, rank 0 writes the
  // metrics file, the progress lines and the checkpoints, and reads the checkpoint to resume from
  // (then shared with every rank); every rank reads the dataset itself.
  explicit Trainer(const Config& config, Transport* transport = nullptr);

  std::vector<StepMetrics> run(const TrainOptions& options, std::ostream& progress);

  double learning_rate(int64_t step) const;  // for the update that makes `step` (1-based)

 private:
  Config config_;           // a copy: the trainer outlives the caller's temporaries
  TrainSettings settings_;  // read from config_ once
  Dataset data_;
  std::unique_ptr<LocalTransport> own_transport_;
  Transport* transport_;
};

// Whether `path` names Hugging Face weights (a .safetensors file, or a directory with
// model.safetensors and no state.json) rather than a tpusim checkpoint directory.
bool is_hf_weights(const std::string& path);

// The weights at `path` for `config`'s model: a tpusim checkpoint directory (UserError naming the
// key when it was made from another model) or Hugging Face weights (hf_names.h, checked against
// the directory's config.json). Rank 0 reads them, every rank gets them.
Checkpoint load_model_weights(const std::string& path, const Config& config, Transport& transport);

// The config of the unsharded reference of `config`: one device, the same global batch.
Config unsharded_reference_config(const Config& config);

}  // namespace tpusim
