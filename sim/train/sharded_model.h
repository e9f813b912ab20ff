// sim/train/sharded_model.h: one sharded model on its simulated devices, the unit `tpusim train`
// steps.
//
// Every device of the slice this process executes is an Executor of the same per-device program,
// in its own thread, at most num_threads computing at once (execution_slots.h); collectives meet in
// an InProcessCommunicator or, under mpirun, cross ranks through MPI (transport.h). Global values
// (weights, moments, gradients) are gathered to rank 0 by "<region>/<tensor>#<layer>", whatever
// the mesh, stage count or rank count, so a checkpoint of one restores into any other.
//
// Example:
//   ShardedModel model(config);
//   const StepResult result = model.compute_gradients(batches);
//   model.apply_update(optimizer);
//   save_checkpoint(dir, model.to_checkpoint(step));
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "sharding/step_program.h"
#include "sim/functional/execution_slots.h"
#include "sim/functional/executor.h"
#include "sim/train/checkpoint.h"
#include "sim/train/dataset.h"
#include "sim/train/train_settings.h"
#include "sim/transport/transport.h"

namespace tpusim {

// collective_timeout_seconds as a duration, scaled in sanitizer builds (which run several times
// slower, so what is a hang in a normal build is only slowness there).
std::chrono::milliseconds collective_timeout(double seconds);

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
  // log-probability of every target token of that microbatch, [sequences, length], on every rank;
  // with its logits_position and vocab set, also every logit at that position, [sequences, vocab].
  StepResult compute_gradients(const std::vector<Batch>& microbatches,
                               TokenLogProbs* log_probs = nullptr);
  void apply_update(const DeviceContext::Optimizer& optimizer);

  // Global (unsharded) values by "<region>/<tensor>#<layer>": parameters, moments, gradients.
  // Gathered on rank 0; empty on the other ranks.
  std::map<std::string, std::vector<float>> global_state();
  std::map<std::string, std::vector<float>> global_gradients();
  // How many parameter and moment values are NaN or infinite, over every device of every rank
  // (collective; the same count on every rank).
  int64_t non_finite_state_values();

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
  ShardedModel(const Config& config, const FunctionalSettings& settings, Transport* transport);
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

}  // namespace tpusim
