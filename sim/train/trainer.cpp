#include "sim/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_files.h"
#include "common/yaml_text.h"
#include "model/builder/build_options.h"
#include "model/builder/layer_plan.h"
#include "model/model_dims.h"
#include "sharding/mesh.h"
#include "sharding/step_program.h"
#include "sim/functional/kernels/library_gemm.h"
#include "sim/train/evaluation.h"
#include "sim/train/hf_names.h"
#include "sim/train/host_memory.h"
#include "sim/train/model_identity.h"
#include "sim/train/safetensors.h"
#include "sim/train/token_cache.h"
#include "sim/train/token_viz.h"
#include "sim/train/train_keys.h"

namespace tpusim {
namespace {

// The largest per-tensor relative L2 error ||a - b|| / ||b|| (the comparison of
// docs/reference/numerics.md: fp32 vs a reference, rel-L2 per tensor).
double max_relative_difference(const std::map<std::string, std::vector<float>>& a,
                               const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) {
    throw std::logic_error("verify: " + std::to_string(a.size()) +
                           " tensors against the "
                           "reference's " +
                           std::to_string(b.size()));
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

// A key's number as a config writes it (0.01, not 0.010000).
std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

// Keys that change only the numbers a step computes (the estimate does not read them,
// configs/maxtext/base_keys.tsv lists them as "none"): set away from the math the functional
// engine builds, they are refused rather than ignored. Its router is a softmax over all experts
// whose top-k probabilities are the weights (renormalized as MaxText's block does it:
// BuildOptions::normalize_router_top_k; scaled by routed_scaling_factor); its RoPE is the plain
// one.
template <typename Refuse>
void refuse_unbuilt_numerics(const TrainNumerics& numerics, const ModelDims& dims,
                             const Refuse& refuse) {
  if (const std::string& rope = numerics.rope_type; !rope.empty() && rope != "default") {
    refuse("rope_type", rope, "the functional engine builds plain RoPE, without frequency scaling");
  }
  if (numerics.enable_dropout && numerics.dropout_rate > 0) {
    refuse("dropout_rate", number_text(numerics.dropout_rate), "dropout is not built");
  }
  // The clip is built as MaxText computes it for deepseek4's routed experts (SwiGLU,
  // model/builder/feed_forward_block.cpp); gpt-oss clips another gating (sigmoid of 1.702 x,
  // times up + 1), and the other blocks MaxText does not clip at all.
  if (numerics.mlp_activations_limit > 0) {
    const bool swiglu = dims.mlp_activations == std::vector<std::string>{"silu", "linear"} ||
                        dims.mlp_activations == std::vector<std::string>{"swish", "linear"};
    if (dims.family().block != DecoderBlock::kDeepseek4 || !swiglu) {
      refuse("mlp_activations_limit", number_text(numerics.mlp_activations_limit),
             "the clipped activations are built for the routed SwiGLU experts of " +
                 std::string(decoder_family(DecoderBlock::kDeepseek4).name) +
                 " only (gpt-oss's clamped sigmoid gating is not built)");
    }
  }
  if (numerics.num_experts <= 1) {
    return;
  }
  // deepseek4's score functions are checked with its block (refuse_unbuilt_deepseek4).
  if (const std::string& score = numerics.routed_score_func;
      !score.empty() && score != "softmax" && dims.family().block != DecoderBlock::kDeepseek4) {
    refuse("routed_score_func", score, "the router scores experts with a softmax only");
  }
  // The bias is built as MaxText's deepseek4 router uses it (refuse_unbuilt_deepseek4); the
  // other blocks' routers (deepseek3's sigmoid scores and scaled weights) are not.
  if (numerics.routed_bias && dims.family().block != DecoderBlock::kDeepseek4) {
    refuse("routed_bias", "true",
           "the router's selection bias is built for " +
               std::string(decoder_family(DecoderBlock::kDeepseek4).name) + "'s router only");
  }
  if (numerics.n_routing_groups > 0) {
    refuse("n_routing_groups", std::to_string(numerics.n_routing_groups),
           "group-limited routing is not built");
  }
  // Built for deepseek4's routers (model/builder/feed_forward_block.cpp load_balance_scale).
  if (numerics.load_balance_loss_weight > 0 && dims.family().block != DecoderBlock::kDeepseek4) {
    refuse("load_balance_loss_weight", number_text(numerics.load_balance_loss_weight),
           "the load-balance loss is added for " +
               std::string(decoder_family(DecoderBlock::kDeepseek4).name) + "'s routers only");
  }
}

// deepseek4 (docs/reference/deepseek4.md, "What train computes"): the functional engine builds
// its layers with sliding-window attention (compress_ratios entry 0), compressed sparse attention
// (4; not under context parallelism) or heavily compressed attention (entries above 4), with mHC's
// residual streams (mhc_expansion_rate, model/builder/hyper_connections.cpp) or one plain one,
// routing by the router or, in the first first_num_hash_layers layers, by MaxText's tid2eid table,
// in MaxText's layer order (train_layer_order, model/builder/layer_plan.h); what it does not build
// is refused by the key that turns it on.
template <typename Refuse>
void refuse_unbuilt_deepseek4(const ModelDims& dims, const BuildOptions& options,
                              const TrainNumerics& numerics, const Refuse& refuse) {
  for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
    if (const int64_t ratio = dims.compress_ratio(layer);
        ratio != 0 && ratio < kCompressedSparseRatio) {
      refuse("compress_ratios", "layer " + std::to_string(layer) + ": " + std::to_string(ratio),
             "ratios 2 and 3 (no compressor, compressed_rope_max_timescale) are not computed; 0 "
             "gives sliding-window attention, 4 compressed sparse attention, an entry above 4 "
             "heavily compressed attention");
    }
  }
  if (dims.qk_rope_head_dim != dims.head_dim) {
    refuse("qk_rope_head_dim", std::to_string(dims.qk_rope_head_dim),
           "partial RoPE is not computed; it must equal head_dim (" +
               std::to_string(dims.head_dim) + ")");
  }
  if (!dims.is_moe()) {
    return;
  }
  // MaxText's RoutedMoE for deepseek4 (moe.py get_topk, docs/reference/deepseek4.md) picks the
  // top-k of the gate's scores and weights them by a softmax over those scores, without
  // routed_scaling_factor (its DEEPSEEK-only deepseek_scale_weights). With raw logits as scores
  // (routed_score_func '') that is the engine's softmax router renormalized, as the family's
  // RouterWeights::kSoftmaxOfChosen makes it whatever norm_topk_prob says; with the preset's
  // sqrtsoftplus the router reads sqrt(softplus(logit)) as the scores
  // (OpAttrs::sqrt_softplus_scores).
  if (const std::string& score = numerics.routed_score_func;
      !score.empty() && score != "sqrtsoftplus") {
    refuse("routed_score_func", score,
           std::string(dims.family().name) +
               "'s router is computed on raw logits ('') or sqrtsoftplus scores only, whose "
               "top-k MaxText weights by a softmax over them");
  }
  if (options.routed_scaling_factor != 1) {
    refuse("routed_scaling_factor", number_text(options.routed_scaling_factor),
           "MaxText's " + std::string(dims.family().name) +
               " router does not scale its top-k weights");
  }
  // routed_bias is built (moe/gate_bias, chosen on score + bias, weighted without it), and so is
  // its auxiliary-loss-free update after the optimizer step (MaxText train.py with
  // routed_bias_update_rate > 0: rate x sign(balanced load - the expert's load), counted over the
  // whole step; model/autodiff/training_step.cpp).
}

}  // namespace

void check_functional_support(const Config& config) {
  const auto refuse = [](const std::string& key, const std::string& value, const std::string& why) {
    throw UserError(key + ": " + value + " is not computed by tpusim train (" + why + ")", key);
  };
  // qk-norm is built as MaxText's default Attention does it (a per-head RMSNorm of query and key
  // before RoPE, model/builder/attention_block.cpp). llama4's variant (a scale-free L2 norm after
  // RoPE) and MLA (whose attention has no such norm in tpusim) are not.
  const ModelDims dims = ModelDims::from_config(config);
  const DecoderFamily& family = dims.family();
  if (qk_norm_from_config(config, family)) {
    if (family.qk_norm == QkNormKind::kL2AfterRope) {
      refuse("use_qk_norm", "true",
             std::string(family.name) +
                 "'s qk-norm, an L2 norm without scale after RoPE, is not built");
    }
    if (family.always_mla() || dims.attention_type == "mla") {
      refuse("use_qk_norm", "true", "qk-norm with multi-head latent attention is not built");
    }
  }
  // Families whose layers the functional engine does not compute (olmo3, the Gated DeltaNet
  // ones): their traits row says why (DecoderFamily::train_refusal).
  if (family.train_refusal != nullptr) {
    refuse("decoder_block", family.name, family.train_refusal);
  }
  const TrainNumerics numerics = TrainNumerics::from_config(config);
  refuse_unbuilt_numerics(numerics, dims, refuse);
  if (family.has_compressed_attention()) {
    const BuildOptions options = BuildOptions::from_config(config);
    refuse_unbuilt_deepseek4(dims, options, numerics, refuse);
    // Under context parallelism (the axes base.yml's rules give activation_length) each device
    // pools the blocks of its own tokens, which must then be whole blocks.
    const MeshShape mesh = resolve_mesh(config, slice_from_config(config));
    const int64_t context =
        static_cast<int64_t>(mesh.size("context")) * mesh.size("context_usp_ulysses");
    for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
      const int64_t ratio = dims.compress_ratio(layer);
      if (ratio == kCompressedSparseRatio && context > 1) {
        // CSA's block c pools half of block c - 1's tokens, and the indexer's top-k ranks every
        // block: across a context split both need another device's blocks, which is not built.
        std::string key;
        int split = 1;
        for (const char* axis : {"context", "context_usp_ulysses"}) {
          const int index = mesh_axis_index(axis);
          for (const bool dcn : {false, true}) {
            const int size = dcn ? mesh.dcn[index] : mesh.ici[index];
            if (key.empty() && size > 1) {
              key = mesh_axis_key(dcn, axis);
              split = size;
            }
          }
        }
        refuse(key, std::to_string(split),
               "compressed sparse attention (compress_ratios 4, layer " + std::to_string(layer) +
                   ") is not computed with its sequence split over context shards: its "
                   "overlapping windows and the indexer's top-k read blocks of other shards");
      }
      if (ratio > kCompressedSparseRatio && options.max_target_length % (ratio * context) != 0) {
        refuse("max_target_length", std::to_string(options.max_target_length),
               "with " + std::to_string(context) +
                   " context shards each device pools its own tokens into blocks of " +
                   std::to_string(ratio) + ": it must be a multiple of " +
                   std::to_string(ratio * context));
      }
    }
  }
  // llama4's router scales each token by the sigmoid of its chosen logits before the experts
  // (MaxText moe.py permute); the engine weights the experts' outputs by softmax probabilities.
  if (family.router_weights == RouterWeights::kSigmoidScalesInput && dims.is_moe()) {
    refuse("decoder_block", family.name,
           "its router (the sigmoid of each chosen logit scaling the token before its expert) is "
           "not built");
  }
  // Soft caps and normalize_embedding_logits are built (model/builder/forward_builder.cpp). MaxText
  // applies the final cap and the division by sqrt(emb_dim) only to tied logits; a final cap on
  // untied logits would be silently ignored there, so it is refused here rather than guessed.
  if (numerics.final_logits_soft_cap > 0 && !numerics.logits_via_embedding) {
    refuse("final_logits_soft_cap", std::to_string(numerics.final_logits_soft_cap),
           "MaxText caps only logits tied to the token embedding (logits_via_embedding true)");
  }
  // Every other key train does not build, from configs/maxtext/train_keys.tsv (issue 35).
  refuse_keys_train_does_not_build(config, family.train_checked_keys);
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

}  // namespace

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

