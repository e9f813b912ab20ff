#include "model/config_rules.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "common/lowercase.h"
#include "common/suggest.h"
#include "model/config.h"
#include "model/decoder_family.h"

namespace tpusim {
namespace {

// Upper bounds that no real model reaches; values above them are typos or unit mistakes.
constexpr double kMaxDim = 1 << 20;  // base_emb_dim, mlp dims, heads x head_dim
constexpr double kMaxLayers = 10000;
constexpr double kMaxVocab = 1 << 24;
constexpr double kMaxSequence = 1 << 24;  // 16M tokens
constexpr double kMaxPerDeviceBatch = 1 << 20;
constexpr double kMaxExperts = 1 << 16;
constexpr size_t kMaxMlpActivations = 8;  // gated MLP branches (mlp_activations entries)

struct EnumRule {
  std::string key;
  std::vector<std::string> values;
};

struct RangeRule {
  std::string key;
  double min;
  double max;
  bool min_exclusive;
};

const std::vector<std::string> kRematValues = {"remat", "device", "offload"};

const std::vector<EnumRule>& enum_rules() {
  static const std::vector<EnumRule> rules = {
      {"remat_policy",
       {"full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp",
        "save_dot_except_mlp", "save_dot_except_mlpwi", "save_qkv_proj", "save_out_proj",
        "qkv_proj_offloaded", "minimal_offloaded", "minimal_with_quantization",
        "minimal_with_context_and_quantization", "minimal_flash", "custom", "none"}},
      {"attention",
       {"autoselected", "dot_product", "flash", "cudnn_flash_te", "cudnn_flash_jax", "paged"}},
      {"attention_type", {"global", "local_sliding", "mla", "chunk", "full", "compressed"}},
      {"dtype", {"bfloat16", "float32", "float16"}},
      {"weight_dtype", {"bfloat16", "float32", "float16"}},
      {"grad_dtype", {"bfloat16", "float32", "float16"}},
      {"mu_dtype", {"", "bfloat16", "float32"}},
      {"quantization", {"", "int8", "intmp", "fp8", "fp8_full", "nanoo_fp8"}},
      {"decoder_block", decoder_block_names()},  // model/decoder_family.cpp
      {"opt_type", {"adamw", "adam_pax", "sgd"}},
      {"dataset_type", {"synthetic", "text", "jsonl", "tfds", "hf", "grain"}},
      {"context_parallel_strategy", {"all_gather", "ring", "ulysses", "usp"}},
      {"sparse_core_collective_offload", {"auto", "on", "off"}},
      {"functional_dtype", {"float32", "bfloat16_matmul"}},
      {"functional_precision", {"fast", "reference"}},
      {"hardware", {"tpu", "cpu", "gpu", "gpu_multiprocess"}},
      {"decoder_layer_input", kRematValues},
      {"context", kRematValues},
      {"mlpwi", kRematValues},
      {"mlpwi_0", kRematValues},
      {"mlpwi_1", kRematValues},
      {"mlpwo", kRematValues},
      {"query_proj", kRematValues},
      {"key_proj", kRematValues},
      {"value_proj", kRematValues},
      {"qkv_proj", kRematValues},
      {"out_proj", kRematValues},
      {"kv_proj", kRematValues},
      {"moe_mlpwi", kRematValues},
      {"moe_mlpwi_0", kRematValues},
      {"moe_mlpwi_1", kRematValues},
      {"moe_mlpwo", kRematValues},
      {"mla_q", kRematValues},
      {"mla_kv", kRematValues},
      {"attention_out", kRematValues},
  };
  return rules;
}

const std::vector<RangeRule>& range_rules() {
  static const std::vector<RangeRule> rules = {
      {"global_parameter_scale", 1, 1 << 20, false},
      {"base_emb_dim", 1, kMaxDim, false},
      {"base_num_query_heads", 1, kMaxDim, false},
      {"base_num_kv_heads", 1, kMaxDim, false},
      {"head_dim", 1, kMaxDim, false},
      {"base_mlp_dim", 1, kMaxDim, false},
      {"base_moe_mlp_dim", -1, kMaxDim, false},  // -1: base_mlp_dim (MaxText's default)
      {"base_num_decoder_layers", 1, kMaxLayers, false},
      {"vocab_size", 1, kMaxVocab, false},
      {"max_target_length", 1, kMaxSequence, false},
      {"per_device_batch_size", 0, kMaxPerDeviceBatch, true},
      {"gradient_accumulation_steps", 1, 1 << 20, false},
      {"num_vocab_tiling", 1, 1 << 16, false},
      {"num_experts", 1, kMaxExperts, false},
      {"num_experts_per_tok", 1, kMaxExperts, false},
      {"shared_experts", 0, kMaxExperts, false},
      {"first_num_dense_layers", 0, kMaxLayers, false},
      {"sliding_window_size", 0, kMaxSequence, false},
      {"global_head_dim", 0, kMaxDim, false},
      {"global_num_kv_heads", 0, kMaxDim, false},
      {"hidden_size_per_layer_input", 0, kMaxDim, false},
      {"vocab_size_per_layer_input", 0, kMaxVocab, false},
      {"num_kv_shared_layers", 0, kMaxLayers, false},
      {"chunk_attn_window_size", 0, kMaxSequence, false},
      {"nope_layer_interval", -1, kMaxLayers, false},
      {"interleave_moe_layer_step", 1, kMaxLayers, false},
      {"gdn_num_key_heads", 1, kMaxDim, false},
      {"gdn_num_value_heads", 1, kMaxDim, false},
      {"gdn_key_head_dim", 1, kMaxDim, false},
      {"gdn_value_head_dim", 1, kMaxDim, false},
      {"gdn_conv_kernel_dim", 1, kMaxSequence, false},
      {"gdn_chunk_size", 1, kMaxSequence, false},
      {"q_lora_rank", 0, kMaxDim, false},
      {"kv_lora_rank", 0, kMaxDim, false},
      {"qk_nope_head_dim", 0, kMaxDim, false},
      {"qk_rope_head_dim", 0, kMaxDim, false},
      {"v_head_dim", 0, kMaxDim, false},
      {"dropout_rate", 0, 1, false},
      {"adam_b1", 0, 1, false},
      {"adam_b2", 0, 1, false},
      {"adam_eps", 0, 1, false},
      {"adam_weight_decay", 0, 1e3, false},
      {"learning_rate", 0, 1e3, false},
      {"warmup_steps_fraction", 0, 1, false},
      {"steps", -1, 1e12, false},
      // parse_slice's bound (hw/slice.cpp); 4294967298 was narrowed to 2 slices.
      {"compile_topology_num_slices", -1, 10000, false},
      {"num_slices", -1, 10000, false},
      {"quantization_local_shard_count", -1, 1e6, false},  // -1: the number of slices
      {"hbm_headroom_fraction", 0, 0.99, false},           // 1 would leave no HBM at all
      {"num_threads", 0, 4096, false},
      {"collective_timeout_seconds", 0, 1e6, true},
      {"verify_tolerance", 0, 1, false},
      {"sa_block_q", 1, kMaxSequence, false},
      {"sa_block_kv", 1, kMaxSequence, false},
      {"sa_block_kv_compute", 1, kMaxSequence, false},
      {"sa_block_q_dkv", 1, kMaxSequence, false},
      {"sa_block_kv_dkv", 1, kMaxSequence, false},
      {"sa_block_kv_dkv_compute", 1, kMaxSequence, false},
      {"sa_block_q_dq", 1, kMaxSequence, false},
      {"sa_block_kv_dq", 1, kMaxSequence, false},
      // Megablox / tokamax tile sizes (rows of tokens, embed, mlp).
      {"wi_tile_fwd_batch_seq", 1, kMaxSequence, false},
      {"wi_tile_fwd_embed_dim", 1, kMaxSequence, false},
      {"wi_tile_fwd_mlp_dim", 1, kMaxSequence, false},
      {"wi_tile_dlhs_batch_seq", 1, kMaxSequence, false},
      {"wi_tile_dlhs_embed_dim", 1, kMaxSequence, false},
      {"wi_tile_dlhs_mlp_dim", 1, kMaxSequence, false},
      {"wi_tile_drhs_batch_seq", 1, kMaxSequence, false},
      {"wi_tile_drhs_embed_dim", 1, kMaxSequence, false},
      {"wi_tile_drhs_mlp_dim", 1, kMaxSequence, false},
      {"wo_tile_fwd_batch_seq", 1, kMaxSequence, false},
      {"wo_tile_fwd_embed_dim", 1, kMaxSequence, false},
      {"wo_tile_fwd_mlp_dim", 1, kMaxSequence, false},
      {"wo_tile_dlhs_batch_seq", 1, kMaxSequence, false},
      {"wo_tile_dlhs_embed_dim", 1, kMaxSequence, false},
      {"wo_tile_dlhs_mlp_dim", 1, kMaxSequence, false},
      {"wo_tile_drhs_batch_seq", 1, kMaxSequence, false},
      {"wo_tile_drhs_embed_dim", 1, kMaxSequence, false},
      {"wo_tile_drhs_mlp_dim", 1, kMaxSequence, false},
  };
  return rules;
}

std::string join(const std::vector<std::string>& values) {
  std::ostringstream out;
  for (size_t index = 0; index < values.size(); ++index) {
    out << (index == 0 ? "" : ", ") << (values[index].empty() ? "\"\"" : values[index]);
  }
  return out.str();
}

// A whole number as its digits (1048577, not 1.04858e+06: the bound and the value must read
// differently when they differ), anything else with the precision that tells it apart.
std::string format_number(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 1e18) {
    return std::to_string(static_cast<int64_t>(value));
  }
  std::ostringstream out;
  out << std::setprecision(15) << value;
  return out.str();
}

// MaxText's GPU-only quantization values (Transformer Engine recipes and qwix's fp8_gpu). The
// published MaxText GPU recipes (gpu-recipes' A3 Ultra and A4 llama3.1 configs) all set
// quantization: fp8, so these are refused by name rather than priced by a guess.
const std::vector<std::string> kUnmodeledGpuQuantizations = {
    "fp8_gpu",  "te_fp8_delayedscaling", "te_fp8_currentscaling", "te_mxfp8",
    "te_nvfp4", "te_nvfp4_no_rht"};

// MaxText's 4-bit quantization values (base.yml lists int4 and fp4): no chip table here gives a
// 4-bit matmul rate or says how the narrower weights are read, so they are refused by name rather
// than priced as bf16 without a word (they were, before).
const std::vector<std::string> kUnmodeledFourBitQuantizations = {"int4", "fp4"};

void check_enum(const Config& config, const EnumRule& rule) {
  const std::string value = config.get_string(rule.key);
  if (rule.key == "quantization" &&
      std::find(kUnmodeledFourBitQuantizations.begin(), kUnmodeledFourBitQuantizations.end(),
                value) != kUnmodeledFourBitQuantizations.end()) {
    throw UserError("quantization: '" + value +
                        "' (4-bit) is not modeled: tpusim prices matmuls in bf16, int8 (int8, "
                        "intmp) or fp8 (fp8, fp8_full, nanoo_fp8)",
                    rule.key);
  }
  if (rule.key == "quantization" &&
      std::find(kUnmodeledGpuQuantizations.begin(), kUnmodeledGpuQuantizations.end(), value) !=
          kUnmodeledGpuQuantizations.end()) {
    throw UserError(
        "quantization: '" + value +
            "' is a MaxText GPU (Transformer Engine / qwix) recipe that tpusim does not "
            "model; the published MaxText GPU recipes (A3 Ultra, A4) use quantization=fp8",
        rule.key);
  }
  if (std::find(rule.values.begin(), rule.values.end(), value) == rule.values.end()) {
    throw UserError(rule.key + ": '" + value + "' is not one of " + join(rule.values) +
                        did_you_mean(value, rule.values),
                    rule.key);
  }
}

void check_range(const Config& config, const RangeRule& rule) {
  const double value = config.get_float(rule.key);
  const bool too_small = rule.min_exclusive ? value <= rule.min : value < rule.min;
  if (too_small || value > rule.max) {
    throw UserError(rule.key + ": " + format_number(value) + " is out of range (" +
                        (rule.min_exclusive ? "> " : ">= ") + format_number(rule.min) +
                        " and <= " + format_number(rule.max) + ")",
                    rule.key);
  }
}

// qwix's calibration methods as its calibrate() parses them (qwix/_src/core/qarray.py:
// "<method>[,<args>]", case-insensitive, the args floats): minmax and absmax take an optional
// scale factor, rms needs one, fixed takes a bound or a range that holds 0 and is not empty.
// MaxText passes the three *_quantization_calibration_method keys to qwix as they are, so a value
// qwix would refuse is refused here by its key.
void check_calibration_method(const Config& config, const std::string& key) {
  const std::string value = config.get_string(key);
  std::vector<std::string> parts;
  std::stringstream stream(lowercase(value));
  for (std::string part; std::getline(stream, part, ',');) {
    parts.push_back(part);
  }
  const std::string method = parts.empty() ? "" : parts.front();
  std::vector<double> args;
  for (size_t index = 1; index < parts.size(); ++index) {
    double number = 0;
    const char* end = parts[index].data() + parts[index].size();
    const auto [stop, error] = std::from_chars(parts[index].data(), end, number);
    if (error != std::errc() || stop != end || !std::isfinite(number)) {
      throw UserError(key + ": '" + value + "': '" + parts[index] + "' is not a number", key);
    }
    args.push_back(number);
  }
  static const std::vector<std::string> kMethods = {"absmax", "minmax", "rms", "fixed"};
  if (std::find(kMethods.begin(), kMethods.end(), method) == kMethods.end()) {
    throw UserError(key + ": '" + value + "' is not a qwix calibration method (" + join(kMethods) +
                        ", e.g. absmax or fixed,-224,224)" + did_you_mean(method, kMethods),
                    key);
  }
  if (method == "rms" && args.empty()) {
    throw UserError(key + ": '" + value + "': rms needs a scale factor (e.g. rms,3)", key);
  }
  if (method == "fixed") {
    if (args.size() == 1) {
      args = {-args.front(), args.front()};
    }
    if (args.size() != 2 || args[0] > 0 || args[1] < 0 || args[0] >= args[1]) {
      throw UserError(key + ": '" + value +
                          "': fixed needs a range that holds 0 and is not empty (e.g. "
                          "fixed,-224,224 or fixed,224)",
                      key);
    }
  }
}

bool is_power_of_two(int64_t value) {
  return value > 0 && (value & (value - 1)) == 0;
}

void check_cross_key_rules(const Config& config) {
  if (!is_power_of_two(config.get_int("global_parameter_scale"))) {
    throw UserError(
        "global_parameter_scale: " + std::to_string(config.get_int("global_parameter_scale")) +
            " must be a power of two (MaxText get_individual_scales)",
        "global_parameter_scale");
  }
  if (config.get_int("base_moe_mlp_dim") == 0) {
    throw UserError("base_moe_mlp_dim: 0 is out of range (-1 for base_mlp_dim, or >= 1)",
                    "base_moe_mlp_dim");
  }
  const int64_t query_heads = config.get_int("base_num_query_heads");
  for (const char* key : {"base_num_kv_heads", "global_num_kv_heads"}) {
    const int64_t kv_heads = config.get_int(key);
    if (kv_heads > 0 && query_heads % kv_heads != 0) {
      throw UserError(std::string(key) + ": " + std::to_string(kv_heads) +
                          " must divide base_num_query_heads (" + std::to_string(query_heads) + ")",
                      key);
    }
  }
  const int64_t experts = config.get_int("num_experts");
  const int64_t top_k = config.get_int("num_experts_per_tok");
  if (top_k > experts) {
    throw UserError("num_experts_per_tok: " + std::to_string(top_k) + " exceeds num_experts (" +
                        std::to_string(experts) + ")",
                    "num_experts_per_tok");
  }
  if (config.get_int("first_num_dense_layers") > config.get_int("base_num_decoder_layers")) {
    throw UserError("first_num_dense_layers: exceeds base_num_decoder_layers",
                    "first_num_dense_layers");
  }
  static const std::vector<std::string> kActivations = {"silu",    "linear", "relu",     "gelu",
                                                        "sigmoid", "swish",  "gelu_tanh"};
  const std::vector<std::string> activations = config.get_string_list("mlp_activations");
  if (activations.empty()) {
    throw UserError("mlp_activations: must name at least one activation, e.g. [silu, linear]",
                    "mlp_activations");
  }
  // One activation per gated branch of the MLP (MaxText's MlpBlock makes a wi_<i> matmul for
  // each): real models use one or two. Past kMaxMlpActivations the list is a mistake, and 10,000
  // entries took 4.6 s and 500 MB to build.
  if (activations.size() > kMaxMlpActivations) {
    throw UserError("mlp_activations: " + std::to_string(activations.size()) +
                        " activations, more than " + std::to_string(kMaxMlpActivations) +
                        " (one per gated MLP branch; models use one or two, e.g. [silu, linear])",
                    "mlp_activations");
  }
  for (const std::string& activation : activations) {
    if (std::find(kActivations.begin(), kActivations.end(), activation) == kActivations.end()) {
      throw UserError("mlp_activations: '" + activation + "' is not one of " + join(kActivations) +
                          did_you_mean(activation, kActivations),
                      "mlp_activations");
    }
  }
  if (decoder_family(parse_decoder_block(config.get_string("decoder_block")))
          .has_gated_delta_net()) {
    // The Gated DeltaNet layers (model/builder/gated_delta_net.cpp): value heads share key heads
    // in equal groups, and the chunked delta rule cuts the sequence into whole chunks.
    const int64_t key_heads = config.get_int("gdn_num_key_heads");
    const int64_t value_heads = config.get_int("gdn_num_value_heads");
    if (value_heads % key_heads != 0) {
      throw UserError("gdn_num_key_heads: " + std::to_string(key_heads) +
                          " must divide gdn_num_value_heads (" + std::to_string(value_heads) + ")",
                      "gdn_num_key_heads");
    }
    const int64_t chunk = config.get_int("gdn_chunk_size");
    const int64_t length = config.get_int("max_target_length");
    if (length % chunk != 0) {
      throw UserError("gdn_chunk_size: " + std::to_string(chunk) +
                          " must divide max_target_length (" + std::to_string(length) +
                          "): the Gated DeltaNet layers cut the sequence into whole chunks",
                      "gdn_chunk_size");
    }
  }
  for (const char* key :
       {"weight_quantization_calibration_method", "act_quantization_calibration_method",
        "bwd_quantization_calibration_method"}) {
    check_calibration_method(config, key);
  }
  const double sequence = static_cast<double>(config.get_int("max_target_length"));
  if (config.get_float("per_device_batch_size") * sequence < 1.0) {
    throw UserError(
        "per_device_batch_size: " + format_number(config.get_float("per_device_batch_size")) +
            " x max_target_length is less than one token per device",
        "per_device_batch_size");
  }
}

// Integer keys without a range rule that are read as 64-bit numbers (step counts, seeds); every
// other one is narrowed to an int where it is used (a mesh axis, a block size, a slice count).
const std::vector<std::string>& wide_int_keys() {
  static const std::vector<std::string> keys = {"learning_rate_schedule_steps",
                                                "eval_interval",
                                                "eval_steps",
                                                "checkpoint_period",
                                                "log_period",
                                                "init_weights_seed",
                                                "data_shuffle_seed"};
  return keys;
}

// The class check behind every narrowing of a parsed integer: an int key without its own range
// rule must fit 32 bits, so no later static_cast<int> can wrap it (4294967298 slices became 2).
void check_int_keys_fit(const Config& config) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  for (const std::string& key : config.keys()) {
    if (config.type(key) != ConfigType::kInt ||
        std::find(wide_int_keys().begin(), wide_int_keys().end(), key) != wide_int_keys().end() ||
        std::any_of(range_rules().begin(), range_rules().end(),
                    [&](const RangeRule& rule) { return rule.key == key; })) {
      continue;
    }
    const int64_t value = config.get_int(key);
    if (value < -kIntMax || value > kIntMax) {
      throw UserError(key + ": " + std::to_string(value) + " is out of range (a 32-bit integer, " +
                          std::to_string(-kIntMax) + " to " + std::to_string(kIntMax) + ")",
                      key);
    }
  }
}

}  // namespace

