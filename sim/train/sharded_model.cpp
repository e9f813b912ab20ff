#include "sim/train/sharded_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "model/batch_plan.h"
#include "model/builder/initializers.h"
#include "model/builder/layer_plan.h"
#include "sharding/divisibility.h"
#include "sim/functional/tensor_data.h"
#include "sim/train/model_identity.h"
#include "sim/transport/in_process_communicator.h"

namespace tpusim {
namespace {

#ifdef TPUSIM_SANITIZER_SLOWDOWN
constexpr double kSanitizerSlowdown = TPUSIM_SANITIZER_SLOWDOWN;
#else
constexpr double kSanitizerSlowdown = 1;
#endif

}  // namespace

// collective_timeout_seconds as a duration. A sanitizer build runs several times slower, so what
// is a hang in a normal build is only slowness there: its waits scale by kSanitizerSlowdown.
std::chrono::milliseconds collective_timeout(double seconds) {
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(seconds * 1000 * kSanitizerSlowdown)));
}

namespace {

constexpr uint64_t kDefaultSeed = 0;

// A reshape copies a device's local elements in order, which is right only when the input's and
// the output's shards hold the same elements. deepseek4's grouped out projection
// (attention/o_grouped, heads -> o_groups x their features) does when the axes splitting the
// heads split o_groups evenly; otherwise it is refused by key (estimate models it).
void refuse_reshapes_across_shards(const Graph& program) {
  for (const Op& op : program.ops()) {
    if (op.kind != OpKind::kElementwise || op.attrs.function != ElementwiseFn::kReshape) {
      continue;
    }
    const int64_t in = program.tensor(op.inputs.at(0)).num_elements();
    const int64_t out = program.tensor(op.outputs.at(0)).num_elements();
    if (in == out) {
      continue;
    }
    if (op.name.ends_with("o_grouped")) {
      const Tensor& grouped = program.tensor(op.outputs.at(0));
      const int64_t groups = grouped.dims.at(grouped.dim_index("o_groups")).whole_size();
      throw UserError("o_groups: " + std::to_string(groups) +
                          " is not computed by tpusim train on this mesh: the mesh axes that split "
                          "the attention heads must split o_groups evenly (each device then holds "
                          "whole groups)",
                      "o_groups");
    }
    throw std::logic_error("reshape '" + op.name + "': " + std::to_string(in) +
                           " local elements into " + std::to_string(out));
  }
}

// Writes a device's local block into the global row-major array of its tensor.
void place_block(const Tensor& tensor, const float* local, const DeviceContext& device,
                 std::vector<float>& global) {
  int64_t total = 1;
  for (const Dim& dim : tensor.dims) {
    total *= dim.whole_size();
  }
  if (global.empty()) {
    global.assign(static_cast<size_t>(total), 0.0f);
  }
  device.for_each_global_element(tensor, [&](int64_t local_flat, int64_t global_flat) {
    if (global_flat >= 0) {
      global[static_cast<size_t>(global_flat)] = local[local_flat];
    }
  });
}

}  // namespace

ShardedModel::ShardedModel(const Config& config, Transport* transport)
    : ShardedModel(config, FunctionalSettings::from_config(config), transport) {}

