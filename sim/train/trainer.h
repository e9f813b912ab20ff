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
#include "sim/functional/transport.h"
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

// One sharded model: the program, the devices this process executes and their communicator.
// Under a distributed transport (mpirun) each rank builds the same program and executes its block
// of the devices (assign_devices_to_ranks); the calls below are then collective over the ranks:
// every rank makes them in the same order.
class ShardedModel {
 public:
  // `transport` nullptr: this process executes every device.
  explicit ShardedModel(const Config& config, Transport* transport = nullptr);

  const StepProgram& program() const { return program_; }
  int num_devices() const { return static_cast<int>(owner_.size()); }
  // The mesh devices this process executes, ascending.
  const std::vector<int>& local_devices() const { return devices_; }

  // Gradients of one optimizer step's batch (microbatches x sequences): the loss of device 0 and
  // the global gradient norm (every device's sum of squares, added in device order), with the
  // counters of this process's first device (device 0 on rank 0).
  // With `log_probs` (sequences and length set, the microbatch to record): also the
  // log-probability of every target token of that microbatch, [sequences, length], on every rank.
  StepResult compute_gradients(const std::vector<Batch>& microbatches,
                               TokenLogProbs* log_probs = nullptr);
  void apply_update(const DeviceContext::Optimizer& optimizer);

  // Global (unsharded) values by "<region>/<tensor>#<layer>": parameters, moments, gradients.
  // Gathered on rank 0; empty on the other ranks.
  std::map<std::string, std::vector<float>> global_state();
  std::map<std::string, std::vector<float>> global_gradients();

  // The model as a checkpoint (global arrays, whatever the sharding or the ranks; complete on
  // rank 0, empty elsewhere; metadata: model_name and the model_config keys that fix its math),
  // and back: a checkpoint written by one mesh or rank count restores
  // into any other mesh or rank count of the same model.
  Checkpoint to_checkpoint(int64_t step);
  // Restores parameters (and moments, when `with_optimizer`) of this process's devices; UserError
  // naming a missing tensor.
  void restore(const Checkpoint& checkpoint, bool with_optimizer);

  // Bytes moved between processes by the collectives so far (zero in one process).
  CrossProcessTraffic traffic() const { return communicator_->traffic(); }

 private:
  template <typename Work>
  void on_every_device(const Work& work);
  // Every device's blocks of the named tensors, placed into global arrays on rank 0.
  std::map<std::string, std::vector<float>> gather_global(bool gradients);

  std::unique_ptr<LocalTransport> own_transport_;
  Transport* transport_;
  StepProgram program_;
  nlohmann::json identity_;  // {"model_name": ..., "model_config": {...}} for checkpoints
  std::array<int, kNumMeshAxes> sizes_{};
  std::vector<int> owner_;    // rank of each mesh device
  std::vector<int> devices_;  // this rank's devices, ascending
  std::unique_ptr<ExecutionSlots> slots_;
  std::vector<std::unique_ptr<KernelThreads>> kernel_threads_;  // per device, when it has helpers
  std::unique_ptr<Communicator> communicator_;
  std::vector<std::unique_ptr<Executor>> executors_;  // one per entry of devices_
};

class Trainer {
 public:
  // `transport` nullptr: one process executes every device. Under MpiTransport, rank 0 writes the
  // metrics file, the progress lines and the checkpoints, and reads the checkpoint to resume from
  // (then shared with every rank); every rank reads the dataset itself.
  explicit Trainer(const Config& config, Transport* transport = nullptr);

  std::vector<StepMetrics> run(const TrainOptions& options, std::ostream& progress);

  double learning_rate(int64_t step) const;  // for the update that makes `step` (1-based)

 private:
  Config config_;  // a copy: the trainer outlives the caller's temporaries
  Dataset data_;
  std::unique_ptr<LocalTransport> own_transport_;
  Transport* transport_;
};

// The config of the unsharded reference of `config`: one device, the same global batch.
Config unsharded_reference_config(const Config& config);

}  // namespace tpusim
