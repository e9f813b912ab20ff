#include "sim/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "model/builder/initializers.h"
#include "sim/functional/in_process_communicator.h"
#include "sim/functional/tensor_data.h"
#include "sim/train/hf_names.h"
#include "sim/train/safetensors.h"
#include "sim/train/token_cache.h"
#include "sim/train/token_viz.h"

namespace tpusim {
namespace {

#ifdef TPUSIM_SANITIZER_SLOWDOWN
constexpr double kSanitizerSlowdown = TPUSIM_SANITIZER_SLOWDOWN;
#else
constexpr double kSanitizerSlowdown = 1;
#endif

// collective_timeout_seconds as a duration. A sanitizer build runs several times slower, so what
// is a hang in a normal build is only slowness there: its waits scale by kSanitizerSlowdown.
std::chrono::milliseconds collective_timeout(const Config& config) {
  return std::chrono::milliseconds(static_cast<int64_t>(
      std::ceil(config.get_float("collective_timeout_seconds") * 1000 * kSanitizerSlowdown)));
}

constexpr uint64_t kDefaultSeed = 0;

// The config keys that fix a model's math (its architecture and, for a resume, its optimizer): a
// checkpoint records them, and only a run with the same values may load it. The mesh, batch and
// run settings may differ (a checkpoint resumes on another mesh).
const std::vector<std::string>& identity_keys() {
  static const std::vector<std::string> keys = {"model_name",
                                                "decoder_block",
                                                "global_parameter_scale",
                                                "base_emb_dim",
                                                "base_num_query_heads",
                                                "base_num_kv_heads",
                                                "base_mlp_dim",
                                                "base_moe_mlp_dim",
                                                "base_num_decoder_layers",
                                                "head_dim",
                                                "mlp_activations",
                                                "logits_via_embedding",
                                                "normalize_embedding_logits",
                                                "normalization_layer_epsilon",
                                                "vocab_size",
                                                "rope_max_timescale",
                                                "rope_min_timescale",
                                                "rope_type",
                                                "final_logits_soft_cap",
                                                "attn_logits_soft_cap",
                                                "use_post_attn_norm",
                                                "use_post_ffw_norm",
                                                "attention_bias",
                                                "use_qk_norm",
                                                "mlp_bias",
                                                "attention_sink",
                                                "q_lora_rank",
                                                "kv_lora_rank",
                                                "qk_nope_head_dim",
                                                "qk_rope_head_dim",
                                                "v_head_dim",
                                                "num_experts",
                                                "num_experts_per_tok",
                                                "shared_experts",
                                                "first_num_dense_layers",
                                                "interleave_moe_layer_step",
                                                "sliding_window_size",
                                                "weight_dtype",
                                                "opt_type"};
  return keys;
}

constexpr const char* kQueryScalingKey = "query_scaling";
constexpr const char* kQueryScalingMaxText = "maxtext";

nlohmann::json model_identity(const Config& config) {
  const nlohmann::json all = config.to_json();
  nlohmann::json identity = nlohmann::json::object();
  for (const std::string& key : identity_keys()) {
    if (all.contains(key)) {
      identity[key] = all[key];
    }
  }
  // Not a config key: the attention's query scaling follows MaxText (model/builder/
  // initializers.h). Checkpoints from before that (logits scaled by 1/sqrt(head_dim) at run time
  // in every family) lack it and are refused: their weights would compute other logits now.
  identity[kQueryScalingKey] = kQueryScalingMaxText;
  return identity;
}

// A checkpoint made from another model (or, for a resume, another optimizer) is refused, naming
// the first key that differs, even where the tensor shapes would fit. Checkpoints written before
// tpusim recorded model_config are checked on model_name only.
void check_made_from(const Checkpoint& checkpoint, const std::string& directory,
                     const Config& config, bool with_optimizer) {
  const nlohmann::json& metadata = checkpoint.metadata;
  nlohmann::json recorded = nlohmann::json::object();
  if (metadata.is_object() && metadata.contains("model_config") &&
      metadata["model_config"].is_object()) {
    recorded = metadata["model_config"];
  } else if (metadata.is_object() && metadata.contains("model_name")) {
    recorded["model_name"] = metadata["model_name"];
  }
  const nlohmann::json current = model_identity(config);
  if (!recorded.contains(kQueryScalingKey)) {
    throw UserError(
        "checkpoint '" + directory +
            "' was made before tpusim followed MaxText's query scaling (1/sqrt(head_dim) "
            "in the query's initializer, not at run time): its weights would compute "
            "other logits in this tpusim; retrain it, or export and convert it",
        kQueryScalingKey);
  }
  for (const auto& [key, value] : recorded.items()) {
    if ((key == "opt_type" && !with_optimizer) || !current.contains(key)) {
      continue;
    }
    if (current[key] != value) {
      throw UserError("checkpoint '" + directory + "' was made with " + key + "=" + value.dump() +
                          " but this run has " + key + "=" + current[key].dump() +
                          " (a checkpoint loads only into the model it was made from)",
                      key);
    }
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

// The largest per-tensor relative L2 error ||a - b|| / ||b|| (the comparison of
// docs/reference/numerics.md: fp32 vs a reference, rel-L2 per tensor).
double max_relative_difference(const std::map<std::string, std::vector<float>>& a,
                               const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) {
    throw std::logic_error("verify: " + std::to_string(a.size()) + " tensors against the "
                           "reference's " + std::to_string(b.size()));
  }
  double worst = 0;
  for (const auto& [name, values] : a) {
    const auto found = b.find(name);
    if (found == b.end() || found->second.size() != values.size()) {
      throw std::logic_error("verify: the reference has no matching '" + name + "'");
    }
    const double relative = relative_l2(values, found->second);
    if (std::getenv("TPUSIM_VERIFY_DETAIL") != nullptr) {
      std::cerr << "  verify " << name << " rel-L2 " << relative << "\n";
    }
    worst = std::max(worst, relative);
  }
  return worst;
}

// The functional engine computes MaxText's math for the switches it builds; a switch it does not
// build would silently train another model, so `tpusim train` refuses it, naming the key.
void check_functional_support(const Config& config) {
  const auto refuse = [](const std::string& key, const std::string& value, const std::string& why) {
    throw UserError(key + ": " + value + " is not computed by tpusim train (" + why + ")", key);
  };
  // qk-norm is built as MaxText's default Attention does it (a per-head RMSNorm of query and key
  // before RoPE, model/builder/forward_builder.cpp). llama4's variant (a scale-free L2 norm after
  // RoPE) and MLA (whose attention has no such norm in tpusim) are not.
  if (uses_qk_norm(config)) {
    const std::string block = config.get_string("decoder_block");
    if (block == "llama4") {
      refuse("use_qk_norm", "true",
             "llama4's qk-norm, an L2 norm without scale after RoPE, is not built");
    }
    if (block == "deepseek" || config.get_string("attention_type") == "mla") {
      refuse("use_qk_norm", "true", "qk-norm with multi-head latent attention is not built");
    }
  }
  // OLMo 3's rotary embedding is YaRN-scaled and its qk-norm spans all heads (Hugging Face's
  // Olmo3Attention); the functional engine builds plain RoPE and per-head qk-norm.
  if (config.get_string("decoder_block") == "olmo3") {
    refuse("decoder_block", "olmo3",
           "its YaRN rotary embedding and all-heads qk-norm are not built; estimate and explore "
           "model it");
  }
  // Soft caps and normalize_embedding_logits are built (model/builder/forward_builder.cpp). MaxText
  // applies the final cap and the division by sqrt(emb_dim) only to tied logits; a final cap on
  // untied logits would be silently ignored there, so it is refused here rather than guessed.
  if (config.get_float("final_logits_soft_cap") > 0 && !config.get_bool("logits_via_embedding")) {
    refuse("final_logits_soft_cap", std::to_string(config.get_float("final_logits_soft_cap")),
           "MaxText caps only logits tied to the token embedding (logits_via_embedding true)");
  }
}

}  // namespace

ShardedModel::ShardedModel(const Config& config, Transport* transport)
    : own_transport_(transport == nullptr ? std::make_unique<LocalTransport>() : nullptr),
      transport_(transport == nullptr ? own_transport_.get() : transport),
      program_(build_step_program(config)),
      identity_({{"model_name", config.get_string("model_name")},
                 {"model_config", model_identity(config)}}) {
  if (const PipelineSchedule& pipeline = program_.step->forward_info.pipeline; pipeline.active()) {
    // The functional engine runs MaxText's loop (sim/functional/pipeline_loop.cpp), threads and
    // MPI ranks alike, without delayed forwarding or a chunked head.
    if (pipeline.forwarding_delay > 1) {
      throw UserError(
          "pipeline_delay_activation_forwarding: true is not computed by tpusim train "
          "(estimate and explore model it)",
          "pipeline_delay_activation_forwarding");
    }
    if (config.get_int("num_vocab_tiling") > 1) {
      throw UserError("num_vocab_tiling: " + std::to_string(config.get_int("num_vocab_tiling")) +
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
  communicator_ = transport_->make_communicator(sizes_, owner_, collective_timeout(config));
  slots_ = std::make_unique<ExecutionSlots>(
      resolve_num_threads(config.get_int("num_threads"), transport_->ranks_on_host()));
  communicator_->set_execution_slots(slots_.get());
  const bool bf16 = config.get_string("functional_dtype") == "bfloat16_matmul";
  const bool fast = config.get_string("functional_precision") == "fast";
  // num_threads threads compute: with fewer devices than that, each device's kernels get the
  // rest as helpers (results do not depend on it: sim/functional/kernel_threads.h).
  const int per_device =
      std::max(1, slots_->count() / std::max(1, static_cast<int>(devices_.size())));
  for (const int device : devices_) {
    DeviceContext context = InProcessCommunicator::context_for(device, sizes_);
    context.bf16_matmul_inputs = bf16;
    context.fast_kernels = fast;
    if (per_device > 1) {
      kernel_threads_.push_back(std::make_unique<KernelThreads>(per_device));
      context.threads = kernel_threads_.back().get();
    }
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
    executors_[index]->record_token_log_probs(&sinks[index]);
  }
  on_every_device([&](Executor& executor, int device) {
    executor.set_batch(tokens, targets);
    results[static_cast<size_t>(device)] = executor.compute_gradients();
  });
  if (log_probs != nullptr) {
    // Every token some device of some rank computed, as (index, value) pairs on every rank.
    std::vector<double> mine;
    for (size_t index = 0; index < sinks.size(); ++index) {
      executors_[index]->record_token_log_probs(nullptr);
      for (size_t token = 0; token < sinks[index].values.size(); ++token) {
        if (!std::isnan(sinks[index].values[token])) {
          mine.insert(mine.end(), {static_cast<double>(token), sinks[index].values[token]});
        }
      }
    }
    log_probs->values.assign(static_cast<size_t>(log_probs->sequences * log_probs->length),
                             std::numeric_limits<float>::quiet_NaN());
    for (const std::vector<double>& rank : transport_->all_gather(mine)) {
      for (size_t entry = 0; entry + 2 <= rank.size(); entry += 2) {
        log_probs->values.at(static_cast<size_t>(rank[entry])) =
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

namespace {

// A checkpoint as one byte string (for the broadcast from rank 0): an 8-byte little-endian header
// size, a JSON header (step, metadata, and every tensor's name, shape and value count), then the
// values of the weights and of the optimizer state, in the header's order.
std::string serialize_checkpoint(const Checkpoint& checkpoint) {
  nlohmann::json header = {{"step", checkpoint.step}, {"metadata", checkpoint.metadata}};
  std::string values;
  for (const auto& [part, tensors] :
       {std::pair{"weights", &checkpoint.weights}, std::pair{"optimizer", &checkpoint.optimizer}}) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [name, tensor] : *tensors) {
      list.push_back({name, tensor.shape, tensor.values.size()});
      values.append(reinterpret_cast<const char*>(tensor.values.data()),
                    tensor.values.size() * sizeof(float));
    }
    header[part] = list;
  }
  const std::string text = header.dump();
  std::string bytes(sizeof(uint64_t), '\0');
  const uint64_t size = text.size();
  std::memcpy(bytes.data(), &size, sizeof(size));
  return bytes + text + values;
}

Checkpoint deserialize_checkpoint(const std::string& bytes) {
  uint64_t size = 0;
  std::memcpy(&size, bytes.data(), sizeof(size));
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(sizeof(size), size));
  Checkpoint checkpoint;
  checkpoint.step = header["step"].get<int64_t>();
  checkpoint.metadata = header["metadata"];
  size_t offset = sizeof(size) + size;
  for (const auto& [part, tensors] :
       {std::pair{"weights", &checkpoint.weights}, std::pair{"optimizer", &checkpoint.optimizer}}) {
    for (const nlohmann::json& entry : header[part]) {
      CheckpointTensor& tensor = (*tensors)[entry[0].get<std::string>()];
      tensor.shape = entry[1].get<std::vector<int64_t>>();
      tensor.values.resize(entry[2].get<size_t>());
      const size_t count = tensor.values.size() * sizeof(float);
      if (offset + count > bytes.size()) {
        throw std::logic_error("checkpoint broadcast: truncated");
      }
      std::memcpy(tensor.values.data(), bytes.data() + offset, count);
      offset += count;
    }
  }
  return checkpoint;
}

// Rank 0 reads the checkpoint at `directory` and every rank gets it (the other hosts need not see
// rank 0's files).
Checkpoint load_shared_checkpoint(Transport& transport, const std::string& directory) {
  if (!transport.distributed()) {
    return load_checkpoint(directory);
  }
  const std::string bytes = transport.broadcast_from_root(
      transport.rank() == 0 ? serialize_checkpoint(load_checkpoint(directory)) : "");
  return deserialize_checkpoint(bytes);
}

// load_parameters_path names Hugging Face weights (hf_names.h) rather than a tpusim checkpoint:
// a .safetensors file, or a directory with model.safetensors and no state.json (an export-hf
// directory, or a public checkpoint converted to one safetensors file).
bool is_hf_weights(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_regular_file(path, error)) {
    return true;
  }
  return fs::is_regular_file(fs::path(path) / "model.safetensors", error) &&
         !fs::exists(fs::path(path) / "state.json", error);
}

// The HF weights at `path` as tpusim's global weights; rank 0 reads, every rank gets them.
Checkpoint load_shared_hf_weights(Transport& transport, const std::string& path,
                                  const Config& config) {
  const auto read = [&] {
    namespace fs = std::filesystem;
    std::error_code error;
    const std::string file =
        fs::is_directory(path, error) ? (fs::path(path) / "model.safetensors").string() : path;
    Checkpoint checkpoint;
    checkpoint.weights = from_hf(config, read_safetensors(file));
    return checkpoint;
  };
  if (!transport.distributed()) {
    return read();
  }
  return deserialize_checkpoint(
      transport.broadcast_from_root(transport.rank() == 0 ? serialize_checkpoint(read()) : ""));
}

}  // namespace

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

namespace {

// Held-out sequences shown by the token view (fewer when the batch is smaller).
constexpr int64_t kTokenVizSequences = 4;

void check_token_viz_file(const std::string& path, int64_t eval_interval) {
  if (eval_interval <= 0) {
    throw UserError("token_viz_file: needs eval_interval > 0 (the view is drawn at evaluations)",
                    "token_viz_file");
  }
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw UserError("token_viz_file: '" + path + "' exists and is not a regular file",
                    "token_viz_file");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, error)) {
    throw UserError("token_viz_file: the directory of '" + path + "' does not exist",
                    "token_viz_file");
  }
}

// Adds one evaluation's log-probabilities of the sampled sequences (and, the first time, their
// target tokens' text).
void add_token_viz_step(TokenViz& viz, int64_t step, const TokenLogProbs& log_probs,
                        const Batch& batch) {
  const int64_t shown = std::min(kTokenVizSequences, log_probs.sequences);
  if (viz.pieces.empty()) {
    for (int64_t sequence = 0; sequence < shown; ++sequence) {
      const auto first = batch.targets.begin() + sequence * log_probs.length;
      viz.pieces.push_back(
          token_texts(viz.tokenizer_path, std::vector<int32_t>(first, first + log_probs.length)));
    }
  }
  TokenViz::Step entry;
  entry.step = step;
  for (int64_t sequence = 0; sequence < shown; ++sequence) {
    const auto first = log_probs.values.begin() + sequence * log_probs.length;
    entry.log_probs.emplace_back(first, first + log_probs.length);
  }
  viz.steps.push_back(std::move(entry));
}

// The page, with the loss curves of the metrics so far (a resumed run's include the steps before
// the resume; its token heatmaps start at the resume).
void write_token_viz(const std::string& path, TokenViz& viz, const std::string& metrics_text) {
  viz.loss.clear();
  viz.eval_loss.clear();
  std::istringstream lines(metrics_text);
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    viz.loss.emplace_back(record["step"].get<int64_t>(), record["loss"].get<double>());
    if (record.contains("eval_loss")) {
      viz.eval_loss.emplace_back(record["step"].get<int64_t>(), record["eval_loss"].get<double>());
    }
  }
  write_file_atomically(path, render_token_viz(viz));
}

}  // namespace

Trainer::Trainer(const Config& config, Transport* transport)
    : config_(config),
      data_(Dataset::from_config(config)),
      own_transport_(transport == nullptr ? std::make_unique<LocalTransport>() : nullptr),
      transport_(transport == nullptr ? own_transport_.get() : transport) {
  check_functional_support(config_);
  transport_->set_timeout(collective_timeout(config_));
}

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
  // --verify compares the reference numerics (double accumulation) of the sharded run and of the
  // unsharded one, whatever functional_precision says.
  Config run_config = config_;
  if (options.verify) {
    run_config.set("functional_precision", "reference", "--verify");
  }
  ShardedModel model(run_config, transport_);
  // Under mpirun rank 0 alone reports, writes and verifies; the other ranks compute.
  const bool root = transport_->rank() == 0;
  const bool report = options.progress && root;
  std::unique_ptr<ShardedModel> reference;
  if (options.verify && root) {
    reference = std::make_unique<ShardedModel>(unsharded_reference_config(run_config));
  }
  const StepProgram& program = model.program();
  const int64_t sequences = program.microbatch;
  const int64_t length = config_.get_int("max_target_length");
  const int64_t steps = config_.get_int("steps");
  const int64_t eval_interval = config_.get_int("eval_interval");
  const int64_t eval_steps = std::max<int64_t>(1, config_.get_int("eval_steps"));
  const double clip = config_.get_float("gradient_clipping_threshold");
  const std::string metrics_path = root ? config_.get_string("metrics_file") : "";
  std::string metrics_text;
  std::vector<StepMetrics> curve;
  // Every rank computes the token view's log-probabilities (a collective); rank 0 writes it.
  const std::string viz_path = config_.get_string("token_viz_file");
  TokenViz viz;
  if (!viz_path.empty()) {
    check_token_viz_file(viz_path, eval_interval);
    viz.title = "tpusim train: " + config_.get_string("model_name") + ", token probabilities";
    viz.tokenizer_path = config_.get_string("tokenizer_path");
  }
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
  // The run's files stay inside base_output_directory: run_name is one path component.
  if (const std::string run_name = config_.get_string("run_name");
      run_name.find('/') != std::string::npos || run_name == "." || run_name == "..") {
    throw UserError("run_name: '" + run_name +
                        "' must be a plain name (no '/', not '.' or '..'): the run's files go to "
                        "base_output_directory/run_name",
                    "run_name");
  }
  const int64_t period = config_.get_int("checkpoint_period");
  int64_t first_step = 1;
  // Rank 0 finds the checkpoint; every rank restores it.
  const std::string latest = transport_->broadcast_from_root(
      checkpointing && root ? latest_checkpoint(run_directory) : "");
  if (!latest.empty()) {
    const Checkpoint checkpoint = load_shared_checkpoint(*transport_, latest);
    check_made_from(checkpoint, latest, config_, /*with_optimizer=*/true);
    model.restore(checkpoint, /*with_optimizer=*/true);
    if (reference) {
      reference->restore(checkpoint, true);
    }
    first_step = checkpoint.step + 1;
    if (checkpoint.metadata.contains("metrics")) {
      if (!checkpoint.metadata["metrics"].is_string()) {
        throw UserError("checkpoint '" + latest +
                        "': state.json metadata.metrics is not a string (not written by tpusim)");
      }
      metrics_text = checkpoint.metadata["metrics"].get<std::string>();
    }
    if (report) {
      progress << "resumed from " << latest << " (step " << checkpoint.step << ")\n";
    }
  } else if (const std::string path = config_.get_string("load_parameters_path"); !path.empty()) {
    const bool hf = is_hf_weights(path);
    const Checkpoint checkpoint = hf ? load_shared_hf_weights(*transport_, path, config_)
                                     : load_shared_checkpoint(*transport_, path);
    if (!hf) {
      check_made_from(checkpoint, path, config_, /*with_optimizer=*/false);
    }
    model.restore(checkpoint, /*with_optimizer=*/false);
    if (reference) {
      reference->restore(checkpoint, false);
    }
  }
  CrossProcessTraffic traffic_before = model.traffic();
  if (report && !data_.note().empty()) {
    progress << data_.note() << "\n";
  }
  for (int64_t step = first_step; step <= steps; ++step) {
    transport_->at_step(step);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Batch> batches;
    for (int64_t micro = 0; micro < program.accumulation_steps; ++micro) {
      batches.push_back(data_.train_batch(step - 1, micro, sequences));
    }
    const bool dump = !options.dump_directory.empty() && step == first_step;
    Checkpoint initial;
    if (dump) {
      initial = model.to_checkpoint(step - 1);
    }
    const StepResult result = model.compute_gradients(batches);
    optimizer.step = step;
    optimizer.learning_rate = learning_rate(step);
    optimizer.gradient_scale = clip > 0 ? clip / std::max(result.grad_norm, clip) : 1.0;
    StepMetrics metrics;
    if (options.verify) {
      const auto gradients = model.global_gradients();  // complete on rank 0
      model.apply_update(optimizer);
      const auto weights = model.global_state();
      if (reference) {
        const StepResult expected = reference->compute_gradients(batches);
        const double loss_difference =
            std::abs(result.loss - expected.loss) / std::max(std::abs(expected.loss), 1e-30);
        const double gradient_difference =
            max_relative_difference(gradients, reference->global_gradients());
        DeviceContext::Optimizer reference_optimizer = optimizer;
        reference_optimizer.gradient_scale =
            clip > 0 ? clip / std::max(expected.grad_norm, clip) : 1.0;
        reference->apply_update(reference_optimizer);
        const double weight_difference =
            max_relative_difference(weights, reference->global_state());
        metrics.verify_loss_rel_diff = loss_difference;
        metrics.verify_gradient_rel_diff = gradient_difference;
        metrics.verify_weight_rel_diff = weight_difference;
        metrics.verify_max_rel_diff =
            std::max({loss_difference, gradient_difference, weight_difference});
      }
    } else {
      model.apply_update(optimizer);
    }
    if (transport_->distributed()) {
      const CrossProcessTraffic now = model.traffic();
      const std::vector<double> mine = {now.bytes_sent - traffic_before.bytes_sent,
                                        static_cast<double>(now.messages - traffic_before.messages),
                                        now.model_bytes - traffic_before.model_bytes,
                                        now.model_bytes_f32 - traffic_before.model_bytes_f32};
      traffic_before = now;
      CrossProcessTraffic total;
      for (const std::vector<double>& rank : transport_->all_gather(mine)) {
        total.bytes_sent += rank.at(0);
        total.messages += static_cast<int64_t>(rank.at(1));
        total.model_bytes += rank.at(2);
        total.model_bytes_f32 += rank.at(3);
      }
      metrics.traffic = total;
    }
    if (dump) {
      const auto gradients = model.global_gradients();
      const Checkpoint updated = model.to_checkpoint(step);
      if (root) {
        save_checkpoint(options.dump_directory + "/initial", initial);
        Checkpoint saved_gradients;
        saved_gradients.step = step;
        for (const auto& [name, values] : gradients) {
          saved_gradients.weights[name] = CheckpointTensor{initial.weights.at(name).shape, values};
        }
        save_checkpoint(options.dump_directory + "/gradients", saved_gradients);
        save_checkpoint(options.dump_directory + "/updated", updated);
        nlohmann::json dumped = {{"loss", result.loss},
                                 {"grad_norm", result.grad_norm},
                                 {"learning_rate", optimizer.learning_rate},
                                 {"gradient_scale", optimizer.gradient_scale},
                                 {"sequences", sequences},
                                 {"length", length},
                                 {"tokens", batches.front().tokens},
                                 {"targets", batches.front().targets}};
        write_file_atomically(options.dump_directory + "/step.json", dumped.dump());
      }
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
        // The token view samples evaluation batch 0: the same sequences at every evaluation.
        TokenLogProbs log_probs;
        log_probs.sequences = sequences;
        log_probs.length = length;
        const bool sample = !viz_path.empty() && index == 0;
        total += model.compute_gradients(eval, sample ? &log_probs : nullptr).loss;
        if (sample) {
          add_token_viz_step(viz, step, log_probs, eval.front());
        }
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
    if (metrics.traffic) {
      line["mpi_bytes_sent"] = metrics.traffic->bytes_sent;
      line["mpi_messages"] = metrics.traffic->messages;
      line["model_cross_rank_bytes"] = metrics.traffic->model_bytes;
      line["model_cross_rank_bytes_f32"] = metrics.traffic->model_bytes_f32;
    }
    metrics_text += line.dump() + "\n";
    if (!metrics_path.empty()) {
      write_file_atomically(metrics_path, metrics_text);
    }
    if (root && !viz_path.empty() && metrics.eval_loss) {
      write_token_viz(viz_path, viz, metrics_text);
    }
    if (report) {
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
      if (metrics.traffic) {
        progress << "  mpi " << std::setprecision(0) << metrics.traffic->bytes_sent << " B";
      }
      progress << "\n";
    }
    curve.push_back(metrics);
    // MaxText stops on a NaN or infinite loss (abort_on_nan_loss, abort_on_inf_loss); so does
    // tpusim, before the step's weights could be saved.
    if ((std::isnan(metrics.loss) && config_.get_bool("abort_on_nan_loss")) ||
        (std::isinf(metrics.loss) && config_.get_bool("abort_on_inf_loss"))) {
      throw UserError("step " + std::to_string(step) + ": the loss is " +
                      (std::isnan(metrics.loss) ? "NaN" : "infinite") +
                      "; training stopped (abort_on_nan_loss / abort_on_inf_loss), nothing saved "
                      "for this step");
    }
    if (checkpointing && ((period > 0 && step % period == 0) || step == steps)) {
      Checkpoint checkpoint = model.to_checkpoint(step);
      if (root) {
        checkpoint.metadata["data_position"] = step;
        checkpoint.metadata["metrics"] = metrics_text;
        save_checkpoint(checkpoint_directory(run_directory, step), checkpoint);
      }
    }
  }
  // The tokenizer finishes (and writes the cache for the next run) even when training needed only
  // its first eras.
  if (const std::string tokenized = data_.wait_until_tokenized(); report && !tokenized.empty()) {
    progress << tokenized << "\n";
  }
  return curve;
}

}  // namespace tpusim
