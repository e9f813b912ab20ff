// sim/functional/executor.h: runs the per-device program with real numbers on one device.
//
// One Executor per simulated device interprets the SAME program the performance model times:
// regions in order, a scanned region once per layer (iteration k of a forward region is layer k,
// of its backward region layer R-1-k, of its optimizer region layer k), compute ops through the
// kernels, collectives through the Communicator (which meets the other devices). The executor
// owns the device's state: per-layer parameters and Adam moments, per-layer saved activations
// between a layer's forward and backward, gradients until the update. It counts what it really
// does: matmul FLOPs executed by einsums and attention (a dropless MoE's grouped matmuls: the
// rows routing really filled, which balance only on average), bytes handed to collectives, and
// the peak of bytes allocated (in the IR's dtypes, so it compares with the memory model). A value
// is freed after the op that reads it last, as sim/memory/liveness.h (shared with the memory
// model) says, unless it lives on: state, final gradients, carry ends, the batch and the loss.
//
// A chunked head (num_vocab_tiling = T: the head region and its backward repeat T times over the
// same parameters, each iteration on 1/T of the tokens) runs chunk c on iteration c (backward:
// T-1-c). A carry between a whole tensor and a chunk-sized one (they differ in one dim, T times)
// moves chunk c: into the head (and again into its backward, which reads the head's input) it
// slices the device's local tokens [c L/T, (c+1) L/T) of each sequence, out of the head's
// backward it writes them; the targets are read for chunk c; the loss adds up over chunks; and a
// parameter gradient the head's backward hands to another region (the tied embedding's) is summed
// over chunks, like the head's own parameter gradients.
//
// Example (one thread per device):
//   Executor executor(program, device, communicator);
//   executor.initialize_parameters(seed);
//   executor.set_batch(tokens, targets);     // this device's shard of the global batch
//   StepResult result = executor.run_step(optimizer);
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "sharding/step_program.h"
#include "sim/functional/communicator.h"
#include "sim/functional/device_context.h"
#include "sim/functional/tensor_data.h"
#include "sim/memory/liveness.h"

namespace tpusim {

struct ExecutionCounters {
  double einsum_flops = 0;    // 2 x M x K x N of every einsum executed
  double einsum_seconds = 0;  // wall time inside the einsum kernels (their speed: benchmarks/)
  // Per-device array V of every collective, as the network model counts it (a dropless MoE's
  // ragged all-to-all: the rows balanced routing fills, what a ragged exchange moves on average;
  // the in-process transport copies its whole padded buffer).
  double collective_bytes = 0;
  int64_t collectives = 0;
  int64_t peak_bytes = 0;  // of live tensors, in the IR's dtypes
};

struct StepResult {
  double loss = 0;       // mean over the global batch (over microbatches)
  double grad_norm = 0;  // global L2 norm of the gradients, before clipping (this device's
                         // sum of squares; the trainer combines devices)
  ExecutionCounters counters;
};

class Executor {
 public:
  Executor(const StepProgram& program, DeviceContext device, Communicator& communicator);

  // Deterministic initialization by GLOBAL element index, so every sharding gets the same model:
  // each parameter as MaxText initializes it (the builder's ForwardGraph::initializers: norm
  // scales 1, biases 0, embedding tables N(0, 1), kernels variance-scaled truncated normals over
  // their fan-in, the query's carrying 1/sqrt(head_dim)); Adam moments 0.
  void initialize_parameters(uint64_t seed);

  // The global tokens and targets of every microbatch of the step, each [sequences, length]
  // row-major (every device gets the whole batch and reads its own shard by its offsets).
  void set_batch(const std::vector<std::vector<int32_t>>& tokens,
                 const std::vector<std::vector<int32_t>>& targets);

  // Forward and backward of every microbatch; returns the loss and this device's part of the
  // squared gradient norm. Gradients are averaged over microbatches.
  StepResult compute_gradients();

  // The optimizer regions with `optimizer` (learning rate, step, clipping scale).
  void apply_update(const DeviceContext::Optimizer& optimizer);

  // Parameter and moment state by (tensor name, layer), for checkpoints and comparisons.
  struct NamedState {
    std::string name;   // "<region>/<tensor>"
    int64_t layer = 0;  // the model's layer (a pipeline stage's slot r k + j: r S k + s k + j)
    int64_t slot = 0;   // this device's slot of it
    const Tensor* tensor = nullptr;  // local tensor (dims with offsets)
    TensorData* data = nullptr;
  };
  std::vector<NamedState> state();
  // Gradients by parameter (after compute_gradients), same naming.
  std::vector<NamedState> gradients();

  // The model's layer of parameter slot `slot` of `tensor` on `device` (the same program on
  // every device; a pipeline stage's slots hold its own layers).
  int64_t model_layer_on(const Tensor& tensor, int64_t slot, const DeviceContext& device) const;