ShardedModel::ShardedModel(const Config& config, const FunctionalSettings& settings,
                           Transport* transport)
    : own_transport_(transport == nullptr ? std::make_unique<LocalTransport>() : nullptr),
      transport_(transport == nullptr ? own_transport_.get() : transport),
      program_(build_step_program(config, MechanismSet(), train_layer_order(config))),
      identity_({{"model_name", settings.model_name},
                 {"model_config", model_identity_from_config(config)}}) {
  // build_step_program refused what MaxText refuses; a per_device_batch_size < 1 may still leave
  // a batch XLA would pad, which the functional engine would compute wrong: refuse it too.
  const double per_device_batch = settings.per_device_batch_size;
  Divisibility(*program_.step, LogicalAxisRules::from_config(config))
      .require_train_batch_divides(program_.mesh.shape,
                                   plan_batch(per_device_batch, program_.slice.total_devices(),
                                              settings.gradient_accumulation_steps),
                                   per_device_batch);
  refuse_reshapes_across_shards(program_.program.graph);
  if (const PipelineSchedule& pipeline = program_.step->forward_info.pipeline; pipeline.active()) {
    // The functional engine runs MaxText's loop (sim/functional/pipeline_loop.cpp), threads and
    // MPI ranks alike, without delayed forwarding or a chunked head.
    if (pipeline.forwarding_delay > 1) {
      throw UserError(
          "pipeline_delay_activation_forwarding: true is not computed by tpusim train "
          "(estimate and explore model it)",
          "pipeline_delay_activation_forwarding");
    }
    if (settings.num_vocab_tiling > 1) {
      throw UserError("num_vocab_tiling: " + std::to_string(settings.num_vocab_tiling) +
                          " with pipeline stages is not computed by tpusim train",
                      "num_vocab_tiling");
    }
  }
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    sizes_[static_cast<size_t>(axis)] = program_.mesh.shape.size(axis);
  }
  const int devices = program_.slice.total_devices();
  owner_ = assign_devices_to_ranks(physical_devices_of_mesh(program_.mesh, program_.slice),
                                   transport_->num_ranks(), program_.slice.name);
  for (int device = 0; device < devices; ++device) {
    if (owner_[static_cast<size_t>(device)] == transport_->rank()) {
      devices_.push_back(device);
    }
  }
  constexpr int kMaxSimulatedDevices = 64;
  if (static_cast<int>(devices_.size()) > kMaxSimulatedDevices) {
    throw UserError("compile_topology: " + program_.slice.name + " has " + std::to_string(devices) +
                    " devices; tpusim train simulates at most " +
                    std::to_string(kMaxSimulatedDevices) +
                    " per process (spread them over processes with mpirun)");
  }
  communicator_ = transport_->make_communicator(
      sizes_, owner_, collective_timeout(settings.collective_timeout_seconds));
  slots_ = std::make_unique<ExecutionSlots>(
      resolve_num_threads(settings.num_threads, transport_->ranks_on_host()));
  communicator_->set_execution_slots(slots_.get());
  // num_threads threads compute: with fewer devices than that, each device's kernels get the
  // rest as helpers (results do not depend on it: sim/functional/kernel_threads.h).
  const int per_device =
      std::max(1, slots_->count() / std::max(1, static_cast<int>(devices_.size())));
  for (const int device : devices_) {
    DeviceContext context = InProcessCommunicator::context_for(device, sizes_);
    context.bf16_matmul_inputs = settings.bf16_matmul_inputs;
    context.fast_kernels = settings.fast_kernels;
    if (per_device > 1) {
      kernel_threads_.push_back(std::make_unique<KernelThreads>(per_device));
      context.threads = kernel_threads_.back().get();
    }
    executors_.push_back(std::make_unique<Executor>(program_, context, *communicator_));
  }
  const auto seed = static_cast<uint64_t>(settings.init_weights_seed);
  on_every_device(
      [seed](Executor& executor, int) { executor.initialize_parameters(seed + kDefaultSeed); });
}

