// sim/functional/pipeline_loop.cpp: a pipeline stage's loop on one simulated device.
//
// MaxText's SPMD pipeline (model/pipeline_schedule.h; MaxText layers/pipeline.py), as the
// program lays it out: the decoder layers' region runs T = M R + S - 1 iterations of k layers on
// one microbatch, and after each iteration three permutes over `stage` move one microbatch-sized
// buffer a stage each (ring_shift in the program):
//   - the hand-over: every stage's output to the next stage, which reads it as its next input;
//   - the input stream (MaxText's state_io): each device keeps M/S microbatch slots, at first its
//     own microbatches (the rows of its embedding output, block q = slot q). In iteration t, slot
//     t mod M/S moves one stage toward stage 0, stage 0 reads it as its input while the first pass
//     lasts (it holds microbatch t then), and the last stage puts its output into it. After the
//     loop each stage's slots hold the final outputs of its own microbatches: microbatch q of the
//     stage in slot (q + S - 1) mod M/S;
//   - with circular repeats and M > S, the storage: the last stage's output goes to stage 0, which
//     keeps it until that microbatch's next pass (MaxText's circ_storage); with M = S the
//     hand-over itself carries it around the ring.
// Stage s works on work item w = t - s (microbatch w mod M, repeat w div M) when 0 <= w < M R;
// otherwise (the bubble) it computes on zeros, and its results are never read. Its layer j of
// repeat r is parameter slot r k + j (layer r S k + s k + j of the model).
//
// The backward loop runs the iterations in reverse with every data movement transposed: the
// hand-over's gradient goes back a stage, the stream's gradients move up toward the last stage
// (starting from the head's input gradient, arranged as the final outputs were), and stage 0's
// stored inputs send their gradients back to the last stage. Gradients of bubble iterations are
// zero, so every parameter slot sums exactly its M microbatches' contributions.
//
// Which sequences form a microbatch is the device's own choice (its rows, block by block), so no
// resharding precedes the loop; the sums over sequences do not depend on it (the engine runs
// dense layers and dropless MoE, where sequences do not interact).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/autodiff/training_step.h"
#include "sharding/mesh.h"
#include "sharding/partitioner.h"
#include "sim/functional/executor.h"

