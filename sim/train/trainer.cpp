#include "sim/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"

namespace tpusim {
namespace {

constexpr uint64_t kDefaultSeed = 0;

// Writes a device's local block into the global row-major array of its tensor.
void place_block(const Tensor& tensor, const TensorData& local, const DeviceContext& device,
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
      global[static_cast<size_t>(global_flat)] = local.values[static_cast<size_t>(local_flat)];
    }
  });
}

// The largest per-tensor relative L2 error ||a - b|| / ||b|| (the comparison of
// shared/reference/numerics_and_levanter.md: fp32 vs a reference, rel-L2 per tensor).
double max_relative_difference(const std::map<std::string, std::vector<float>>& a,
                               const std::map<std::string, std::vector<float>>& b) {
  double worst = 0;
  for (const auto& [name, values] : a) {
    const auto found = b.find(name);
    if (found == b.end() || found->second.size() != values.size()) {
      throw std::logic_error("verify: the reference has no matching '" + name + "'");
    }
    double difference = 0;
    double norm = 0;
    for (size_t index = 0; index < values.size(); ++index) {
      const double delta = static_cast<double>(values[index]) - found->second[index];
      difference += delta * delta;
      norm += static_cast<double>(found->second[index]) * found->second[index];
    }
    const double relative = norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference);
    if (std::getenv("TPUSIM_VERIFY_DETAIL") != nullptr) {
      std::cerr << "  verify " << name << " rel-L2 " << relative << "\n";
    }
    worst = std::max(worst, relative);
  }
  return worst;
}

}  // namespace

ShardedModel::ShardedModel(const Config& config) : program_(build_step_program(config)) {
  std::array<int, kNumMeshAxes> sizes{};
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    sizes[static_cast<size_t>(axis)] = program_.mesh.shape.size(axis);
  }
  const int devices = program_.slice.total_devices();
  constexpr int kMaxSimulatedDevices = 64;
  if (devices > kMaxSimulatedDevices) {
    throw UserError("compile_topology: " + program_.slice.name + " has " + std::to_string(devices) +
                    " devices; tpusim train simulates at most " +
                    std::to_string(kMaxSimulatedDevices) + " on one machine");
  }
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(config.get_float("collective_timeout_seconds") * 1000)));
  communicator_ = std::make_unique<InProcessCommunicator>(sizes, timeout);
  slots_ = std::make_unique<ExecutionSlots>(resolve_num_threads(config.get_int("num_threads")));
  communicator_->set_execution_slots(slots_.get());
  const bool bf16 = config.get_string("functional_dtype") == "bfloat16_matmul";
  for (int device = 0; device < devices; ++device) {
    DeviceContext context = InProcessCommunicator::context_for(device, sizes);
    context.bf16_matmul_inputs = bf16;
    executors_.push_back(std::make_unique<Executor>(program_, context, *communicator_));
  }
  const auto seed = static_cast<uint64_t>(config.get_int("init_weights_seed"));
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
      const bool timeout = std::string(failure.what()).find("never arrived") != std::string::npos;
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

StepResult ShardedModel::compute_gradients(const std::vector<Batch>& microbatches) {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> targets;
  for (const Batch& batch : microbatches) {
    tokens.push_back(batch.tokens);
    targets.push_back(batch.targets);
  }
  std::vector<StepResult> results(executors_.size());
  on_every_device([&](Executor& executor, int device) {
    executor.set_batch(tokens, targets);
    results[static_cast<size_t>(device)] = executor.compute_gradients();
  });
  StepResult result = results.front();
  double squares = 0;
  for (const StepResult& device_result : results) {
    squares += device_result.grad_norm;
  }
  result.grad_norm = std::sqrt(squares);
  return result;
}

void ShardedModel::apply_update(const DeviceContext::Optimizer& optimizer) {
  on_every_device([&](Executor& executor, int) { executor.apply_update(optimizer); });
}

std::map<std::string, std::vector<float>> ShardedModel::global_state() {
  std::map<std::string, std::vector<float>> global;
  for (auto& executor : executors_) {
    for (const Executor::NamedState& state : executor->state()) {
      place_block(*state.tensor, *state.data, executor->device(),
                  global[state.name + "#" + std::to_string(state.layer)]);
    }
  }
  return global;
}

