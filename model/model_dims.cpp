#include "model/model_dims.h"

#include <charconv>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/config.h"
#include "model/maxtext_keys.h"

namespace tpusim {
namespace {

// An integer as a config writes it ("4", "10_000"); UserError naming `key` otherwise.
int64_t parse_key_int(std::string text, const std::string& key) {
  std::erase(text, '_');
  while (!text.empty() && (text.front() == ' ' || text.front() == '"' || text.front() == '\'')) {
    text.erase(text.begin());
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '"' || text.back() == '\'')) {
    text.pop_back();
  }
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw UserError(key + ": '" + text + "' is not an integer", key);
  }
  return value;
}

// A MaxText key tpusim's base.yml does not hold, as the config sets it (`passthrough`), else
// MaxText's default.
int64_t maxtext_key_int(const std::vector<Config::PassthroughKey>& passthrough,
                        const std::string& key) {
  std::string text;
  bool set = false;
  for (const Config::PassthroughKey& entry : passthrough) {
    if (entry.key == key) {
      text = entry.value;
      set = true;
    }
  }
  if (!set) {
    const MaxTextKey* row = find_maxtext_key(key);
    text = row == nullptr ? "0" : row->default_text;
  }
  return parse_key_int(text, key);
}

// deepseek4's keys: compress_ratios one ratio per layer, each 0 or at least 2 (a block of one
// token compresses nothing), and the widths its layers divide by.
void check_compressed_attention_keys(const ModelDims& dims) {
  const auto layers = static_cast<size_t>(dims.num_layers);
  if (dims.compress_ratios.size() != layers) {
    throw UserError("compress_ratios: " + std::to_string(dims.compress_ratios.size()) +
                        " ratios for " + std::to_string(layers) +
                        " decoder layers (decoder_block " + dims.family().name +
                        " needs one per layer)",
                    "compress_ratios");
  }
  for (const int64_t ratio : dims.compress_ratios) {
    if (ratio < 0 || ratio == 1) {
      throw UserError(
          "compress_ratios: " + std::to_string(ratio) + " must be 0 (no compression) or at least 2",
          "compress_ratios");
    }
  }
  const int64_t attention_width = dims.num_query_heads * dims.head_dim;
  if (dims.o_groups < 1 || attention_width % dims.o_groups != 0 || dims.o_lora_rank < 1) {
    throw UserError("o_groups: " + std::to_string(dims.o_groups) +
                        " must divide num_query_heads x head_dim (" +
                        std::to_string(attention_width) + "), with o_lora_rank >= 1 (" +
                        std::to_string(dims.o_lora_rank) + ")",
                    "o_groups");
  }
  for (const auto& [key, value] :
       {std::pair<const char*, int64_t>{"mhc_expansion_rate", dims.mhc_expansion_rate},
        {"indexer_n_heads", dims.indexer_n_heads},
        {"indexer_head_dim", dims.indexer_head_dim},
        {"indexer_topk", dims.indexer_topk},
        {"compressed_rope_max_timescale", dims.compressed_rope_max_timescale}}) {
    if (value < 1) {
      throw UserError(std::string(key) + ": " + std::to_string(value) + " must be >= 1", key);
    }
  }
  if (dims.sinkhorn_iterations < 0) {
    throw UserError(
        "sinkhorn_iterations: " + std::to_string(dims.sinkhorn_iterations) + " must be >= 0",
        "sinkhorn_iterations");
  }
}

}  // namespace

ParameterScales individual_scales(int64_t global_parameter_scale) {
  int log2_scale = 0;
  while ((int64_t{1} << (log2_scale + 1)) <= global_parameter_scale) {
    ++log2_scale;
  }
  if ((int64_t{1} << log2_scale) != global_parameter_scale) {
    throw UserError("global_parameter_scale: " + std::to_string(global_parameter_scale) +
                    " must be a power of two");
  }
  const int base = log2_scale / 3;
  const int remainder = log2_scale % 3;
  ParameterScales scales;
  scales.heads = base + (remainder > 0 ? 1 : 0);
  scales.mlp = scales.heads;
  scales.emb = base + (remainder > 1 ? 1 : 0);
  scales.layers = base;
  return scales;
}