namespace tpusim {
namespace {

// The loop's tensors and hand-over ops, found from its carries and op names.
struct LoopParts {
  TensorId input = -1;       // the iteration's input (forward: stage input; backward: output grad)
  TensorId output = -1;      // the iteration's result (forward: stage output; backward: input grad)
  TensorId outside_in = -1;  // the carry source before the loop (embedding out / head grad)
  TensorId outside_out = -1;  // the carry target after the loop (head input / embedding grad)
  const Op* shift = nullptr;
  const Op* stream = nullptr;
  const Op* storage = nullptr;
  std::vector<const Op*> layer_ops;
};

LoopParts loop_parts(const Graph& graph, int region) {
  LoopParts parts;
  for (const Op& op : graph.ops()) {
    if (op.region != region) {
      continue;
    }
    if (op.kind == OpKind::kCollectivePermute && op.name.ends_with("/stage_permute")) {
      parts.shift = &op;
      parts.output = op.inputs[0];
    } else if (op.kind == OpKind::kCollectivePermute && op.name.ends_with("/stream_permute")) {
      parts.stream = &op;
    } else if (op.kind == OpKind::kCollectivePermute && op.name.ends_with("/storage_permute")) {
      parts.storage = &op;
    } else {
      parts.layer_ops.push_back(&op);
    }
  }
  for (const Graph::Carry& carry : graph.carries()) {
    const Tensor& from = graph.tensor(carry.from);
    const Tensor& to = graph.tensor(carry.to);
    if (to.region == region) {
      parts.input = carry.to;
      if (from.region != region) {
        parts.outside_in = carry.from;
      }
    }
    if (carry.from == parts.output && to.region != region) {
      parts.outside_out = carry.to;
    }
  }
  if (parts.shift == nullptr || parts.stream == nullptr || parts.input < 0 ||
      parts.outside_in < 0 || parts.outside_out < 0) {
    throw std::logic_error("functional engine: pipeline loop '" + graph.region(region).name +
                           "' lacks its hand-overs or carries");
  }
  return parts;
}

// A loop as one device runs it: its parts, this device's stage, the stream's slots per stage
// (M / S) and the work items (M R), and whether the circular storage is there.
struct DeviceLoop {
  LoopParts parts;
  int64_t stage = 0;
  int64_t stages = 1;
  int64_t slots_per_stage = 1;
  int64_t work_items = 0;
  bool storage = false;
};

DeviceLoop loop_on_device(const Graph& graph, const PipelineSchedule& p, int region,
                          const DeviceContext& device) {
  DeviceLoop loop;
  loop.parts = loop_parts(graph, region);
  loop.stage = device.coordinates[static_cast<size_t>(mesh_axis_index("stage"))];
  loop.stages = p.stages;
  loop.slots_per_stage = p.microbatches / p.stages;
  loop.work_items = p.microbatches * p.repeats;
  loop.storage = loop.parts.storage != nullptr;
  return loop;
}

// Block `block` of `blocks` equal row blocks of `whole` (a [rows, ...] tensor, rows first).
std::vector<float> rows_block(const TensorData& whole, int64_t block, int64_t blocks) {
  const size_t size = whole.values.size() / static_cast<size_t>(blocks);
  const auto begin = whole.values.begin() + static_cast<std::ptrdiff_t>(size * block);
  return {begin, begin + static_cast<std::ptrdiff_t>(size)};
}

void add_into(std::vector<float>& sum, const std::vector<float>& values) {
  for (size_t index = 0; index < sum.size(); ++index) {
    sum[index] += values[index];
  }
}

}  // namespace

void Executor::check_pipeline_loops() const {
  const PipelineSchedule& p = program_.step->forward_info.pipeline;
  for (int region = 0; region < static_cast<int>(graph_.regions().size()); ++region) {
    if (!graph_.region(region).pipelined() || graph_.region(region).phase != Phase::kForward) {
      continue;
    }
    // Each device's microbatch slots are row blocks of its own sequences (no resharding before
    // the loop), so a microbatch must leave every device of its batch split a whole sequence.
    // The performance model pads such a microbatch (as XLA would); the engine cannot.
    const LoopParts parts = loop_parts(graph_, region);
    const Tensor& microbatch = graph_.tensor(parts.input);
    const Tensor& own = graph_.tensor(parts.outside_in);
    const int64_t slots = p.microbatches / p.stages;
    const Dim& batch = microbatch.dims.front();
    int64_t splits = 1;
    for (const std::string& axis : batch.sharded_over) {
      splits *= device_.sizes[static_cast<size_t>(mesh_axis_index(axis))];
    }
    const int64_t rows = own.dims.front().size;
    if (batch.whole_size() % splits != 0 || batch.size * slots != rows) {
      throw UserError(
          "num_pipeline_microbatches=" + std::to_string(p.microbatches) + ": a microbatch of " +
              std::to_string(batch.whole_size()) + " sequences does not give each of the " +
              std::to_string(splits) +
              " devices it is split over a whole sequence; tpusim train needs whole sequences "
              "(each device holds " +
              std::to_string(rows) + " for " + std::to_string(slots) +
              " microbatch slots): use fewer microbatches or a larger per_device_batch_size",
          "num_pipeline_microbatches");
    }
  }
}

int64_t Executor::model_layer_on(const Tensor& tensor, int64_t slot,
                                 const DeviceContext& device) const {
  return model_layer_in(tensor.region, slot, device);
}

int64_t Executor::model_layer_in(int region, int64_t slot, const DeviceContext& device) const {
  if (!graph_.region(region).pipelined()) {
    return slot;
  }
  const PipelineSchedule& schedule = program_.step->forward_info.pipeline;
  const int64_t stage = device.coordinates[static_cast<size_t>(mesh_axis_index("stage"))];
  const int64_t k = schedule.layers_per_stage;
  return (slot / k) * schedule.stages * k + stage * k + slot % k;
}

TensorData Executor::hand_over(const Op& op, const TensorData& input) {
  TensorData output;
  communicator_.run(graph_, op, device_, input, output);
  counters_.collective_bytes += static_cast<double>(collective_bytes(graph_, op));
  ++counters_.collectives;
  return output;
}

void Executor::run_pipeline_loop(int region, int microbatch) {
  if (graph_.region(region).phase == Phase::kForward) {
    run_forward_loop(region, microbatch);
  } else {
    run_backward_loop(region, microbatch);
  }
  layer_ = 0;
  weight_slot_ = -1;
  for (const auto& [slot, gathered] : gathered_once_) {
    live_bytes_ -= graph_.tensor(graph_.ops()[static_cast<size_t>(slot.first)].outputs[0]).bytes();
  }
  gathered_once_.clear();
}

void Executor::run_loop_op(const Op& op, int microbatch) {
  // pipeline_fsdp_ag_once: a weight gather runs once per parameter slot the stage holds, and the
  // gathered weights stay (counted live) until the loop ends; later iterations read them.
  if (op.kind != OpKind::kAllGather || op.attrs.iteration_share >= 1) {
    run_op(op, microbatch);
    return;
  }
  const std::pair<int, int64_t> slot = {op.id, weight_slot_};
  const auto found = gathered_once_.find(slot);
  if (found != gathered_once_.end()) {
    allocate(op.outputs[0]).values = found->second.values;
    for (const TensorId dead : dead_after_[static_cast<size_t>(op.id)]) {
      release(dead);
    }
    return;
  }
  run_op(op, microbatch);
  gathered_once_[slot] = value(op.outputs[0]);
  live_bytes_ += graph_.tensor(op.outputs[0]).bytes();
  counters_.peak_bytes = std::max(counters_.peak_bytes, live_bytes_);
}

void Executor::run_forward_loop(int region, int microbatch) {
  const PipelineSchedule& p = program_.step->forward_info.pipeline;
  const auto [parts, stage, stages, slots_per_stage, work_items, storage] =
      loop_on_device(graph_, p, region, device_);
  const std::vector<float> zeros(static_cast<size_t>(graph_.tensor(parts.input).num_elements()),
                                 0.0f);
  // The input stream: this device's microbatches (rows of its embedding output), slot by slot.
  const TensorData& embedded = value(parts.outside_in);
  std::vector<TensorData> stream(static_cast<size_t>(slots_per_stage));
  for (int64_t slot = 0; slot < slots_per_stage; ++slot) {
    stream[static_cast<size_t>(slot)] = TensorData::zeros(graph_.tensor(parts.input));
    stream[static_cast<size_t>(slot)].values = rows_block(embedded, slot, slots_per_stage);
  }
  std::vector<std::vector<float>> stored(storage ? static_cast<size_t>(p.microbatches) : 0, zeros);
  std::vector<float> received = zeros;  // the previous stage's output of the last iteration
  // The loop's buffers, live through it as the memory model counts them: the stream's slots, the
  // hand-over and the storage.
  const int64_t buffer_bytes =
      graph_.tensor(parts.input).bytes() * (slots_per_stage + 1 + (storage ? p.microbatches : 0));
  live_bytes_ += buffer_bytes;
  counters_.peak_bytes = std::max(counters_.peak_bytes, live_bytes_);
  for (int64_t t = 0; t < p.iterations(); ++t) {
    const int64_t work = t - stage;
    const bool busy = work >= 0 && work < work_items;
    const int64_t repeat = busy ? work / p.microbatches : 0;
    std::vector<float> input = zeros;
    if (busy && stage > 0) {
      input = received;
    } else if (busy && repeat == 0) {
      input = stream[static_cast<size_t>(t % slots_per_stage)].values;
    } else if (busy) {
      input = storage ? stored[static_cast<size_t>(work % p.microbatches)] : received;
    }
    for (int64_t j = 0; j < p.layers_per_stage; ++j) {
      layer_ = t * p.layers_per_stage + j;
      weight_slot_ = repeat * p.layers_per_stage + j;
      allocate(parts.input).values = j == 0 ? input : value(parts.output).values;
      for (const Op* op : parts.layer_ops) {
        run_loop_op(*op, microbatch);
      }
    }
    // The hand-overs after the iteration.
    const TensorData& out = value(parts.output);
    received = hand_over(*parts.shift, out).values;
    const size_t slot = static_cast<size_t>(t % slots_per_stage);
    TensorData moved = hand_over(*parts.stream, stream[slot]);
    stream[slot].values = stage == stages - 1 ? out.values : moved.values;
    if (storage) {
      const TensorData last = hand_over(*parts.storage, out);
      const int64_t last_work = t - (stages - 1);
      if (stage == 0 && last_work >= 0 && last_work < p.microbatches * (p.repeats - 1)) {
        stored[static_cast<size_t>(last_work % p.microbatches)] = last.values;
      }
    }
  }
  live_bytes_ -= buffer_bytes;
  // This stage's microbatch q finished in slot (q + S - 1) mod M/S.
  TensorData& head_input = allocate(parts.outside_out);
  const size_t block = head_input.values.size() / static_cast<size_t>(slots_per_stage);
  for (int64_t q = 0; q < slots_per_stage; ++q) {
    const std::vector<float>& done =
        stream[static_cast<size_t>((q + stages - 1) % slots_per_stage)].values;
    std::copy(done.begin(), done.end(),
              head_input.values.begin() + static_cast<std::ptrdiff_t>(block * q));
  }
}

void Executor::run_backward_loop(int region, int microbatch) {
  const PipelineSchedule& p = program_.step->forward_info.pipeline;
  const auto [parts, stage, stages, slots_per_stage, work_items, storage] =
      loop_on_device(graph_, p, region, device_);
  const TensorData like = TensorData::zeros(graph_.tensor(parts.input));
  const std::vector<float> zeros = like.values;
  // The stream's gradients start as the head's input gradient, laid out as the outputs were.
  const TensorData& head_grad = value(parts.outside_in);
  std::vector<TensorData> stream(static_cast<size_t>(slots_per_stage), like);
  for (int64_t q = 0; q < slots_per_stage; ++q) {
    stream[static_cast<size_t>((q + stages - 1) % slots_per_stage)].values =
        rows_block(head_grad, q, slots_per_stage);
  }
  std::vector<std::vector<float>> stored(storage ? static_cast<size_t>(p.microbatches) : 0, zeros);
  TensorData next_input_grad = like;  // gradient of the input of iteration t + 1, to hand back
  // The loop's buffers, live through it as the memory model counts them: the stream's slots, the
  // hand-over and the storage.
  const int64_t buffer_bytes =
      graph_.tensor(parts.input).bytes() * (slots_per_stage + 1 + (storage ? p.microbatches : 0));
  live_bytes_ += buffer_bytes;
  counters_.peak_bytes = std::max(counters_.peak_bytes, live_bytes_);
  for (int64_t t = p.iterations() - 1; t >= 0; --t) {
    // The transposed hand-overs of the end of iteration t.
    const std::vector<float> from_next = hand_over(*parts.shift, next_input_grad).values;
    const size_t slot = static_cast<size_t>(t % slots_per_stage);
    const std::vector<float> own_slot = stream[slot].values;
    const TensorData moved = hand_over(*parts.stream, stream[slot]);
    stream[slot].values = stage > 0 ? moved.values : zeros;
    std::vector<float> from_storage = zeros;
    if (storage) {
      const int64_t last_work = t - (stages - 1);
      const bool kept =
          stage == 0 && last_work >= 0 && last_work < p.microbatches * (p.repeats - 1);
      TensorData sent = like;
      if (kept) {
        sent.values = stored[static_cast<size_t>(last_work % p.microbatches)];
      }
      from_storage = hand_over(*parts.storage, sent).values;
    }
    const int64_t work = t - stage;
    const bool busy = work >= 0 && work < work_items;
    const int64_t repeat = busy ? work / p.microbatches : 0;
    std::vector<float> output_grad = zeros;
    if (busy && stage < stages - 1) {
      output_grad = from_next;
    } else if (busy) {
      // The last stage: its output went into the stream, and (before the last pass) on to stage
      // 0, through the storage or around the ring.
      output_grad = own_slot;
      if (repeat < p.repeats - 1) {
        add_into(output_grad, storage ? from_storage : from_next);
      }
    }
    for (int64_t j = p.layers_per_stage - 1; j >= 0; --j) {
      layer_ = t * p.layers_per_stage + j;
      weight_slot_ = repeat * p.layers_per_stage + j;
      allocate(parts.input).values =
          j == p.layers_per_stage - 1 ? output_grad : value(parts.output).values;
      for (const Op* op : parts.layer_ops) {
        run_loop_op(*op, microbatch);
      }
      accumulate_final_gradients(region);
    }
    // Where this iteration's input came from gets its gradient.
    const std::vector<float>& input_grad = value(parts.output).values;
    // From the previous stage, or on stage 0 around the ring from the last stage (circular, no
    // storage): back the way it came. From the stream (first pass) or the storage: into them.
    const bool into_stream = stage == 0 && repeat == 0;
    const bool into_storage = stage == 0 && repeat > 0 && storage;
    next_input_grad.values = busy && !into_stream && !into_storage ? input_grad : zeros;
    if (busy && into_stream) {
      add_into(stream[slot].values, input_grad);
    } else if (busy && into_storage) {
      stored[static_cast<size_t>(work % p.microbatches)] = input_grad;
    }
  }
  live_bytes_ -= buffer_bytes;
  // The stream now holds the gradients of this device's microbatches: the embedding's.
  TensorData& embedding_grad = allocate(parts.outside_out);
  const size_t block = embedding_grad.values.size() / static_cast<size_t>(slots_per_stage);
  for (int64_t q = 0; q < slots_per_stage; ++q) {
    const std::vector<float>& done = stream[static_cast<size_t>(q)].values;
    std::copy(done.begin(), done.end(),
              embedding_grad.values.begin() + static_cast<std::ptrdiff_t>(block * q));
  }
}

}  // namespace tpusim