std::vector<std::string> allowed_values(const std::string& key) {
  for (const EnumRule& rule : enum_rules()) {
    if (rule.key == key) {
      return rule.values;
    }
  }
  return {};
}

namespace {

// Keys MaxText leaves None until a recipe sets them to a block size.
const std::vector<std::string>& optional_block_keys() {
  static const std::vector<std::string> keys = {
      "local_sa_block_q",     "local_sa_block_kv",     "local_sa_block_kv_compute",
      "local_sa_block_q_dkv", "local_sa_block_kv_dkv", "local_sa_block_kv_dkv_compute"};
  return keys;
}

}  // namespace

std::vector<std::string> config_rule_keys() {
  std::vector<std::string> keys;
  for (const EnumRule& rule : enum_rules()) {
    keys.push_back(rule.key);
  }
  for (const RangeRule& rule : range_rules()) {
    keys.push_back(rule.key);
  }
  keys.insert(keys.end(), optional_block_keys().begin(), optional_block_keys().end());
  keys.insert(keys.end(), wide_int_keys().begin(), wide_int_keys().end());
  return keys;
}

int64_t optional_positive_int(const Config& config, const std::string& key) {
  const std::string text = config.get_string(key);
  if (text.empty() || text == "None" || text == "null" || text == "~") {
    return 0;
  }
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 1 ||
      static_cast<double>(value) > kMaxSequence) {
    throw UserError(key + ": '" + text + "' is not None or a whole number from 1 to " +
                        std::to_string(static_cast<int64_t>(kMaxSequence)),
                    key);
  }
  return value;
}

namespace {

void check_optional_blocks(const Config& config) {
  for (const std::string& key : optional_block_keys()) {
    if (config.has(key)) {
      optional_positive_int(config, key);
    }
  }
}

}  // namespace

void validate_config(const Config& config) {
  check_optional_blocks(config);
  // Rules apply to the keys the base config defines; ConfigRules.EveryRuleKeyIsInBase keeps the
  // shipped base.yml and this table in step.
  for (const EnumRule& rule : enum_rules()) {
    if (config.has(rule.key)) {
      check_enum(config, rule);
    }
  }
  for (const RangeRule& rule : range_rules()) {
    if (config.has(rule.key)) {
      check_range(config, rule);
    }
  }
  check_int_keys_fit(config);
  if (config.has("base_emb_dim")) {
    check_cross_key_rules(config);
  }
}

}  // namespace tpusim
