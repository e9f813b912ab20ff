// model/ir/graph.h: the training step as a graph of ops on named-dim tensors, in regions.
//
// A region is a run of ops executed `repeat` times: MaxText scans the decoder layers
// (scan_layers), so the step is [embed x1] [layer x L] [head x1] forward, then the backward
// regions in reverse, then the optimizer. A repeated region holds ONE iteration's ops and tensors
// (one layer's weights, one layer's activations); totals multiply by `repeat`. This keeps the
// program's size independent of the layer count, which both interpreters rely on.
//
// Example:
//   Graph graph;
//   int layer = graph.add_region("decoder_layer", 32, Phase::kForward);
//   TensorId w = graph.add_tensor("mlp/wi_0", {{"embed", 4096, "embed"}, {"mlp", 14336, "mlp"}},
//                                 DType::kF32, TensorKind::kParameter, layer);
//   graph.add_op(OpKind::kEinsum, "mlp/wi_0", {h, w}, {g}, {.contracted = {"embed"}}, layer);
//   std::cout << graph.to_text();
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/container/deque.hpp>
#include <boost/container/options.hpp>

#include "model/ir/op.h"
#include "model/ir/tensor.h"

namespace tpusim {

// How a region runs as a pipeline stage's loop (Region::pipeline; layers_per_stage 0: it does not).
struct PipelineLoop {
  // Every layers_per_stage-th iteration hands the residual stream to the next stage.
  int64_t layers_per_stage = 0;
  // Layers the device holds (its stage's share), not one per iteration.
  int64_t parameter_sets = 0;
  // pipeline_delay_activation_forwarding: a hand-over is read an iteration later, so it overlaps
  // the next iteration instead of delaying it.
  bool delayed_forwarding = false;
  // Circular repeats with more microbatches than stages: the last stage's outputs wait in a
  // storage buffer for their next pass, which one more permute per iteration feeds.
  bool circular_storage = false;
  // pipeline_fsdp_ag_once: the stage's FSDP-sharded weights are gathered once before the loop
  // (and their gradients reduce-scattered once after it), not in every iteration.
  bool weights_gathered_once = false;

  bool operator==(const PipelineLoop& other) const = default;
};

struct Region {
  std::string name;
  int64_t repeat = 1;
  Phase phase = Phase::kForward;
  // For a backward region: the forward region it differentiates; for an optimizer region: the
  // forward region that owns the parameters it updates.
  int forward_region = -1;
  // True when every iteration reads the SAME parameters (the chunks of a tiled cross-entropy);
  // false for scanned layers, where each iteration has its own layer's weights.
  bool shared_parameters = false;
  // The decoder layers' loop of MaxText's SPMD pipeline (model/pipeline_schedule.h), and its
  // backward: `repeat` is iterations x layers per stage, one iteration of the region one layer.
  PipelineLoop pipeline;

  bool pipelined() const { return pipeline.layers_per_stage > 0; }
  // Distinct parameter sets the region's iterations read: 1 when shared, a pipeline stage's
  // layers, else one per iteration.
  int64_t parameter_sets() const {
    if (shared_parameters) {
      return 1;
    }
    return pipelined() ? pipeline.parameter_sets : repeat;
  }
};

// A deque that allocates `kBlock` elements at a time. Adding an element never moves the others
// (references stay valid while a builder extends the graph), as with std::deque, but libstdc++'s
// std::deque allocates a 512-byte block, i.e. one block per Op (400 bytes): the partitioner
// builds thousands of programs of hundreds of ops, and that was one heap allocation per op.
template <typename T, size_t kBlock>
using BlockDeque = boost::container::deque<
    T, void, boost::container::deque_options_t<boost::container::block_size<kBlock>>>;

class Graph {
 public:
  // Blocks of 32 ops (about 13 KB) and 64 tensors (about 7 KB): a per-device program has a few
  // hundred of each.
  using Ops = BlockDeque<Op, 32>;
  using Tensors = BlockDeque<Tensor, 64>;
  using Regions = BlockDeque<Region, 16>;

