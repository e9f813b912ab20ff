#include "sim/functional/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <stdexcept>

#include "common/counter_hash.h"
#include "common/error.h"
#include "model/autodiff/training_step.h"
#include "model/builder/initializers.h"
#include "model/ir/op_flops.h"
#include "sim/functional/kernels.h"

namespace tpusim {
namespace {

// Standard normal from two uniforms of the counter stream (Box-Muller).
double normal(uint64_t seed, uint64_t name, uint64_t index) {
  const uint64_t a = splitmix64(seed ^ splitmix64(name ^ splitmix64(2 * index)));
  const uint64_t b = splitmix64(seed ^ splitmix64(name ^ splitmix64(2 * index + 1)));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;
  const double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// One element of a parameter drawn as `init` says, from the counter stream of (seed, name, index).
// A truncated normal redraws (from further streams of the same element) until |z| < 2, as jax's
// truncated_normal(-2, 2), then scales by stddev / kTruncatedNormalStd so the std is stddev.
double draw(const ParameterInit& init, uint64_t seed, uint64_t name, uint64_t index) {
  switch (init.distribution) {
    case InitDistribution::kConstant:
      return init.value;
    case InitDistribution::kNormal:
      return init.stddev * normal(seed, name, index);
    case InitDistribution::kTruncatedNormal:
      break;
  }
  constexpr double kBound = 2;
  double z = normal(seed, name, index);
  for (uint64_t attempt = 1; std::abs(z) >= kBound; ++attempt) {
    z = normal(seed, name ^ splitmix64(~attempt), index);
  }
  return z * init.stddev / kTruncatedNormalStd;
}

// The dim in which a chunk-sized tensor is `chunks` times shorter than the whole one, or a
// UserError naming num_vocab_tiling when the chunks do not split the device's tokens evenly.
size_t chunk_dim(const Tensor& whole, const Tensor& part, int64_t chunks) {
  const auto mismatch = [&](const std::string& why) {
    return UserError("num_vocab_tiling: " + std::to_string(chunks) + " chunks of '" + whole.name +
                     "' " + why);
  };
  if (whole.dims.size() != part.dims.size()) {
    throw mismatch("do not keep its dims");
  }
  std::optional<size_t> found;
  for (size_t index = 0; index < whole.dims.size(); ++index) {
    const Dim& outer = whole.dims[index];
    const Dim& inner = part.dims[index];
    if (outer.size == inner.size) {
      continue;
    }
    if (found || outer.size != inner.size * chunks) {
      throw mismatch("do not split this device's " + std::to_string(outer.size) + " '" +
                     outer.name + "' positions evenly (" + std::to_string(inner.size) +
                     " per chunk); choose num_vocab_tiling and the sequence sharding so that "
                     "they do");
    }
    found = index;
  }
  if (!found) {
    throw mismatch("have no chunked dim");
  }
  return *found;
}

}  // namespace

Executor::Executor(const StepProgram& program, DeviceContext device, Communicator& communicator)
    : program_(program),
      graph_(program.program.graph),
      liveness_(program_liveness(program)),
      device_(device),
      communicator_(communicator) {
  for (const auto& [parameter, grad] : local_parameter_grads(program)) {
    final_grads_.push_back(grad);
    grad_of_parameter_[parameter] = grad;
  }
  for (const TensorId load : router_bias_loads(graph_)) {
    bias_loads_.insert(load);
  }
  // The loss: the cross-entropy's output, or its all-reduce over the devices sharing the batch.
  loss_ = program.program.local_of_global[static_cast<size_t>(program.step->forward_info.loss)];
  for (const Op& op : graph_.ops()) {
    if (op.kind == OpKind::kAllReduce && op.inputs[0] == loss_) {
      loss_ = op.outputs[0];
    }
  }
  for (const TensorId global : program.step->forward_info.auxiliary_losses) {
    auxiliary_losses_.push_back(program.program.local_of_global[static_cast<size_t>(global)]);
  }
  plan_chunked_heads();
  plan_storage();
  check_pipeline_loops();
}

void Executor::plan_chunked_heads() {
  // The regions of a chunked head (num_vocab_tiling): its forward and backward repeat T times.
  region_chunks_.assign(graph_.regions().size(), 1);
  for (size_t region = 0; region < graph_.regions().size(); ++region) {
    const Region& info = graph_.region(static_cast<int>(region));
    if (info.shared_parameters && info.repeat > 1 && info.phase != Phase::kOptimizer) {
      region_chunks_[region] = info.repeat;
    }
  }
  for (const Graph::Carry& carry : graph_.carries()) {
    const Tensor& from = graph_.tensor(carry.from);
    const Tensor& to = graph_.tensor(carry.to);
    const bool into = region_chunks_[static_cast<size_t>(to.region)] > 1;
    const bool out = region_chunks_[static_cast<size_t>(from.region)] > 1;
    // A pipeline loop's carries (into it, out of it, around it) are its own to move
    // (sim/functional/pipeline_loop.cpp).
    const bool pipeline =
        graph_.region(to.region).pipelined() || graph_.region(from.region).pipelined();
    pipeline_carry_.push_back(pipeline);
    const bool chunked = !pipeline && (from.num_elements() != to.num_elements() || (into != out));
    chunked_carry_.push_back(chunked);
    if (!chunked) {
      continue;
    }
    if (into == out) {
      throw std::logic_error("functional engine: carry '" + from.name + "' -> '" + to.name +
                             "' changes size outside a chunked region");
    }
    const Tensor& part = into ? to : from;
    chunk_dim(into ? from : to, part, region_chunks_[static_cast<size_t>(part.region)]);
  }
  // The gradients a chunked head hands to other regions (the tied embedding's), summed over
  // chunks.
  summed_over_chunks_.assign(graph_.regions().size(), {});
  for (const Tensor& tensor : graph_.tensors()) {
    if (graph_.producer(tensor.id) < 0 || region_chunks_[static_cast<size_t>(tensor.region)] == 1 ||
        liveness_.is_carry_source(tensor.id) || liveness_.is_final_gradient(tensor.id) ||
        tensor.id == loss_ || !liveness_.read_outside_own_region(tensor.id)) {
      continue;
    }
    if (tensor.kind != TensorKind::kParameterGrad) {
      throw std::logic_error("functional engine: '" + tensor.name +
                             "' leaves a chunked region but is neither a carry nor a gradient");
    }
    summed_over_chunks_[static_cast<size_t>(tensor.region)].push_back(tensor.id);
  }
}

void Executor::plan_storage() {
  per_layer_.assign(graph_.tensors().size(), false);
  dead_after_.assign(graph_.ops().size(), {});
  for (const Tensor& tensor : graph_.tensors()) {
    const Region& region = graph_.region(tensor.region);
    const int owner = region.phase == Phase::kForward ? tensor.region : region.forward_region;
    const bool scanned =
        owner >= 0 && graph_.region(owner).repeat > 1 && !graph_.region(owner).shared_parameters;
    const bool persistent = liveness_.persistent(tensor.id);
    per_layer_[static_cast<size_t>(tensor.id)] =
        scanned && !liveness_.is_carry_source(tensor.id) &&
        (persistent || liveness_.read_outside_own_region(tensor.id));
    // Freed after the op that needs it last, unless it lives on (state, final gradients, carry
    // ends, the batch, the loss).
    const bool kept = persistent || liveness_.is_carry_end(tensor.id) ||
                      tensor.kind == TensorKind::kInput || tensor.id == loss_ ||
                      std::find(auxiliary_losses_.begin(), auxiliary_losses_.end(), tensor.id) !=
                          auxiliary_losses_.end();
    const int dies_after = liveness_.dies_after(tensor.id);
    if (!kept && dies_after != Liveness::kNone) {
      dead_after_[static_cast<size_t>(dies_after)].push_back(tensor.id);
    }
  }
}

Executor::Key Executor::key(TensorId id) const {
  const auto index = static_cast<size_t>(id);
  if (!per_layer_[index]) {
    return {id, 0};
  }
  // In a pipeline loop the stage's layers are its parameter slots, not the loop's iterations.
  return {id, weight_slot_ >= 0 && liveness_.persistent(id) ? weight_slot_ : layer_};
}

TensorData& Executor::allocate(TensorId id) {
  const Key slot = key(id);
  auto [it, inserted] = values_.try_emplace(slot);
  if (inserted) {
    const Tensor& tensor = graph_.tensor(id);
    const auto found = spare_.find(static_cast<size_t>(tensor.num_elements()));
    if (found != spare_.end() && !found->second.empty()) {
      // A buffer of the same size that an earlier op released: no allocation, no page faults.
      it->second.values = std::move(found->second.back());
      found->second.pop_back();
      spare_bytes_ -= static_cast<int64_t>(it->second.values.size() * sizeof(float));
      std::fill(it->second.values.begin(), it->second.values.end(), 0.0f);
      it->second.shape.clear();
      for (const Dim& dim : tensor.dims) {
        it->second.shape.push_back(dim.size);
      }
    } else {
      it->second = TensorData::zeros(tensor);
    }
    live_bytes_ += graph_.tensor(id).bytes();
    counters_.peak_bytes = std::max(counters_.peak_bytes, live_bytes_);
  }
  return it->second;
}

void Executor::recycle(std::vector<float>&& values) {
  // Kept up to the largest live set seen, so the spares never more than double the memory.
  const auto bytes = static_cast<int64_t>(values.size() * sizeof(float));
  max_live_bytes_ = std::max(max_live_bytes_, live_bytes_ + bytes);
  if (values.empty() || spare_bytes_ + bytes > max_live_bytes_) {
    return;
  }
  spare_bytes_ += bytes;
  spare_[values.size()].push_back(std::move(values));
}

TensorData& Executor::value(TensorId id) {
  const auto found = values_.find(key(id));
  if (found == values_.end()) {
    throw std::logic_error("functional engine: '" + graph_.tensor(id).name +
                           "' is read before it is written (layer " + std::to_string(layer_) + ")");
  }
  return found->second;
}

void Executor::release(TensorId id) {
  const auto found = values_.find(key(id));
  if (found != values_.end()) {
    live_bytes_ -= graph_.tensor(id).bytes();
    recycle(std::move(found->second.values));
    values_.erase(found);
  }
}

bool Executor::owns_global_element(const Tensor& tensor) const {
  std::set<std::string> split;
  for (const Dim& dim : tensor.dims) {
    split.insert(dim.sharded_over.begin(), dim.sharded_over.end());
  }
  // A pipeline stage's layers are its own: the stage axis splits them by layer.
  const Region& owner = graph_.region(tensor.region);
  const int forward = owner.phase == Phase::kForward ? tensor.region : owner.forward_region;
  if (forward >= 0 && graph_.region(forward).pipelined()) {
    split.insert("stage");
  }
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    if (device_.sizes[static_cast<size_t>(axis)] > 1 &&
        !split.contains(mesh_axis_names()[static_cast<size_t>(axis)]) &&
        device_.coordinates[static_cast<size_t>(axis)] != 0) {
      return false;
    }
  }
  return true;
}

void Executor::initialize_parameters(uint64_t seed) {
  const std::map<std::string, ParameterInit>& initializers =
      program_.step->forward_info.initializers;
  for (int region = 0; region < static_cast<int>(graph_.regions().size()); ++region) {
    const Region& info = graph_.region(region);
    if (info.phase != Phase::kForward) {
      continue;
    }
    const int64_t layers = info.parameter_sets();
    for (const Tensor& tensor : graph_.tensors()) {
      const bool state =
          graph_.producer(tensor.id) < 0 &&
          (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kOptimizerState);
      if (!state || tensor.region != region) {
        continue;
      }
      for (layer_ = 0; layer_ < layers; ++layer_) {
        TensorData& data = allocate(tensor.id);
        if (tensor.kind == TensorKind::kOptimizerState) {
          continue;  // moments start at zero
        }
        const std::string key = info.name + "/" + tensor.name;
        const auto found = initializers.find(key);
        if (found == initializers.end()) {
          throw std::logic_error("functional engine: no initializer for parameter '" + key + "'");
        }
        const ParameterInit& init = found->second;
        // By the model's layer: a pipeline stage's slot r k + j is layer r S k + s k + j.
        const uint64_t name =
            fnv1a(tensor.name) ^ splitmix64(static_cast<uint64_t>(model_layer(region, layer_)));
        // Each element from its GLOBAL index: every sharding draws the same model. Constants fill
        // the padding of an uneven split too (as before); random draws leave it zero.
        device_.for_each_global_element(tensor, [&](int64_t local_flat, int64_t global_flat) {
          float value = 0;
          if (init.distribution == InitDistribution::kConstant) {
            value = static_cast<float>(init.value);
          } else if (global_flat >= 0) {
            value = static_cast<float>(draw(init, seed, name, static_cast<uint64_t>(global_flat)));
          }
          data.values[static_cast<size_t>(local_flat)] = value;
        });
      }
    }
  }
  layer_ = 0;
}

void Executor::set_batch(const std::vector<std::vector<int32_t>>& tokens,
                         const std::vector<std::vector<int32_t>>& targets) {
  tokens_ = tokens;
  targets_ = targets;
}

void Executor::fill_input(TensorId id, int microbatch) {
  const Tensor& tensor = graph_.tensor(id);
  TensorData& data = allocate(id);
  const int length_dim = tensor.dim_index("length");
  const int batch_dim = tensor.dim_index("batch");
  if (length_dim < 0 || batch_dim < 0 || tensor.dims.size() != 2) {
    throw std::logic_error("functional engine: input '" + tensor.name + "' is not [batch, length]");
  }
  const Dim& batch = tensor.dims[static_cast<size_t>(batch_dim)];
  const Dim& length = tensor.dims[static_cast<size_t>(length_dim)];
  // In a chunked head the tensor holds chunk chunk_ of each device's local tokens.
  const int64_t global_length = length.whole_size() * chunks_;
  const int64_t length_offset =
      device_.shard_index(length) * length.size * chunks_ + chunk_ * length.size;
  const std::vector<int32_t>* source = nullptr;
  if (tensor.name == "tokens") {
    source = &tokens_.at(static_cast<size_t>(microbatch));
  } else if (tensor.name == "targets") {
    source = &targets_.at(static_cast<size_t>(microbatch));
  }
  std::vector<int64_t> index(2);
  for (int64_t b = 0; b < batch.size; ++b) {
    for (int64_t l = 0; l < length.size; ++l) {
      const int64_t global_b = device_.offset(batch) + b;
      const int64_t global_l = length_offset + l;
      float value = static_cast<float>(global_l);  // "positions" (learned position embeddings)
      if (source != nullptr) {
        const auto flat = static_cast<size_t>(global_b * global_length + global_l);
        if (global_b >= batch.whole_size() || flat >= source->size()) {
          value = 0;  // padding rows of a batch dim that does not divide (XLA pads)
        } else {
          value = static_cast<float>((*source)[flat]);
        }
      }
      index[static_cast<size_t>(batch_dim)] = b;
      index[static_cast<size_t>(length_dim)] = l;
      data.at(index) = value;
    }
  }
}

void Executor::run_op(const Op& op, int microbatch) {
  std::vector<const TensorData*> inputs;
  for (const TensorId input : op.inputs) {
    const Tensor& tensor = graph_.tensor(input);
    if (tensor.kind == TensorKind::kInput &&
        (chunks_ > 1 || values_.find(key(input)) == values_.end())) {
      fill_input(input, microbatch);  // a chunked head reads its chunk of the batch each time
    }
    inputs.push_back(&value(input));
  }
  std::vector<TensorData*> outputs;
  for (const TensorId output : op.outputs) {
    outputs.push_back(&allocate(output));
  }
  if (is_collective(op.kind)) {
    communicator_.run(graph_, op, device_, *inputs[0], *outputs[0]);
    counters_.collective_bytes += static_cast<double>(collective_bytes(graph_, op));
    ++counters_.collectives;
  } else {
    if (op.kind == OpKind::kCrossEntropy && device_.token_log_probs != nullptr) {
      device_.token_log_probs->current_microbatch = microbatch;
      device_.token_log_probs->chunk = chunk_;
    }
    const auto start = std::chrono::steady_clock::now();
    run_kernel(graph_, op, inputs, outputs, device_);
    if (op.kind == OpKind::kEinsum) {
      counters_.einsum_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double flops = op_flops(graph_, op).matmul;
      if (op.inputs.size() == 3) {
        // A grouped matmul multiplies the rows routing really filled (row_experts >= 0), which
        // the program counts by their balanced fraction.
        const std::vector<float>& rows = inputs[2]->values;
        const auto filled = static_cast<double>(
            std::count_if(rows.begin(), rows.end(), [](float expert) { return expert >= 0; }));
        flops *= filled / static_cast<double>(rows.size()) / op.attrs.routed_fraction;
      }
      counters_.einsum_flops += flops;
    }
  }
  if (op.kind == OpKind::kAdamUpdate) {
    // Updates are in place: the new parameter and moments replace the old ones.
    // Outputs (param', mu', nu') replace inputs 0, 2 and 3 (input 1 is the gradient).
    constexpr std::array<size_t, 3> kReplaced = {0, 2, 3};
    for (size_t index = 0; index < kReplaced.size(); ++index) {
      std::swap(value(op.inputs[kReplaced[index]]), *outputs[index]);
      release(op.outputs[index]);  // the old values, kept for the next step's outputs
    }
  }
  for (const TensorId dead : dead_after_[static_cast<size_t>(op.id)]) {
    release(dead);
  }
}

void Executor::accumulate_final_gradients(int region) {
  std::vector<TensorId> summed = final_grads_;
  summed.insert(summed.end(), bias_loads_.begin(), bias_loads_.end());
  for (const TensorId grad : summed) {
    if (graph_.tensor(grad).region != region) {
      continue;
    }
    TensorData& sum = accumulated_[key(grad)];
    const TensorData& now = value(grad);
    if (sum.values.empty()) {
      sum = now;
    } else {
      for (size_t index = 0; index < sum.values.size(); ++index) {
        sum.values[index] += now.values[index];
      }
    }
  }
}

void Executor::run_region(int region, int microbatch) {
  const Region& info = graph_.region(region);
  if (info.pipelined()) {
    run_pipeline_loop(region, microbatch);
    return;
  }
  std::vector<const Op*> ops;
  for (const Op& op : graph_.ops()) {
    if (op.region == region) {
      ops.push_back(&op);
    }
  }
  chunks_ = region_chunks_[static_cast<size_t>(region)];
  for (int64_t iteration = 0; iteration < info.repeat; ++iteration) {
    layer_ = info.phase == Phase::kBackward ? info.repeat - 1 - iteration : iteration;
    chunk_ = chunks_ > 1 ? layer_ : 0;
    const std::vector<Graph::Carry>& carries = graph_.carries();
    for (size_t index = 0; index < carries.size(); ++index) {
      // A chunked head reads chunk chunk_ of its input, in its forward and in its backward.
      const int to_region = graph_.tensor(carries[index].to).region;
      if (chunked_carry_[index] && chunks_ > 1 &&
          (to_region == region || to_region == info.forward_region)) {
        copy_chunk(carries[index], false);
      }
    }
    // Carries into this region: from another region on the first iteration, from this
    // region's previous iteration afterwards. (Chunked ones are moved chunk by chunk.)
    for (size_t index = 0; index < carries.size(); ++index) {
      const Graph::Carry& carry = carries[index];
      if (graph_.tensor(carry.to).region != region || chunked_carry_[index] ||
          pipeline_carry_[index]) {
        continue;
      }
      const bool same_region = graph_.tensor(carry.from).region == region;
      if (same_region != (iteration > 0)) {
        continue;
      }
      const Key from{carry.from, 0};
      const auto found = values_.find(from);
      if (found == values_.end()) {
        throw std::logic_error("functional engine: carry '" + graph_.tensor(carry.from).name +
                               "' has no value");
      }
      allocate(carry.to).values = found->second.values;
    }
    for (const Op* op : ops) {
      run_op(*op, microbatch);
    }
    if (chunks_ > 1) {
      // The head's backward writes chunk chunk_ of the gradient it hands to the layers, and sums
      // the parameter gradients it hands to other regions.
      for (size_t index = 0; index < carries.size(); ++index) {
        if (chunked_carry_[index] && graph_.tensor(carries[index].from).region == region) {
          copy_chunk(carries[index], true);
        }
      }
      for (const TensorId id : summed_over_chunks_[static_cast<size_t>(region)]) {
        const TensorData& now = value(id);
        auto [sum, inserted] = chunk_sums_.try_emplace(id, now);
        if (inserted) {
          live_bytes_ += graph_.tensor(id).bytes();
          counters_.peak_bytes = std::max(counters_.peak_bytes, live_bytes_);
        } else {
          for (size_t element = 0; element < now.values.size(); ++element) {
            sum->second.values[element] += now.values[element];
          }
        }
      }
    }
    if (graph_.tensor(loss_).region == region) {
      loss_sum_ += static_cast<double>(value(loss_).values.at(0));  // a chunked head: per chunk
    }
    for (const TensorId auxiliary : auxiliary_losses_) {
      if (graph_.tensor(auxiliary).region == region) {
        loss_sum_ += static_cast<double>(value(auxiliary).values.at(0));  // once per layer
      }
    }
    if (info.phase == Phase::kBackward) {
      accumulate_final_gradients(region);
    }
  }
  for (const TensorId id : summed_over_chunks_[static_cast<size_t>(region)]) {
    value(id) = std::move(chunk_sums_.at(id));
    chunk_sums_.erase(id);
    live_bytes_ -= graph_.tensor(id).bytes();
  }
  layer_ = 0;
  chunk_ = 0;
  chunks_ = 1;
}

void Executor::copy_chunk(const Graph::Carry& carry, bool from_chunk) {
  const TensorId whole_id = from_chunk ? carry.to : carry.from;
  const TensorId part_id = from_chunk ? carry.from : carry.to;
  const Tensor& whole = graph_.tensor(whole_id);
  const Tensor& part = graph_.tensor(part_id);
  const size_t dim = chunk_dim(whole, part, chunks_);
  // Carry ends are stored once (not per layer): address them as layer 0.
  const Key whole_key{whole_id, 0};
  const Key part_key{part_id, 0};
  const auto source = values_.find(from_chunk ? part_key : whole_key);
  if (source == values_.end()) {
    throw std::logic_error("functional engine: carry '" + graph_.tensor(carry.from).name +
                           "' has no value");
  }
  const int64_t saved_layer = layer_;
  layer_ = 0;
  TensorData& target = allocate(from_chunk ? whole_id : part_id);
  layer_ = saved_layer;
  const TensorData& origin = source->second;
  int64_t outer = 1;
  int64_t inner = 1;
  for (size_t index = 0; index < part.dims.size(); ++index) {
    if (index != dim) {
      (index < dim ? outer : inner) *= part.dims[index].size;
    }
  }
  const int64_t part_rows = part.dims[dim].size;
  const int64_t whole_rows = whole.dims[dim].size;
  const int64_t block = part_rows * inner;
  for (int64_t index = 0; index < outer; ++index) {
    const int64_t whole_at = (index * whole_rows + chunk_ * part_rows) * inner;
    const int64_t part_at = index * block;
    const float* begin = origin.values.data() + (from_chunk ? part_at : whole_at);
    std::copy(begin, begin + block, target.values.data() + (from_chunk ? whole_at : part_at));
  }
}

StepResult Executor::compute_gradients() {
  counters_ = ExecutionCounters{};
  counters_.peak_bytes = live_bytes_;
  loss_sum_ = 0;
  accumulated_.clear();
  for (int microbatch = 0; microbatch < static_cast<int>(program_.accumulation_steps);
       ++microbatch) {
    for (int region = 0; region < static_cast<int>(graph_.regions().size()); ++region) {
      if (graph_.region(region).phase != Phase::kOptimizer) {
        run_region(region, microbatch);
      }
    }
    // Inputs and carries of this microbatch are not needed any more.
    for (auto it = values_.begin(); it != values_.end();) {
      const Tensor& tensor = graph_.tensor(it->first.first);
      if (!liveness_.persistent(tensor.id)) {
        live_bytes_ -= tensor.bytes();
        recycle(std::move(it->second.values));
        it = values_.erase(it);
      } else {
        ++it;
      }
    }
  }
  StepResult result;
  const auto microbatches = static_cast<double>(program_.accumulation_steps);
  result.loss = loss_sum_ / microbatches;
  double squares = 0;
  for (auto& [slot, sum] : accumulated_) {
    TensorData& grad = values_.at(slot);
    if (bias_loads_.contains(slot.first)) {
      grad.values = sum.values;  // a router bias's loads: the step's choices, summed
      continue;
    }
    const bool owner = owns_global_element(graph_.tensor(slot.first));
    for (size_t index = 0; index < sum.values.size(); ++index) {
      grad.values[index] = static_cast<float>(sum.values[index] / microbatches);
      if (owner) {
        squares += static_cast<double>(grad.values[index]) * grad.values[index];
      }
    }
  }
  result.grad_norm = squares;
  result.counters = counters_;
  return result;
}

void Executor::apply_update(const DeviceContext::Optimizer& optimizer) {
  device_.optimizer = optimizer;
  for (int region = 0; region < static_cast<int>(graph_.regions().size()); ++region) {
    if (graph_.region(region).phase == Phase::kOptimizer) {
      run_region(region, 0);
    }
  }
}

std::vector<Executor::NamedState> Executor::state() {
  std::vector<NamedState> result;
  for (auto& [slot, data] : values_) {
    const Tensor& tensor = graph_.tensor(slot.first);
    const bool state =
        graph_.producer(tensor.id) < 0 &&
        (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kOptimizerState);
    if (state) {
      result.push_back({graph_.region(tensor.region).name + "/" + tensor.name,
                        model_layer(tensor.region, slot.second), slot.second, &tensor, &data});
    }
  }
  return result;
}

std::vector<Executor::NamedState> Executor::gradients() {
  std::vector<NamedState> result;
  for (const auto& [parameter, grad] : grad_of_parameter_) {
    const Tensor& tensor = graph_.tensor(parameter);
    for (auto& [slot, data] : values_) {
      if (slot.first == grad) {
        result.push_back({graph_.region(tensor.region).name + "/" + tensor.name,
                          model_layer(tensor.region, slot.second), slot.second,
                          &graph_.tensor(grad), &data});
      }
    }
  }
  return result;
}

}  // namespace tpusim