template <typename Work>
void ShardedModel::on_every_device(const Work& work) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(executors_.size());
  for (size_t device = 0; device < executors_.size(); ++device) {
    threads.emplace_back([&, device] {
      try {
        const ExecutionSlots::Hold hold(*slots_);  // collectives give it back while they wait
        work(*executors_[device], static_cast<int>(device));
      } catch (...) {
        errors[device] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  // Prefer the root cause: a device that failed on its own, rather than one that timed out
  // waiting for it in a collective.
  std::exception_ptr first;
  for (const std::exception_ptr& error : errors) {
    if (!error) {
      continue;
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::runtime_error& failure) {
      // Waits that failed because of another device's failure.
      const std::string text = failure.what();
      const bool timeout = text.find("never arrived") != std::string::npos ||
                           text.find("abandoned after an earlier failure") != std::string::npos;
      if (!first || !timeout) {
        first = error;
      }
      if (!timeout) {
        break;
      }
    } catch (...) {
      first = error;
      break;
    }
  }
  if (first) {
    std::rethrow_exception(first);
  }
}

StepResult ShardedModel::compute_gradients(const std::vector<Batch>& microbatches,
                                           TokenLogProbs* log_probs) {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> targets;
  for (const Batch& batch : microbatches) {
    tokens.push_back(batch.tokens);
    targets.push_back(batch.targets);
  }
  std::vector<StepResult> results(executors_.size());
  std::vector<TokenLogProbs> sinks(log_probs != nullptr ? executors_.size() : 0);
  for (size_t index = 0; index < sinks.size(); ++index) {
    sinks[index] = *log_probs;
    sinks[index].values.clear();
    sinks[index].logits.clear();
    executors_[index]->record_token_log_probs(&sinks[index]);
  }
  on_every_device([&](Executor& executor, int device) {
    executor.set_batch(tokens, targets);
    results[static_cast<size_t>(device)] = executor.compute_gradients();
  });
  if (log_probs != nullptr) {
    // Every token (and logit) some device of some rank computed, as (index, value) pairs on
    // every rank; a logit's index follows the tokens'.
    const auto tokens_count = static_cast<size_t>(log_probs->sequences * log_probs->length);
    std::vector<double> mine;
    for (size_t index = 0; index < sinks.size(); ++index) {
      executors_[index]->record_token_log_probs(nullptr);
      for (size_t token = 0; token < sinks[index].values.size(); ++token) {
        if (!std::isnan(sinks[index].values[token])) {
          mine.insert(mine.end(), {static_cast<double>(token), sinks[index].values[token]});
        }
      }
      for (size_t logit = 0; logit < sinks[index].logits.size(); ++logit) {
        if (!std::isnan(sinks[index].logits[logit])) {
          mine.insert(mine.end(),
                      {static_cast<double>(tokens_count + logit), sinks[index].logits[logit]});
        }
      }
    }
    log_probs->values.assign(tokens_count, std::numeric_limits<float>::quiet_NaN());
    if (log_probs->logits_position >= 0) {
      log_probs->logits.assign(static_cast<size_t>(log_probs->sequences * log_probs->vocab),
                               std::numeric_limits<float>::quiet_NaN());
    }
    for (const std::vector<double>& rank : transport_->all_gather(mine)) {
      for (size_t entry = 0; entry + 2 <= rank.size(); entry += 2) {
        const auto at = static_cast<size_t>(rank[entry]);
        (at < tokens_count ? log_probs->values.at(at) : log_probs->logits.at(at - tokens_count)) =
            static_cast<float>(rank[entry + 1]);
      }
    }
  }
  // Every device's (device, loss, sum of squares), on every rank.
  std::vector<double> mine;
  for (size_t index = 0; index < results.size(); ++index) {
    mine.insert(mine.end(), {static_cast<double>(devices_[index]), results[index].loss,
                             results[index].grad_norm});
  }
  std::vector<double> loss(owner_.size());
  std::vector<double> squares(owner_.size());
  for (const std::vector<double>& rank : transport_->all_gather(mine)) {
    for (size_t entry = 0; entry + 3 <= rank.size(); entry += 3) {
      const auto device = static_cast<size_t>(rank[entry]);
      loss.at(device) = rank[entry + 1];
      squares.at(device) = rank[entry + 2];
    }
  }
  StepResult result = results.front();
  result.loss = loss.front();
  double total = 0;
  for (const double device_squares : squares) {
    total += device_squares;
  }
  result.grad_norm = std::sqrt(total);
  return result;
}

void ShardedModel::apply_update(const DeviceContext::Optimizer& optimizer) {
  on_every_device([&](Executor& executor, int) { executor.apply_update(optimizer); });
}

std::map<std::string, std::vector<float>> ShardedModel::gather_global(bool gradients) {
  const auto named = [gradients](Executor& executor) {
    return gradients ? executor.gradients() : executor.state();
  };
  std::vector<float> mine;
  for (auto& executor : executors_) {
    for (const Executor::NamedState& state : named(*executor)) {
      mine.insert(mine.end(), state.data->values.begin(), state.data->values.end());
    }
  }
  const std::vector<std::vector<float>> by_rank = transport_->gather_to_root(mine);
  std::map<std::string, std::vector<float>> global;
  if (transport_->rank() != 0) {
    return global;
  }
  // Every device holds the same tensors (one program): this rank's first device gives the layout.
  const std::vector<Executor::NamedState> layout = named(*executors_.front());
  std::vector<size_t> cursor(by_rank.size(), 0);
  for (size_t device = 0; device < owner_.size(); ++device) {
    const auto rank = static_cast<size_t>(owner_[device]);
    const DeviceContext context =
        InProcessCommunicator::context_for(static_cast<int>(device), sizes_);
    for (const Executor::NamedState& state : layout) {
      const size_t count = state.data->values.size();
      if (cursor[rank] + count > by_rank[rank].size()) {
        throw std::logic_error("gather: rank " + std::to_string(rank) + " sent too few values");
      }
      // The layer by this device's place in the pipeline (the same slot is another layer on
      // another stage).
      const int64_t layer = executors_.front()->model_layer_on(*state.tensor, state.slot, context);
      place_block(*state.tensor, by_rank[rank].data() + cursor[rank], context,
                  global[state.name + "#" + std::to_string(layer)]);
      cursor[rank] += count;
    }
  }
  return global;
}

std::map<std::string, std::vector<float>> ShardedModel::global_state() {
  return gather_global(false);
}

std::map<std::string, std::vector<float>> ShardedModel::global_gradients() {
  return gather_global(true);
}

int64_t ShardedModel::non_finite_state_values() {
  double mine = 0;
  for (auto& executor : executors_) {
    for (const Executor::NamedState& state : executor->state()) {
      for (const float value : state.data->values) {
        mine += std::isfinite(value) ? 0.0 : 1.0;
      }
    }
  }
  double total = 0;
  for (const std::vector<double>& rank : transport_->all_gather({mine})) {
    total += rank.at(0);
  }
  return static_cast<int64_t>(total);
}

namespace {

std::vector<int64_t> global_shape(const Tensor& tensor) {
  std::vector<int64_t> shape;
  for (const Dim& dim : tensor.dims) {
    shape.push_back(dim.whole_size());
  }
  return shape;
}

bool is_moment(const std::string& name) {
  return name.find("/mu#") != std::string::npos || name.find("/nu#") != std::string::npos;
}

}  // namespace

Checkpoint ShardedModel::to_checkpoint(int64_t step) {
  std::map<std::string, std::vector<float>> global = gather_global(false);
  Checkpoint checkpoint;
  checkpoint.step = step;
  checkpoint.metadata = identity_;
  // Every layer's tensor has its layer's shape; a pipeline stage holds only its own layers, so
  // the names come from the gathered state.
  std::map<std::string, const Tensor*> tensor_of;
  for (const Executor::NamedState& state : executors_.front()->state()) {
    tensor_of[state.name] = state.tensor;
  }
  for (auto& [name, values] : global) {  // empty unless rank 0
    const Tensor* local = tensor_of.at(name.substr(0, name.rfind('#')));
    CheckpointTensor& tensor = (is_moment(name) ? checkpoint.optimizer : checkpoint.weights)[name];
    tensor.shape = global_shape(*local);
    tensor.values = std::move(values);
  }
  return checkpoint;
}

void ShardedModel::restore(const Checkpoint& checkpoint, bool with_optimizer) {
  on_every_device([&](Executor& executor, int) {
    for (const Executor::NamedState& state : executor.state()) {
      const std::string name = state.name + "#" + std::to_string(state.layer);
      const bool moment = is_moment(name);
      if (moment && !with_optimizer) {
        continue;
      }
      const auto& source = moment ? checkpoint.optimizer : checkpoint.weights;
      const auto found = source.find(name);
      if (found == source.end()) {
        throw UserError("checkpoint: no tensor '" + name + "' for this model");
      }
      if (found->second.shape != global_shape(*state.tensor)) {
        throw UserError("checkpoint: tensor '" + name + "' has another shape than this model's");
      }
      // Read this device's block out of the global array.
      const std::vector<float>& values = found->second.values;
      executor.device().for_each_global_element(
          *state.tensor, [&](int64_t local_flat, int64_t global_flat) {
            state.data->values[static_cast<size_t>(local_flat)] =
                global_flat >= 0 ? values[static_cast<size_t>(global_flat)] : 0.0f;
          });
    }
  });
}

}  // namespace tpusim