  int add_region(const std::string& name, int64_t repeat, Phase phase, int forward_region = -1,
                 bool shared_parameters = false);

  TensorId add_tensor(std::string name, std::vector<Dim> dims, DType dtype, TensorKind kind,
                      int region, std::string remat_name = "");

  // Adds an op; its phase is the region's. Returns the op id.
  int add_op(OpKind kind, std::string name, std::vector<TensorId> inputs,
             std::vector<TensorId> outputs, OpAttrs attrs, int region);

  // As add_tensor and add_op, with the texts and lists copied straight into the new tensor or op
  // (the partitioner's names and operand lists are built in reused buffers).
  TensorId add_tensor_copy(std::string_view name, std::span<const Dim> dims, DType dtype,
                           TensorKind kind, int region, std::string_view remat_name = {});
  int add_op_copy(OpKind kind, std::string_view name, std::span<const TensorId> inputs,
                  std::span<const TensorId> outputs, const OpAttrs& attrs, int region);

  const Tensor& tensor(TensorId id) const { return tensors_.at(static_cast<size_t>(id)); }
  Tensor& mutable_tensor(TensorId id) { return tensors_.at(static_cast<size_t>(id)); }
  const Tensors& tensors() const { return tensors_; }
  const Ops& ops() const { return ops_; }
  Op& mutable_op(int id) { return ops_.at(static_cast<size_t>(id)); }
  const Regions& regions() const { return regions_; }
  const Region& region(int id) const { return regions_.at(static_cast<size_t>(id)); }
  Region& mutable_region(int id) { return regions_.at(static_cast<size_t>(id)); }

  // The op that writes `id`, or -1 (parameters and inputs have none).
  int producer(TensorId id) const;

  // Replaces every op by `ops`, in that order (a rewrite of the program); each keeps its phase and
  // gets its index as id. Taken as the graph's own storage, so a rewrite that moves the kept ops
  // into it moves each op once.
  void replace_ops(Ops ops);

  // A carry: the value of `from` when its region ends becomes `to` (the residual stream between
  // regions, and from one iteration of a repeated region to the next when from and to share it).
  // Into or out of a region whose iterations share parameters (a chunked head, num_vocab_tiling
  // = T), the chunk-sized end is T times shorter in one dim: iteration c reads (or writes) chunk
  // c of the whole tensor.
  struct Carry {
    TensorId from = -1;
    TensorId to = -1;
  };
  void add_carry(TensorId from, TensorId to) { carries_.push_back({from, to}); }
  const std::vector<Carry>& carries() const { return carries_; }

  // Readable listing: regions with their repeat count, then one line per op:
  //   einsum mlp/wi_0 (x[batch:8,...] bf16, w[...] f32) -> g[...] bf16 contract {embed}
  //   (a dropless MoE's grouped matmuls and ragged all-to-alls end in "routed 0.5": the fraction of
  //   their rows balanced routing fills, which FLOPs and bytes count)
  std::string to_text(int only_region = -1) const;

 private:
  // Records op `id` as the producer of `outputs` (each written by one op only).
  void set_producer(std::span<const TensorId> outputs, int id);
  // A new tensor with its id, dtype, kind and region, written by no op yet (name, dims and
  // remat name left to the caller).
  Tensor& append_tensor(DType dtype, TensorKind kind, int region);
  // A new op with its id, kind, operands, region and the region's phase (name and attrs left to
  // the caller).
  Op& append_op(OpKind kind, std::span<const TensorId> inputs, std::span<const TensorId> outputs,
                int region);

  // Block deques: adding a tensor, op or region never moves the existing ones, so references to
  // them stay valid while a builder extends the graph.
  Regions regions_;
  Tensors tensors_;
  Ops ops_;
  std::vector<int> producer_;  // by tensor id
  std::vector<Carry> carries_;
};

}  // namespace tpusim