  const ExecutionCounters& counters() const { return counters_; }
  const DeviceContext& device() const { return device_; }
  // While set (not nullptr), the loss records each target token's log-probability in `sink`.
  void record_token_log_probs(TokenLogProbs* sink) { device_.token_log_probs = sink; }

 private:
  using Key = std::pair<TensorId, int64_t>;  // (local tensor, layer; 0 when not per-layer)
  Key key(TensorId id) const;
  TensorData& value(TensorId id);
  TensorData& allocate(TensorId id);
  void release(TensorId id);
  void recycle(std::vector<float>&& values);  // keeps a released buffer for reuse
  void fill_input(TensorId id, int microbatch);
  void run_region(int region, int microbatch);
  // Moves chunk chunk_ of a chunked carry: into its chunk-sized end, or (from_chunk) out of it.
  void copy_chunk(const Graph::Carry& carry, bool from_chunk);
  void run_op(const Op& op, int microbatch);
  // Refuses (UserError) a pipeline whose microbatch leaves a device part of a sequence.
  void check_pipeline_loops() const;
  // A pipeline stage's loop, forward or backward (sim/functional/pipeline_loop.cpp).
  void run_pipeline_loop(int region, int microbatch);
  void run_forward_loop(int region, int microbatch);
  void run_backward_loop(int region, int microbatch);
  // Runs an op of a pipeline loop (a weight gather under pipeline_fsdp_ag_once once per slot).
  void run_loop_op(const Op& op, int microbatch);
  // Runs a hand-over permute of the loop on `input` (not the op's own input tensor, which only
  // sizes it), counting its bytes as run_op does.
  TensorData hand_over(const Op& op, const TensorData& input);
  // The model's layer number of parameter slot `slot` of `region` on `device` (a pipeline stage
  // holds layers r S k + s k + j in slots r k + j; elsewhere the slot is the layer).
  int64_t model_layer_in(int region, int64_t slot, const DeviceContext& device) const;
  int64_t model_layer(int region, int64_t slot) const {
    return model_layer_in(region, slot, device_);
  }
  // Adds the iteration's final gradients of `region` into the step's sums, by layer slot.
  void accumulate_final_gradients(int region);
  bool owns_global_element(const Tensor& tensor) const;
  // Constructor parts: the chunked head's regions, carries and the gradients it sums over chunks;
  // then which values are stored per layer and after which op each one is freed.
  void plan_chunked_heads();
  void plan_storage();

  const StepProgram& program_;
  const Graph& graph_;
  const Liveness liveness_;  // when each value dies, which ones live on
  DeviceContext device_;
  Communicator& communicator_;
  std::vector<int64_t> region_chunks_;  // T for the regions of a chunked head, else 1
  std::vector<bool> chunked_carry_;     // by carry index: its ends differ in size (a chunk)
  std::vector<bool> pipeline_carry_;    // by carry index: into, out of or around a pipeline loop
  std::vector<std::vector<TensorId>> summed_over_chunks_;  // by region: gradients handed out
  std::map<TensorId, TensorData> chunk_sums_;
  int64_t chunk_ = 0;                              // chunk of the region iteration being run
  int64_t chunks_ = 1;                             // chunks of the region being run
  std::vector<bool> per_layer_;                    // stored once per layer of a scanned region
  std::vector<std::vector<TensorId>> dead_after_;  // by op id: values never read again
  std::vector<TensorId> final_grads_;              // local gradients of the parameters
  std::set<TensorId> bias_loads_;  // router biases' expert loads (summed over microbatches)
  std::map<TensorId, TensorId> grad_of_parameter_;
  std::map<Key, TensorData> values_;
  // Buffers of released values by element count, reused by later allocations of that size.
  std::unordered_map<size_t, std::vector<std::vector<float>>> spare_;
  int64_t spare_bytes_ = 0;
  int64_t max_live_bytes_ = 0;
  std::map<Key, TensorData> accumulated_;  // gradients summed over microbatches
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<std::vector<int32_t>> targets_;
  int64_t layer_ = 0;         // layer of the region iteration being run
  int64_t weight_slot_ = -1;  // in a pipeline loop: the parameter slot of this iteration
  // Under pipeline_fsdp_ag_once: gathered weights by (gather op, parameter slot), for one loop.
  std::map<std::pair<int, int64_t>, TensorData> gathered_once_;
  TensorId loss_ = -1;  // local tensor holding the complete loss
  // Local scalars each iteration of their region adds to the loss (ForwardGraph::
  // auxiliary_losses: MaxText's load-balance loss of each routed MoE layer).
  std::vector<TensorId> auxiliary_losses_;
  double loss_sum_ = 0;
  DeviceContext::Optimizer optimizer_;
  ExecutionCounters counters_;
  int64_t live_bytes_ = 0;
};

}  // namespace tpusim