std::map<std::string, std::vector<float>> ShardedModel::global_gradients() {
  std::map<std::string, std::vector<float>> global;
  for (auto& executor : executors_) {
    for (const Executor::NamedState& state : executor->gradients()) {
      place_block(*state.tensor, *state.data, executor->device(),
                  global[state.name + "#" + std::to_string(state.layer)]);
    }
  }
  return global;
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
  Checkpoint checkpoint;
  checkpoint.step = step;
  for (auto& executor : executors_) {
    for (const Executor::NamedState& state : executor->state()) {
      const std::string name = state.name + "#" + std::to_string(state.layer);
      CheckpointTensor& tensor =
          (is_moment(name) ? checkpoint.optimizer : checkpoint.weights)[name];
      tensor.shape = global_shape(*state.tensor);
      place_block(*state.tensor, *state.data, executor->device(), tensor.values);
    }
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

Config unsharded_reference_config(const Config& config) {
  Config reference = config;
  const Slice slice = slice_from_config(config);
  const double per_device = config.get_float("per_device_batch_size");
  reference.set("per_device_batch_size", std::to_string(per_device * slice.total_devices()),
                "verify reference");
  reference.set("compile_topology", "v5e-1", "verify reference");
  reference.set("compile_topology_num_slices", "1", "verify reference");
  for (const std::string& key : config.keys()) {
    if ((key.starts_with("ici_") || key.starts_with("dcn_")) && key.ends_with("_parallelism")) {
      reference.set(key, "1", "verify reference");
    }
  }
  return reference;
}

Trainer::Trainer(const Config& config) : config_(config), data_(Dataset::from_config(config)) {}

double Trainer::learning_rate(int64_t step) const {
  const double peak = config_.get_float("learning_rate");
  int64_t schedule = config_.get_int("learning_rate_schedule_steps");
  if (schedule <= 0) {
    schedule = std::max<int64_t>(1, config_.get_int("steps"));
  }
  const double warmup =
      std::floor(config_.get_float("warmup_steps_fraction") * static_cast<double>(schedule));
  const auto current = static_cast<double>(step - 1);
  if (current < warmup) {
    return peak * (current + 1) / std::max(1.0, warmup);
  }
  const double final_fraction = config_.get_float("cosine_learning_rate_final_fraction");
  const double progress =
      std::min(1.0, (current - warmup) / std::max(1.0, static_cast<double>(schedule) - warmup));
  const double cosine = 0.5 * (1 + std::cos(M_PI * progress));
  return peak * (final_fraction + (1 - final_fraction) * cosine);
}

std::vector<StepMetrics> Trainer::run(const TrainOptions& options, std::ostream& progress) {
  ShardedModel model(config_);
  std::unique_ptr<ShardedModel> reference;
  if (options.verify) {
    reference = std::make_unique<ShardedModel>(unsharded_reference_config(config_));
  }
  const StepProgram& program = model.program();
  const int64_t sequences = program.microbatch;
  const int64_t length = config_.get_int("max_target_length");
  const int64_t steps = config_.get_int("steps");
  const int64_t eval_interval = config_.get_int("eval_interval");
  const int64_t eval_steps = std::max<int64_t>(1, config_.get_int("eval_steps"));
  const double clip = config_.get_float("gradient_clipping_threshold");
  const std::string metrics_path = config_.get_string("metrics_file");
  std::string metrics_text;
  std::vector<StepMetrics> curve;
  DeviceContext::Optimizer optimizer;
  optimizer.b1 = config_.get_float("adam_b1");
  optimizer.b2 = config_.get_float("adam_b2");
  optimizer.eps = config_.get_float("adam_eps");
  optimizer.eps_root = config_.get_float("adam_eps_root");
  optimizer.weight_decay = config_.get_float("adam_weight_decay");
  // Checkpoints: <base_output_directory>/<run_name>/checkpoints/<step>. A run resumes from its
  // latest checkpoint; load_parameters_path starts a new run from saved weights.
  const bool checkpointing = config_.get_bool("enable_checkpointing");
  const std::string run_directory =
      config_.get_string("base_output_directory") + "/" + config_.get_string("run_name");
  if (checkpointing && (config_.get_string("base_output_directory").empty() ||
                        config_.get_string("run_name").empty())) {
    throw UserError("enable_checkpointing: needs base_output_directory and run_name");
  }
  const int64_t period = config_.get_int("checkpoint_period");
  int64_t first_step = 1;
  const std::string latest = checkpointing ? latest_checkpoint(run_directory) : "";
  if (!latest.empty()) {
    const Checkpoint checkpoint = load_checkpoint(latest);
    model.restore(checkpoint, /*with_optimizer=*/true);
    if (reference) {
      reference->restore(checkpoint, true);
    }
    first_step = checkpoint.step + 1;
    if (checkpoint.metadata.contains("metrics")) {
      metrics_text = checkpoint.metadata["metrics"].get<std::string>();
    }
    if (options.progress) {
      progress << "resumed from " << latest << " (step " << checkpoint.step << ")\n";
    }
  } else if (!config_.get_string("load_parameters_path").empty()) {
    const Checkpoint checkpoint = load_checkpoint(config_.get_string("load_parameters_path"));
    model.restore(checkpoint, /*with_optimizer=*/false);
    if (reference) {
      reference->restore(checkpoint, false);
    }
  }
  for (int64_t step = first_step; step <= steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<Batch> batches;
    for (int64_t micro = 0; micro < program.accumulation_steps; ++micro) {
      batches.push_back(data_.train_batch(step - 1, micro, sequences));
    }
    Checkpoint initial;
    if (!options.dump_directory.empty() && step == first_step) {
      initial = model.to_checkpoint(step - 1);
    }
    const StepResult result = model.compute_gradients(batches);
    optimizer.step = step;
    optimizer.learning_rate = learning_rate(step);
    optimizer.gradient_scale = clip > 0 ? clip / std::max(result.grad_norm, clip) : 1.0;
    StepMetrics metrics;
    if (reference) {
      const StepResult expected = reference->compute_gradients(batches);
      const double loss_difference =
          std::abs(result.loss - expected.loss) / std::max(std::abs(expected.loss), 1e-30);
      const double gradient_difference =
          max_relative_difference(model.global_gradients(), reference->global_gradients());
      DeviceContext::Optimizer reference_optimizer = optimizer;
      reference_optimizer.gradient_scale =
          clip > 0 ? clip / std::max(expected.grad_norm, clip) : 1.0;
      model.apply_update(optimizer);
      reference->apply_update(reference_optimizer);
      const double weight_difference =
          max_relative_difference(model.global_state(), reference->global_state());
      metrics.verify_loss_rel_diff = loss_difference;
      metrics.verify_gradient_rel_diff = gradient_difference;
      metrics.verify_weight_rel_diff = weight_difference;
      metrics.verify_max_rel_diff =
          std::max({loss_difference, gradient_difference, weight_difference});
    } else {
      model.apply_update(optimizer);
    }
    if (!options.dump_directory.empty() && step == first_step) {
      save_checkpoint(options.dump_directory + "/initial", initial);
      Checkpoint gradients;
      gradients.step = step;
      for (const auto& [name, values] : model.global_gradients()) {
        gradients.weights[name] = CheckpointTensor{initial.weights.at(name).shape, values};
      }
      save_checkpoint(options.dump_directory + "/gradients", gradients);
      save_checkpoint(options.dump_directory + "/updated", model.to_checkpoint(step));
      nlohmann::json dump = {{"loss", result.loss},
                             {"grad_norm", result.grad_norm},
                             {"learning_rate", optimizer.learning_rate},
                             {"gradient_scale", optimizer.gradient_scale},
                             {"sequences", sequences},
                             {"length", length},
                             {"tokens", batches.front().tokens},
                             {"targets", batches.front().targets}};
      write_file_atomically(options.dump_directory + "/step.json", dump.dump());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    metrics.step = step;
    metrics.loss = result.loss;
    metrics.grad_norm = result.grad_norm;
    metrics.learning_rate = optimizer.learning_rate;
    metrics.tokens_per_s =
        static_cast<double>(sequences * program.accumulation_steps * length) / seconds;
    metrics.counters = result.counters;
    if (eval_interval > 0 && (step % eval_interval == 0 || step == steps)) {
      double total = 0;
      for (int64_t index = 0; index < eval_steps; ++index) {
        std::vector<Batch> eval(static_cast<size_t>(program.accumulation_steps));
        for (auto& batch : eval) {
          batch = data_.eval_batch(index, sequences);
        }
        total += model.compute_gradients(eval).loss;
      }
      metrics.eval_loss = total / static_cast<double>(eval_steps);
    }
    nlohmann::json line = {{"step", metrics.step},
                           {"loss", metrics.loss},
                           {"grad_norm", metrics.grad_norm},
                           {"learning_rate", metrics.learning_rate},
                           {"tokens_per_s", metrics.tokens_per_s}};
    if (metrics.eval_loss) {
      line["eval_loss"] = *metrics.eval_loss;
    }
    if (metrics.verify_max_rel_diff) {
      line["verify_max_rel_diff"] = *metrics.verify_max_rel_diff;
      line["verify_loss_rel_diff"] = *metrics.verify_loss_rel_diff;
      line["verify_gradient_rel_diff"] = *metrics.verify_gradient_rel_diff;
      line["verify_weight_rel_diff"] = *metrics.verify_weight_rel_diff;
    }
    metrics_text += line.dump() + "\n";
    if (!metrics_path.empty()) {
      write_file_atomically(metrics_path, metrics_text);
    }
    if (options.progress) {
      progress << "step " << std::setw(5) << step << "  loss " << std::fixed << std::setprecision(4)
               << metrics.loss << "  grad_norm " << metrics.grad_norm << "  lr " << std::scientific
               << std::setprecision(2) << metrics.learning_rate << std::fixed << "  "
               << std::setprecision(0) << metrics.tokens_per_s << " tok/s";
      if (metrics.eval_loss) {
        progress << "  eval " << std::setprecision(4) << *metrics.eval_loss;
      }
      if (metrics.verify_max_rel_diff) {
        progress << "  verify " << std::scientific << std::setprecision(2)
                 << *metrics.verify_max_rel_diff << std::fixed;
      }
      progress << "\n";
    }
    curve.push_back(metrics);
    if (checkpointing && ((period > 0 && step % period == 0) || step == steps)) {
      Checkpoint checkpoint = model.to_checkpoint(step);
      checkpoint.metadata = {{"model_name", config_.get_string("model_name")},
                             {"data_position", step},
                             {"metrics", metrics_text}};
      save_checkpoint(checkpoint_directory(run_directory, step), checkpoint);
    }
  }
  return curve;
}

}  // namespace tpusim