ModelDims ModelDims::from_config(const Config& config) {
  const ParameterScales scales = individual_scales(config.get_int("global_parameter_scale"));
  ModelDims dims;
  dims.emb_dim = config.get_int("base_emb_dim") << scales.emb;
  dims.num_query_heads = config.get_int("base_num_query_heads") << scales.heads;
  dims.num_kv_heads = config.get_int("base_num_kv_heads") << scales.heads;
  dims.head_dim = config.get_int("head_dim");
  dims.mlp_dim = config.get_int("base_mlp_dim") << scales.mlp;
  // MaxText: base_moe_mlp_dim -1 (its default) means the experts are as wide as the dense MLP.
  const int64_t moe_mlp_dim = config.get_int("base_moe_mlp_dim");
  dims.moe_mlp_dim = (moe_mlp_dim == -1 ? config.get_int("base_mlp_dim") : moe_mlp_dim)
                     << scales.mlp;
  dims.num_layers = config.get_int("base_num_decoder_layers") << scales.layers;
  dims.vocab_size = config.get_int("vocab_size");
  dims.mlp_activations = config.get_string_list("mlp_activations");
  dims.decoder_block = parse_decoder_block(config.get_string("decoder_block"));
  dims.global_head_dim = config.get_int("global_head_dim");
  dims.global_num_kv_heads = config.get_int("global_num_kv_heads") << scales.heads;
  dims.share_kv_projections = config.get_bool("share_kv_projections");
  dims.chunk_attn_window_size = config.get_int("chunk_attn_window_size");
  dims.nope_layer_interval = config.get_int("nope_layer_interval");
  dims.interleave_moe_layer_step = config.get_int("interleave_moe_layer_step");
  dims.num_experts = config.get_int("num_experts");
  dims.num_experts_per_tok = config.get_int("num_experts_per_tok");
  dims.shared_experts = config.get_int("shared_experts");
  dims.first_num_dense_layers = config.get_int("first_num_dense_layers");
  dims.logits_via_embedding = config.get_bool("logits_via_embedding");
  dims.attention_type = config.get_string("attention_type");
  dims.sliding_window_size = config.get_int("sliding_window_size");
  dims.inhomogeneous_layer_cycle_interval = config.get_int("inhomogeneous_layer_cycle_interval");
  dims.q_lora_rank = config.get_int("q_lora_rank");
  dims.kv_lora_rank = config.get_int("kv_lora_rank");
  dims.qk_nope_head_dim = config.get_int("qk_nope_head_dim");
  dims.qk_rope_head_dim = config.get_int("qk_rope_head_dim");
  dims.v_head_dim = config.get_int("v_head_dim");
  dims.hidden_size_per_layer_input = config.get_int("hidden_size_per_layer_input");
  dims.vocab_size_per_layer_input = config.get_int("vocab_size_per_layer_input");
  dims.num_kv_shared_layers = config.get_int("num_kv_shared_layers");
  dims.use_double_wide_mlp = config.get_bool("use_double_wide_mlp");
  dims.gdn_num_key_heads = config.get_int("gdn_num_key_heads");
  dims.gdn_num_value_heads = config.get_int("gdn_num_value_heads");
  dims.gdn_key_head_dim = config.get_int("gdn_key_head_dim");
  dims.gdn_value_head_dim = config.get_int("gdn_value_head_dim");
  dims.gdn_conv_kernel_dim = config.get_int("gdn_conv_kernel_dim");
  dims.gdn_chunk_size = config.get_int("gdn_chunk_size");
  dims.attention_output_dim = config.get_int("attention_output_dim");
  dims.moe_expert_input_dim = config.get_int("moe_expert_input_dim");
  if (dims.family().latent_moe &&
      (dims.attention_output_dim <= 0 || dims.attention_output_dim != dims.moe_expert_input_dim)) {
    // MaxText's Qwen3CustomMoeDecoderLayer refuses the same.
    throw UserError("attention_output_dim: " + std::to_string(dims.attention_output_dim) +
                        " must be positive and equal moe_expert_input_dim (" +
                        std::to_string(dims.moe_expert_input_dim) + ") for decoder_block " +
                        dims.family().name,
                    "attention_output_dim");
  }
  dims.o_groups = config.get_int("o_groups");
  dims.o_lora_rank = config.get_int("o_lora_rank");
  dims.first_num_hash_layers = config.get_int("first_num_hash_layers");
  for (const std::string& ratio : config.get_string_list("compress_ratios")) {
    dims.compress_ratios.push_back(parse_key_int(ratio, "compress_ratios"));
  }
  if (dims.family().has_compressed_attention()) {
    const std::vector<Config::PassthroughKey> passthrough = config.passthrough_keys();
    dims.mhc_expansion_rate = maxtext_key_int(passthrough, "mhc_expansion_rate");
    dims.sinkhorn_iterations = maxtext_key_int(passthrough, "sinkhorn_iterations");
    dims.indexer_n_heads = maxtext_key_int(passthrough, "indexer_n_heads");
    dims.indexer_head_dim = maxtext_key_int(passthrough, "indexer_head_dim");
    dims.indexer_topk = maxtext_key_int(passthrough, "indexer_topk");
    dims.compressed_rope_max_timescale =
        maxtext_key_int(passthrough, "compressed_rope_max_timescale");
    check_compressed_attention_keys(dims);
  }
  return dims;
}

}  // namespace tpusim