namespace {

// The HF weights at `path` as tpusim's global weights; rank 0 reads, every rank gets them.
Checkpoint load_shared_hf_weights(Transport& transport, const std::string& path,
                                  const Config& config) {
  const auto read = [&] {
    namespace fs = std::filesystem;
    std::error_code error;
    const bool directory = fs::is_directory(path, error);
    const std::string file = directory ? (fs::path(path) / "model.safetensors").string() : path;
    // The directory's config.json, when it has one, must describe this run's model.
    if (const fs::path config_json = fs::path(path) / "config.json";
        directory && fs::is_regular_file(config_json, error)) {
      nlohmann::json hf_config;
      try {
        hf_config = nlohmann::json::parse(read_text_file(config_json.string()));
      } catch (const nlohmann::json::exception& parse_error) {
        throw UserError("load_parameters_path: '" + config_json.string() +
                            "' is not valid JSON: " + parse_error.what(),
                        "load_parameters_path");
      }
      check_hf_config(config, hf_config, config_json.string());
    }
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

Checkpoint load_model_weights(const std::string& path, const Config& config, Transport& transport) {
  note_input(path);
  if (is_hf_weights(path)) {
    return load_shared_hf_weights(transport, path, config);
  }
  Checkpoint checkpoint = load_shared_checkpoint(transport, path);
  check_made_from(checkpoint, path, config, /*with_optimizer=*/false);
  return checkpoint;
}

Config unsharded_reference_config(const Config& config) {
  Config reference = config;
  const Slice slice = slice_from_config(config);
  const double per_device = FunctionalSettings::from_config(config).per_device_batch_size;
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

void check_token_viz_file(const std::string& path, int64_t eval_interval,
                          const std::string& metrics_file) {
  if (eval_interval <= 0) {
    throw UserError("token_viz_file: needs eval_interval > 0 (the view is drawn at evaluations)",
                    "token_viz_file");
  }
  std::error_code error;
  // One file for both: each evaluation's page replaced the metrics, exit 0.
  if (!metrics_file.empty() && same_output_path(path, metrics_file)) {
    throw UserError("token_viz_file: '" + path +
                        "' is metrics_file too (the page would replace the metrics): give each "
                        "its own file",
                    "token_viz_file");
  }
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

// The page, with the loss curves of the metrics so far (a resumed run's include the steps before
// the resume; its token heatmaps start at the resume).
void write_token_viz(const std::string& path, TokenViz& viz, const std::string& metrics_text) {
  viz.loss.clear();
  viz.eval_loss.clear();
  std::istringstream lines(metrics_text);
  std::string line;
  // A NaN or infinite loss is written to the metrics as null (JSON has no NaN): drawn as a gap.
  const auto number = [](const nlohmann::json& value) {
    return value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
  };
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) {
      continue;  // not a metrics record (resume_metrics checked a resumed run's lines)
    }
    const auto step = record["step"].get<int64_t>();
    viz.loss.emplace_back(step, number(record.value("loss", nlohmann::json())));
    if (record.contains("eval_loss")) {
      viz.eval_loss.emplace_back(step, number(record["eval_loss"]));
    }
  }
  write_file_atomically(path, render_token_viz(viz));
}

}  // namespace

Trainer::Trainer(const Config& config, Transport* transport)
    : config_(config),
      settings_(TrainSettings::from_config(config)),
      data_(Dataset::from_config(config)),
      own_transport_(transport == nullptr ? std::make_unique<LocalTransport>() : nullptr),
      transport_(transport == nullptr ? own_transport_.get() : transport) {
  check_functional_support(config_);
  transport_->set_timeout(collective_timeout(settings_.collective_timeout_seconds));
}

double Trainer::learning_rate(int64_t step) const {
  const double peak = settings_.schedule.peak;
  int64_t schedule = settings_.schedule.schedule_steps;
  if (schedule <= 0) {
    schedule = std::max<int64_t>(1, settings_.steps);
  }
  const double warmup =
      std::floor(settings_.schedule.warmup_steps_fraction * static_cast<double>(schedule));
  const auto current = static_cast<double>(step - 1);
  if (current < warmup) {
    return peak * (current + 1) / std::max(1.0, warmup);
  }
  const double final_fraction = settings_.schedule.final_fraction;
  const double progress =
      std::min(1.0, (current - warmup) / std::max(1.0, static_cast<double>(schedule) - warmup));
  const double cosine = 0.5 * (1 + std::cos(M_PI * progress));
  return peak * (final_fraction + (1 - final_fraction) * cosine);
}

namespace {

// The run's directory, checked: checkpoints need one, and run_name is one path component (the
// run's files stay inside base_output_directory).
std::string checked_run_directory(const TrainSettings& settings) {
  const std::string& run_name = settings.run_name;
  if (settings.enable_checkpointing &&
      (settings.base_output_directory.empty() || run_name.empty())) {
    throw UserError("enable_checkpointing: needs base_output_directory and run_name");
  }
  if (run_name.find('/') != std::string::npos || run_name == "." || run_name == "..") {
    throw UserError("run_name: '" + run_name +
                        "' must be a plain name (no '/', not '.' or '..'): the run's files go to "
                        "base_output_directory/run_name",
                    "run_name");
  }
  return settings.base_output_directory + "/" + run_name;
}

// Where a run starts: the step after its latest checkpoint (model, reference and the metrics of
// the steps before restored), or step 1, from load_parameters_path's weights when given.
int64_t restore_start(const Config& config, const TrainSettings& settings, Transport& transport,
                      const std::string& run_directory, ShardedModel& model,
                      ShardedModel* reference, std::string& metrics_text, bool report,
                      std::ostream& progress) {
  // Rank 0 finds the checkpoint; every rank restores it.
  const bool root = transport.rank() == 0;
  const std::string latest = transport.broadcast_from_root(
      settings.enable_checkpointing && root ? latest_checkpoint(run_directory) : "");
  if (!latest.empty()) {
    note_input(latest);
    const Checkpoint checkpoint = load_shared_checkpoint(transport, latest);
    check_made_from(checkpoint, latest, config, /*with_optimizer=*/true);
    if (const int64_t steps = settings.steps; checkpoint.step >= steps) {
      throw UserError("steps: " + std::to_string(steps) + " but the run's latest checkpoint '" +
                          latest + "' is at step " + std::to_string(checkpoint.step) +
                          ": nothing left to train (raise steps to go on, or name another "
                          "run_name)",
                      "steps");
    }
    model.restore(checkpoint, /*with_optimizer=*/true);
    if (reference != nullptr) {
      reference->restore(checkpoint, true);
    }
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
    return checkpoint.step + 1;
  }
  if (const std::string& path = settings.load_parameters_path; !path.empty()) {
    const Checkpoint checkpoint = load_model_weights(path, config, transport);
    model.restore(checkpoint, /*with_optimizer=*/false);
    if (reference != nullptr) {
      reference->restore(checkpoint, false);
    }
  }
  return 1;
}

// Applies the update with --verify: the sharded model's gradients and updated weights against the
// unsharded reference's (on rank 0; `reference` is null on the other ranks), into `metrics`.
void update_and_verify(ShardedModel& model, ShardedModel* reference,
                       const std::vector<Batch>& batches, const StepResult& result,
                       const DeviceContext::Optimizer& optimizer, double clip,
                       StepMetrics& metrics) {
  const auto gradients = model.global_gradients();  // complete on rank 0
  model.apply_update(optimizer);
  const auto weights = model.global_state();
  if (reference == nullptr) {
    return;
  }
  const StepResult expected = reference->compute_gradients(batches);
  const double loss_difference =
      std::abs(result.loss - expected.loss) / std::max(std::abs(expected.loss), 1e-30);
  const double gradient_difference =
      max_relative_difference(gradients, reference->global_gradients());
  DeviceContext::Optimizer reference_optimizer = optimizer;
  reference_optimizer.gradient_scale = clip > 0 ? clip / std::max(expected.grad_norm, clip) : 1.0;
  reference->apply_update(reference_optimizer);
  const double weight_difference = max_relative_difference(weights, reference->global_state());
  metrics.verify_loss_rel_diff = loss_difference;
  metrics.verify_gradient_rel_diff = gradient_difference;
  metrics.verify_weight_rel_diff = weight_difference;
  metrics.verify_max_rel_diff = std::max({loss_difference, gradient_difference, weight_difference});
}

// What the step's collectives sent between ranks, summed over the ranks (collective).
CrossProcessTraffic step_traffic(Transport& transport, const ShardedModel& model,
                                 CrossProcessTraffic& before) {
  const CrossProcessTraffic now = model.traffic();
  const std::vector<double> mine = {
      now.bytes_sent - before.bytes_sent, static_cast<double>(now.messages - before.messages),
      now.model_bytes - before.model_bytes, now.model_bytes_f32 - before.model_bytes_f32};
  before = now;
  CrossProcessTraffic total;
  for (const std::vector<double>& rank : transport.all_gather(mine)) {
    total.bytes_sent += rank.at(0);
    total.messages += static_cast<int64_t>(rank.at(1));
    total.model_bytes += rank.at(2);
    total.model_bytes_f32 += rank.at(3);
  }
  return total;
}

// --dump: the weights before and after the first step, its gradients and its batch.
void write_dump(const std::string& directory, const Checkpoint& initial,
                const std::map<std::string, std::vector<float>>& gradients,
                const Checkpoint& updated, const StepResult& result,
                const DeviceContext::Optimizer& optimizer, int64_t sequences, int64_t length,
                const Batch& batch) {
  save_checkpoint(directory + "/initial", initial);
  Checkpoint saved_gradients;
  saved_gradients.step = updated.step;
  for (const auto& [name, values] : gradients) {
    saved_gradients.weights[name] = CheckpointTensor{initial.weights.at(name).shape, values};
  }
  save_checkpoint(directory + "/gradients", saved_gradients);
  save_checkpoint(directory + "/updated", updated);
  const nlohmann::json dumped = {{"loss", result.loss},
                                 {"grad_norm", result.grad_norm},
                                 {"learning_rate", optimizer.learning_rate},
                                 {"gradient_scale", optimizer.gradient_scale},
                                 {"sequences", sequences},
                                 {"length", length},
                                 {"tokens", batch.tokens},
                                 {"targets", batch.targets}};
  write_file_atomically(directory + "/step.json", dumped.dump());
}

// One line of the metrics file (JSON keeps every bit of a double).
nlohmann::json metrics_line(const StepMetrics& metrics) {
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
  return line;
}

// The progress line of a step: "step     1  loss 6.0414  grad_norm 0.1716  lr 3.00e-05 ...".
void print_progress(std::ostream& progress, const StepMetrics& metrics) {
  progress << "step " << std::setw(5) << metrics.step << "  loss " << std::fixed
           << std::setprecision(4) << metrics.loss << "  grad_norm " << metrics.grad_norm << "  lr "
           << std::scientific << std::setprecision(2) << metrics.learning_rate << std::fixed << "  "
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

// MaxText stops on a NaN or infinite loss (abort_on_nan_loss, abort_on_inf_loss). tpusim stops,
// under the same two switches, on any value of the step that is not finite: the loss and the
// gradient norm before the update, the updated weights and moments after it, the eval loss. It
// stops before the step's metrics line, token page or checkpoint are written, so nothing saved
// holds a NaN (a NaN gradient norm would make every weight NaN one step before the loss shows it).
void stop_on_non_finite(const TrainSettings& settings, int64_t step, const std::string& what,
                        double value) {
  if ((std::isnan(value) && settings.abort_on_nan_loss) ||
      (std::isinf(value) && settings.abort_on_inf_loss)) {
    throw UserError("step " + std::to_string(step) + ": " + what + " is " +
                    (std::isnan(value) ? "NaN" : "infinite") +
                    "; training stopped (abort_on_nan_loss / abort_on_inf_loss), nothing saved "
                    "for this step");
  }
}

void stop_on_non_finite_weights(const TrainSettings& settings, int64_t step, ShardedModel& model) {
  if (!settings.abort_on_nan_loss && !settings.abort_on_inf_loss) {
    return;
  }
  if (const int64_t bad = model.non_finite_state_values(); bad > 0) {
    throw UserError("step " + std::to_string(step) + ": the update left " + std::to_string(bad) +
                    " parameter or moment values NaN or infinite; training stopped "
                    "(abort_on_nan_loss / abort_on_inf_loss), nothing saved for this step");
  }
}

// The largest relative L2 difference --verify accepts between a sharded step and the unsharded
// reference started from the same weights (verify_tolerance, or by the numerics of the run), set
// against the differences measured on ten sharded meshes of the tiny models
// (benchmarks/verify_differences.sh, reports/training.md):
//  - fp32: at most 1.6e-5 with functional_precision=reference and 7.3e-5 with fast (fp32 GEMMs
//    against the reference's double, tiny-mla): 1e-3.
//  - bf16 matmul inputs: a sum that lands on the other side of a bf16 rounding boundary moves a
//    value by 2^-8 relative: at most 6.9e-3 (tiny-mla): 2e-2.
// Wrong math is far above both: a batch split wrongly (issue 35, item 1) was off by 5.9, a
// sequence split wrongly (item 2) by 0.07 to 0.15.
double verify_tolerance(const TrainSettings& settings) {
  if (const double set = settings.verify_tolerance; set > 0) {
    return set;
  }
  return settings.bf16_matmul_inputs ? 2e-2 : 1e-3;
}

std::string verify_failure_message(int64_t step, const StepMetrics& metrics, double tolerance,
                                   const TrainSettings& settings) {
  std::ostringstream text;
  text << std::scientific << std::setprecision(2) << "step " << step
       << ": --verify: the sharded step differs from the unsharded reference by "
       << *metrics.verify_max_rel_diff << " (relative L2; loss " << *metrics.verify_loss_rel_diff
       << ", gradients " << *metrics.verify_gradient_rel_diff << ", updated state "
       << *metrics.verify_weight_rel_diff << "), above the tolerance " << tolerance
       << " of functional_precision=" << settings.functional_precision
       << " functional_dtype=" << settings.functional_dtype
       << "; the sharded math is wrong for this configuration";
  return text.str();
}

// The checkpoint of `step` under the run's directory, with the data position and the metrics so
// far (every rank takes part in gathering it; rank 0, which holds it whole, writes it).
void save_step_checkpoint(ShardedModel& model, bool root, const std::string& run_directory,
                          int64_t step, const std::string& metrics_text) {
  Checkpoint checkpoint = model.to_checkpoint(step);
  if (root) {
    checkpoint.metadata["data_position"] = step;
    checkpoint.metadata["metrics"] = metrics_text;
    save_checkpoint(checkpoint_directory(run_directory, step), checkpoint);
  }
}

}  // namespace

namespace {

// The unsharded run --verify compares each step with, in the reference numerics (double
// accumulation).
std::unique_ptr<ShardedModel> verify_reference_model(const Config& config) {
  Config reference_config = unsharded_reference_config(config);
  reference_config.set("functional_precision", "reference", "--verify");
  return std::make_unique<ShardedModel>(reference_config);
}

// The run's host memory, before anything large is allocated: its line for the progress output
// (printed once the run's other checks passed, so a bad input stays one line), or UserError
// naming the bytes needed and available (sim/train/host_memory.h).
std::string preflight_host_memory(const Config& config, const TrainSettings& settings,
                                  const TrainOptions& options, const Transport& transport) {
  const HostMemoryOptions what = {.verify = options.verify,
                                  .checkpoint_staging = settings.enable_checkpointing ||
                                                        !settings.load_parameters_path.empty()};
  return require_host_memory(
      training_host_memory(config, what, transport),
      "train of " + settings.model_name + " on " + slice_from_config(config).name,
      transport.ranks_on_host());
}

// The mean loss over eval_steps held-out batches (sim/train/evaluation.h); with `viz`, batch 0's
// token log-probabilities join the token view (the same sequences at every evaluation).
double evaluate(const TrainSettings& settings, const Dataset& data, ShardedModel& model,
                int64_t step, TokenViz* viz) {
  return held_out_loss(data, model,
                       {.eval_steps = settings.eval_steps,
                        .length = settings.max_target_length,
                        .viz = viz,
                        .step = step});
}

// The token view the run draws at its evaluations (token_viz_file), its file checked first.
TokenViz token_viz_of(const TrainSettings& settings) {
  check_token_viz_file(settings.token_viz_file, settings.eval_interval, settings.metrics_file);
  TokenViz viz;
  viz.title = "tpusim train: " + settings.model_name + ", token probabilities";
  viz.tokenizer_path = settings.tokenizer_path;
  return viz;
}

}  // namespace

std::vector<StepMetrics> Trainer::run(const TrainOptions& options, std::ostream& progress) {
  // --verify does not change the run: the sharded model computes with the run's own numerics,
  // and the unsharded reference beside it with the reference numerics (double accumulation).
  // Under mpirun rank 0 alone reports, writes and verifies; the other ranks compute.
  const bool root = transport_->rank() == 0;
  const bool report = options.progress && root;
  const std::string memory = preflight_host_memory(config_, settings_, options, *transport_);
  ShardedModel model(config_, transport_);
  const std::unique_ptr<ShardedModel> reference =
      options.verify && root ? verify_reference_model(config_) : nullptr;
  const double tolerance = verify_tolerance(settings_);
  const StepProgram& program = model.program();
  const int64_t sequences = program.microbatch;
  const int64_t length = settings_.max_target_length;
  const int64_t steps = settings_.steps;
  const int64_t eval_interval = settings_.eval_interval;
  const double clip = settings_.gradient_clipping_threshold;
  const std::string metrics_path = root ? settings_.metrics_file : "";
  // Every rank computes the token view's log-probabilities (a collective); rank 0 writes it.
  const std::string& viz_path = settings_.token_viz_file;
  TokenViz viz = viz_path.empty() ? TokenViz{} : token_viz_of(settings_);
  DeviceContext::Optimizer optimizer = settings_.adamw;
  // Checkpoints: <base_output_directory>/<run_name>/checkpoints/<step>. A run resumes from its
  // latest checkpoint; load_parameters_path starts a new run from saved weights.
  const bool checkpointing = settings_.enable_checkpointing;
  const std::string run_directory = checked_run_directory(settings_);
  const int64_t period = settings_.checkpoint_period;
  std::string metrics_text;
  const int64_t first_step = restore_start(config_, settings_, *transport_, run_directory, model,
                                           reference.get(), metrics_text, report, progress);
  CrossProcessTraffic traffic_before = model.traffic();
  if (report) {
    progress << memory << "\ngemm: "
             << kernels::gemm_path_line(settings_.bf16_matmul_inputs, settings_.fast_kernels)
             << "\n";
  }
  if (report && !data_.note().empty()) {
    progress << data_.note() << "\n";
  }
  std::vector<StepMetrics> curve;
  for (int64_t step = first_step; step <= steps; ++step) {
    transport_->at_step(step);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Batch> batches;
    for (int64_t micro = 0; micro < program.accumulation_steps; ++micro) {
      batches.push_back(data_.train_batch(step - 1, micro, sequences));
    }
    const bool dump = !options.dump_directory.empty() && step == first_step;
    const Checkpoint initial = dump ? model.to_checkpoint(step - 1) : Checkpoint{};
    if (options.verify) {
      // Each step is checked from the same weights and moments: the reference starts it where the
      // sharded run is, so the comparison measures this step's math, not two drifting runs.
      const Checkpoint now = model.to_checkpoint(step - 1);
      if (reference != nullptr) {
        reference->restore(now, /*with_optimizer=*/true);
      }
    }
    const StepResult result = model.compute_gradients(batches);
    stop_on_non_finite(settings_, step, "the loss", result.loss);
    stop_on_non_finite(settings_, step, "the gradient norm", result.grad_norm);
    optimizer.step = step;
    optimizer.learning_rate = learning_rate(step);
    optimizer.gradient_scale = clip > 0 ? clip / std::max(result.grad_norm, clip) : 1.0;
    StepMetrics metrics;
    if (options.verify) {
      update_and_verify(model, reference.get(), batches, result, optimizer, clip, metrics);
    } else {
      model.apply_update(optimizer);
    }
    stop_on_non_finite_weights(settings_, step, model);
    if (transport_->distributed()) {
      metrics.traffic = step_traffic(*transport_, model, traffic_before);
    }
    if (dump) {
      const auto gradients = model.global_gradients();
      const Checkpoint updated = model.to_checkpoint(step);
      if (root) {
        write_dump(options.dump_directory, initial, gradients, updated, result, optimizer,
                   sequences, length, batches.front());
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
      metrics.eval_loss =
          evaluate(settings_, data_, model, step, viz_path.empty() ? nullptr : &viz);
      stop_on_non_finite(settings_, step, "the eval loss", *metrics.eval_loss);
    }
    metrics_text += metrics_line(metrics).dump() + "\n";
    if (!metrics_path.empty()) {
      write_file_atomically(metrics_path, metrics_text);
    }
    if (root && !viz_path.empty() && metrics.eval_loss) {
      write_token_viz(viz_path, viz, metrics_text);
    }
    if (report) {
      print_progress(progress, metrics);
    }
    curve.push_back(metrics);
    if (metrics.verify_max_rel_diff && !(*metrics.verify_max_rel_diff <= tolerance)) {
      throw VerifyFailure(verify_failure_message(step, metrics, tolerance, settings_));
    }
    if (checkpointing && ((period > 0 && step % period == 0) || step == steps)) {
      save_step_checkpoint(model, root, run_directory, step, metrics_text);
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
