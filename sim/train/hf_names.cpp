#include "sim/train/hf_names.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/builder/build_options.h"
#include "model/builder/initializers.h"
#include "model/config.h"
#include "model/decoder_family.h"
#include "model/model_dims.h"

namespace tpusim {
namespace {

// A layer's parameter: "<region>/<tensor>#<layer>" (a MoE model's layers are the "moe_layer"
// region).
std::string layer_name(const std::string& tensor, int64_t layer,
                       const std::string& region = "layer") {
  return region + "/" + tensor + "#" + std::to_string(layer);
}

int64_t product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t total = 1;
  for (size_t index = begin; index < end; ++index) {
    total *= shape[index];
  }
  return total;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return nlohmann::json(shape).dump();
}

// The matrix views of one mapping: tpusim [rows, cols]; the HF tensor [hf_rows, hf_cols].
struct Views {
  int64_t rows, cols, hf_cols;
};

Views views(const HfTensor& entry) {
  const auto split = static_cast<size_t>(entry.split);
  return {product(entry.shape, entry.block >= 0 ? 1 : 0, split),
          product(entry.shape, split, entry.shape.size()),
          entry.hf_shape.size() <= 1 ? 1 : product(entry.hf_shape, 1, entry.hf_shape.size())};
}

// Where the entry's matrix starts in the tpusim tensor's values (its block's first element).
int64_t source_offset(const HfTensor& entry, const Views& view) {
  return entry.block >= 0 ? entry.block * view.rows * view.cols : 0;
}

// Flat HF index of tpusim matrix element (row, col).
int64_t hf_index(const HfTensor& entry, const Views& view, int64_t row, int64_t col) {
  return entry.transposed ? (col + entry.column_offset) * view.hf_cols + row
                          : row * view.hf_cols + col + entry.column_offset;
}

// What the Transformers names and config read from the config beyond the model's dims.
struct HfKeys {
  std::string model_name;               // for messages
  int64_t trainable_position_size = 0;  // GPT-2's learned positions
  double normalization_layer_epsilon = 0;
  int64_t max_target_length = 0;
  double rope_max_timescale = 0;
  bool attention_bias = false;
  bool normalize_embedding_logits = false;
  double capacity_factor = 0;
  double routed_scaling_factor = 1;
  // The router's top-k weights renormalized, as MaxText's block computes them (true for mixtral
  // and qwen3_moe whatever norm_topk_prob says: BuildOptions::normalize_router_top_k).
  bool norm_topk_prob = false;
};

HfKeys hf_keys_from_config(const Config& config) {
  HfKeys keys;
  keys.model_name = config.get_string("model_name");
  keys.trainable_position_size = config.get_int("trainable_position_size");
  keys.normalization_layer_epsilon = config.get_float("normalization_layer_epsilon");
  keys.max_target_length = config.get_int("max_target_length");
  keys.rope_max_timescale = config.get_float("rope_max_timescale");
  keys.attention_bias = config.get_bool("attention_bias");
  keys.normalize_embedding_logits = config.get_bool("normalize_embedding_logits");
  keys.capacity_factor = config.get_float("capacity_factor");
  keys.routed_scaling_factor = config.get_float("routed_scaling_factor");
  keys.norm_topk_prob = BuildOptions::from_config(config).normalize_router_top_k;
  return keys;
}

// The Transformers MoE family of a decoder block (its attention is Mistral's or Qwen3's).
enum class HfMoe { kNone, kMixtral, kQwen3Moe };

HfMoe hf_moe_of(const DecoderFamily& family) {
  if (family.block == DecoderBlock::kMixtral) {
    return HfMoe::kMixtral;
  }
  return family.block == DecoderBlock::kQwen3Moe ? HfMoe::kQwen3Moe : HfMoe::kNone;
}

// The MoE decoder blocks with Transformers names ("mixtral, qwen3_moe").
std::string hf_moe_families() {
  return std::string(decoder_block_name(DecoderBlock::kMixtral)) + ", " +
         decoder_block_name(DecoderBlock::kQwen3Moe);
}

// UserError naming the key when Transformers' MoE block would route otherwise than tpusim.
void check_hf_moe(const ModelDims& dims, const HfKeys& keys) {
  const auto refuse = [](const std::string& key, const std::string& why) {
    throw UserError("Hugging Face conversion: " + why, key);
  };
  if (!dims.is_moe()) {
    refuse("num_experts", "decoder_block '" + std::string(dims.family().name) +
                              "' maps to a Transformers MoE, which needs num_experts > 1");
  }
  if (dims.first_num_dense_layers > 0 || dims.interleave_moe_layer_step != 1) {
    refuse(dims.first_num_dense_layers > 0 ? "first_num_dense_layers" : "interleave_moe_layer_step",
           "Transformers' Mixtral and Qwen3-MoE names need every layer MoE");
  }
  if (dims.shared_experts > 0) {
    refuse("shared_experts", "Transformers' Mixtral and Qwen3-MoE have no shared expert");
  }
  if (dims.expert_input_dim() != dims.emb_dim) {
    refuse("moe_expert_input_dim", "the experts must read and write emb_dim");
  }
  if (keys.capacity_factor > 0) {
    refuse("capacity_factor",
           "Transformers' MoE is dropless; capacity_factor > 0 drops tokens (set it <= 0)");
  }
  // Transformers' Mixtral always renormalizes the top-k weights (MixtralSparseMoeBlock), as
  // MaxText's mixtral block does whatever norm_topk_prob says; Qwen3-MoE's config.json carries
  // the normalization tpusim computed (keys.norm_topk_prob).
  if (keys.routed_scaling_factor != 1.0) {
    refuse("routed_scaling_factor",
           "Transformers' Mixtral and Qwen3-MoE do not scale the routed "
           "weights (routed_scaling_factor must be 1)");
  }
}

}  // namespace

namespace {

// The Transformers names of `config`'s family (DecoderFamily::hf_names), after the checks that
// the config's model is one they describe; UserError naming the key otherwise.
HfNameScheme hf_scheme(const Config& config) {
  const ModelDims dims = ModelDims::from_config(config);
  const DecoderFamily& family = dims.family();
  const HfKeys keys = hf_keys_from_config(config);
  const auto refuse = [](const std::string& key, const std::string& why) {
    throw UserError("Hugging Face conversion: " + why, key);
  };
  // A MoE family's attention is named as its dense sibling's.
  const HfMoe moe = hf_moe_of(family);
  HfNameScheme scheme = family.hf_names;
  if (moe != HfMoe::kNone) {
    scheme = moe == HfMoe::kMixtral ? HfNameScheme::kMistral : HfNameScheme::kQwen3;
    check_hf_moe(dims, keys);
  }
  if (scheme == HfNameScheme::kNone) {
    refuse("decoder_block", "decoder_block '" + std::string(family.name) +
                                "' has no Transformers mapping in tpusim (" + hf_mapped_families() +
                                ", " + hf_moe_families() + ")");
  }
  if (dims.is_moe() && moe == HfMoe::kNone) {
    refuse("num_experts", "decoder_block '" + std::string(family.name) +
                              "' with experts has no Transformers mapping in tpusim (MoE: " +
                              hf_moe_families() + ")");
  }
  if (keys.attention_bias) {
    refuse("attention_bias", "the attention biases have no Transformers mapping in tpusim yet");
  }
  // Transformers' Qwen3 always has q_norm/k_norm; Llama, Mistral and GPT-2 never do.
  const bool qwen3 = scheme == HfNameScheme::kQwen3;
  if (qwen3 && !qk_norm_from_config(config, family)) {
    refuse("use_qk_norm", "Qwen3's names need use_qk_norm true (its q_norm and k_norm)");
  }
  if (!qwen3 && qk_norm_from_config(config, family)) {
    refuse("use_qk_norm", "only Qwen3's names have the query/key norms (decoder_block " +
                              std::string(decoder_block_name(DecoderBlock::kQwen3)) + ")");
  }
  const std::vector<std::string> gated = {"silu", "linear"};
  if (scheme == HfNameScheme::kGpt2) {
    if (dims.mlp_activations != std::vector<std::string>{"gelu"}) {
      refuse("mlp_activations", "GPT-2 names need mlp_activations [\"gelu\"]");
    }
    if (!dims.logits_via_embedding || keys.normalize_embedding_logits) {
      refuse("logits_via_embedding",
             "GPT-2 ties its logits to the token embedding, undivided (logits_via_embedding "
             "true, normalize_embedding_logits false)");
    }
    if (dims.num_kv_heads != dims.num_query_heads ||
        dims.num_query_heads * dims.head_dim != dims.emb_dim) {
      refuse("head_dim", "GPT-2's c_attn needs heads x head_dim = emb_dim and kv heads = heads");
    }
    if (keys.trainable_position_size <= 0) {
      refuse("trainable_position_size", "GPT-2 needs learned positions");
    }
    return scheme;
  }
  if (dims.mlp_activations != gated) {
    refuse("mlp_activations", "Llama/Mistral names need mlp_activations [\"silu\", \"linear\"]");
  }
  if (dims.logits_via_embedding && keys.normalize_embedding_logits) {
    refuse("normalize_embedding_logits",
           "Transformers' tied logits are not divided by sqrt(emb_dim)");
  }
  return scheme;
}

HfMoe hf_moe(const Config& config) {
  return hf_moe_of(ModelDims::from_config(config).family());
}

// Transformers' model_type of the MoE families is the decoder block's own name.
const char* hf_moe_model_type(HfMoe moe) {
  return decoder_block_name(moe == HfMoe::kMixtral ? DecoderBlock::kMixtral
                                                   : DecoderBlock::kQwen3Moe);
}

// The MoE layer's entries: the router and every expert's three kernels.
template <typename Add>
void add_moe_layer(const ModelDims& dims, HfMoe moe, int64_t layer, const std::string& hf,
                   const Add& add) {
  const int64_t embed = dims.emb_dim;
  const int64_t experts = dims.num_experts;
  const int64_t mlp = dims.moe_mlp_dim;
  const bool mixtral = moe == HfMoe::kMixtral;
  const std::string block = hf + (mixtral ? "block_sparse_moe." : "mlp.");
  add(layer_name("moe/gate", layer, "moe_layer"), {embed, experts}, 1, block + "gate.weight",
      {experts, embed}, true, 0, 1.0, -1);
  for (int64_t expert = 0; expert < experts; ++expert) {
    const std::string prefix = block + "experts." + std::to_string(expert) + ".";
    add(layer_name("moe/experts/wi_0", layer, "moe_layer"), {experts, embed, mlp}, 2,
        prefix + (mixtral ? "w1" : "gate_proj") + ".weight", {mlp, embed}, true, 0, 1.0, expert);
    add(layer_name("moe/experts/wi_1", layer, "moe_layer"), {experts, embed, mlp}, 2,
        prefix + (mixtral ? "w3" : "up_proj") + ".weight", {mlp, embed}, true, 0, 1.0, expert);
    add(layer_name("moe/experts/wo", layer, "moe_layer"), {experts, mlp, embed}, 2,
        prefix + (mixtral ? "w2" : "down_proj") + ".weight", {embed, mlp}, true, 0, 1.0, expert);
  }
}

// MixtralConfig's / Qwen3MoeConfig's fields over the Llama-like ones of `json`.
void add_moe_config(nlohmann::json& json, const ModelDims& dims, const HfKeys& keys, HfMoe moe) {
  json["num_experts_per_tok"] = dims.num_experts_per_tok;
  json["output_router_logits"] = false;
  json["router_aux_loss_coef"] = 0.0;  // tpusim trains without the load-balance loss
  json["attention_dropout"] = 0.0;
  json["sliding_window"] = nullptr;
  json.erase("mlp_bias");
  if (moe == HfMoe::kMixtral) {
    json["architectures"] = {"MixtralForCausalLM"};
    json["model_type"] = hf_moe_model_type(moe);
    json["intermediate_size"] = dims.moe_mlp_dim;  // each expert's
    json["num_local_experts"] = dims.num_experts;
    json["router_jitter_noise"] = 0.0;
    json.erase("attention_bias");
    return;
  }
  json["architectures"] = {"Qwen3MoeForCausalLM"};
  json["model_type"] = hf_moe_model_type(moe);
  json["moe_intermediate_size"] = dims.moe_mlp_dim;
  json["num_experts"] = dims.num_experts;
  json["norm_topk_prob"] = keys.norm_topk_prob;
  json["decoder_sparse_step"] = 1;
  json["mlp_only_layers"] = nlohmann::json::array();
  json["use_sliding_window"] = false;
  json["rope_scaling"] = nullptr;
}

}  // namespace

std::string hf_family(const Config& config) {
  const HfNameScheme scheme = hf_scheme(config);
  const HfMoe moe = hf_moe(config);
  return moe == HfMoe::kNone ? hf_model_type(scheme) : hf_moe_model_type(moe);
}

std::vector<HfTensor> hf_tensor_map(const Config& config) {
  const HfNameScheme scheme = hf_scheme(config);
  const ModelDims dims = ModelDims::from_config(config);
  const int64_t embed = dims.emb_dim;
  const int64_t heads = dims.num_query_heads;
  const int64_t kv_heads = dims.num_kv_heads;
  const int64_t head_dim = dims.head_dim;
  // Transformers scales q.k by 1/sqrt(head_dim); tpusim by its runtime scale (MaxText's).
  const double query_scale =
      (1.0 / std::sqrt(static_cast<double>(head_dim))) /
      query_scaling_from_config(config, dims.family(), head_dim).runtime_scale;
  std::vector<HfTensor> map;
  const auto add = [&](std::string name, std::vector<int64_t> shape, int64_t split,
                       std::string hf_name, std::vector<int64_t> hf_shape, bool transposed,
                       int64_t column_offset = 0, double scale = 1, int64_t block = -1) {
    map.push_back({std::move(name), std::move(shape), split, std::move(hf_name),
                   std::move(hf_shape), transposed, column_offset, scale, block});
  };
  const HfMoe moe = hf_moe(config);
  if (scheme == HfNameScheme::kGpt2) {
    const int64_t positions = hf_keys_from_config(config).trainable_position_size;
    add("embed/token_embedding#0", {dims.vocab_size, embed}, 1, "transformer.wte.weight",
        {dims.vocab_size, embed}, false);
    add("embed/position_embedding#0", {positions, embed}, 1, "transformer.wpe.weight",
        {positions, embed}, false);
    for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
      const std::string hf = "transformer.h." + std::to_string(layer) + ".";
      for (const auto& [norm, ln] :
           {std::pair{"pre_attention_norm", "ln_1"}, std::pair{"pre_mlp_norm", "ln_2"}}) {
        add(layer_name(std::string(norm) + "/scale", layer), {embed}, 1, hf + ln + ".weight",
            {embed}, false);
        add(layer_name(std::string(norm) + "/bias", layer), {embed}, 1, hf + ln + ".bias", {embed},
            false);
      }
      int64_t offset = 0;
      for (const char* projection : {"query", "key", "value"}) {
        add(layer_name(std::string("attention/") + projection, layer), {embed, heads, head_dim}, 1,
            hf + "attn.c_attn.weight", {embed, 3 * embed}, false, offset,
            projection == std::string("query") ? query_scale : 1.0);
        offset += heads * head_dim;
      }
      add(layer_name("attention/out", layer), {heads, head_dim, embed}, 2,
          hf + "attn.c_proj.weight", {heads * head_dim, embed}, false);
      add(layer_name("mlp/wi", layer), {embed, dims.mlp_dim}, 1, hf + "mlp.c_fc.weight",
          {embed, dims.mlp_dim}, false);
      add(layer_name("mlp/wo", layer), {dims.mlp_dim, embed}, 1, hf + "mlp.c_proj.weight",
          {dims.mlp_dim, embed}, false);
    }
    add("head/final_norm/scale#0", {embed}, 1, "transformer.ln_f.weight", {embed}, false);
    add("head/final_norm/bias#0", {embed}, 1, "transformer.ln_f.bias", {embed}, false);
    return map;
  }
  add("embed/token_embedding#0", {dims.vocab_size, embed}, 1, "model.embed_tokens.weight",
      {dims.vocab_size, embed}, false);
  const std::string region = moe != HfMoe::kNone ? "moe_layer" : "layer";
  for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
    const std::string hf = "model.layers." + std::to_string(layer) + ".";
    add(layer_name("pre_attention_norm/scale", layer, region), {embed}, 1,
        hf + "input_layernorm.weight", {embed}, false);
    add(layer_name("pre_mlp_norm/scale", layer, region), {embed}, 1,
        hf + "post_attention_layernorm.weight", {embed}, false);
    add(layer_name("attention/query", layer, region), {embed, heads, head_dim}, 1,
        hf + "self_attn.q_proj.weight", {heads * head_dim, embed}, true, 0, query_scale);
    add(layer_name("attention/key", layer, region), {embed, kv_heads, head_dim}, 1,
        hf + "self_attn.k_proj.weight", {kv_heads * head_dim, embed}, true);
    add(layer_name("attention/value", layer, region), {embed, kv_heads, head_dim}, 1,
        hf + "self_attn.v_proj.weight", {kv_heads * head_dim, embed}, true);
    add(layer_name("attention/out", layer, region), {heads, head_dim, embed}, 2,
        hf + "self_attn.o_proj.weight", {embed, heads * head_dim}, true);
    if (scheme == HfNameScheme::kQwen3) {
      // Qwen3Attention's RMSNorms over head_dim, shared by the heads: MaxText's query_norm and
      // key_norm scales, the same [head_dim] vectors.
      add(layer_name("attention/query_norm/scale", layer, region), {head_dim}, 1,
          hf + "self_attn.q_norm.weight", {head_dim}, false);
      add(layer_name("attention/key_norm/scale", layer, region), {head_dim}, 1,
          hf + "self_attn.k_norm.weight", {head_dim}, false);
    }
    if (moe != HfMoe::kNone) {
      add_moe_layer(dims, moe, layer, hf, add);
      continue;
    }
    add(layer_name("mlp/wi_0", layer, region), {embed, dims.mlp_dim}, 1,
        hf + "mlp.gate_proj.weight", {dims.mlp_dim, embed}, true);
    add(layer_name("mlp/wi_1", layer, region), {embed, dims.mlp_dim}, 1, hf + "mlp.up_proj.weight",
        {dims.mlp_dim, embed}, true);
    add(layer_name("mlp/wo", layer, region), {dims.mlp_dim, embed}, 1, hf + "mlp.down_proj.weight",
        {embed, dims.mlp_dim}, true);
  }
  add("head/final_norm/scale#0", {embed}, 1, "model.norm.weight", {embed}, false);
  if (!dims.logits_via_embedding) {
    add("head/unembedding#0", {embed, dims.vocab_size}, 1, "lm_head.weight",
        {dims.vocab_size, embed}, true);
  }
  return map;
}

std::map<std::string, std::vector<int64_t>> hf_zero_tensors(const Config& config) {
  std::map<std::string, std::vector<int64_t>> zeros;
  if (hf_scheme(config) != HfNameScheme::kGpt2) {
    return zeros;
  }
  const ModelDims dims = ModelDims::from_config(config);
  for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
    const std::string hf = "transformer.h." + std::to_string(layer) + ".";
    zeros[hf + "attn.c_attn.bias"] = {3 * dims.emb_dim};
    zeros[hf + "attn.c_proj.bias"] = {dims.emb_dim};
    zeros[hf + "mlp.c_fc.bias"] = {dims.mlp_dim};
    zeros[hf + "mlp.c_proj.bias"] = {dims.emb_dim};
  }
  return zeros;
}

std::map<std::string, CheckpointTensor> to_hf(
    const Config& config, const std::map<std::string, CheckpointTensor>& weights) {
  std::map<std::string, CheckpointTensor> hf;
  for (const auto& [name, shape] : hf_zero_tensors(config)) {
    hf[name] = {shape, std::vector<float>(static_cast<size_t>(product(shape, 0, shape.size())))};
  }
  for (const HfTensor& entry : hf_tensor_map(config)) {
    const auto found = weights.find(entry.name);
    if (found == weights.end() || found->second.shape != entry.shape) {
      throw std::logic_error("export: the checkpoint has no parameter '" + entry.name +
                             "' of shape " + shape_text(entry.shape));
    }
    CheckpointTensor& target = hf[entry.hf_name];
    if (target.values.empty()) {
      target.shape = entry.hf_shape;
      target.values.assign(static_cast<size_t>(product(entry.hf_shape, 0, entry.hf_shape.size())),
                           0.0f);
    }
    const Views view = views(entry);
    const float* values = found->second.values.data() + source_offset(entry, view);
    for (int64_t row = 0; row < view.rows; ++row) {
      for (int64_t col = 0; col < view.cols; ++col) {
        target.values[static_cast<size_t>(hf_index(entry, view, row, col))] =
            static_cast<float>(static_cast<double>(values[row * view.cols + col]) / entry.scale);
      }
    }
  }
  return hf;
}

std::map<std::string, CheckpointTensor> from_hf(const Config& config,
                                                const std::map<std::string, CheckpointTensor>& hf) {
  const std::string model_name = hf_keys_from_config(config).model_name;
  const auto tensor = [&](const std::string& name,
                          const std::vector<int64_t>& shape) -> const CheckpointTensor& {
    const auto found = hf.find(name);
    if (found == hf.end()) {
      throw UserError("Hugging Face weights: no tensor '" + name + "' (shape " + shape_text(shape) +
                      ") for model_name " + model_name);
    }
    if (found->second.shape != shape) {
      throw UserError("Hugging Face weights: tensor '" + name + "' has shape " +
                      shape_text(found->second.shape) + ", the model needs " + shape_text(shape) +
                      " (model_name " + model_name + ")");
    }
    return found->second;
  };
  std::map<std::string, CheckpointTensor> weights;
  for (const HfTensor& entry : hf_tensor_map(config)) {
    const CheckpointTensor& source = tensor(entry.hf_name, entry.hf_shape);
    const Views view = views(entry);
    CheckpointTensor& target = weights[entry.name];
    target.shape = entry.shape;
    target.values.resize(static_cast<size_t>(product(entry.shape, 0, entry.shape.size())));
    const int64_t offset = source_offset(entry, view);
    for (int64_t row = 0; row < view.rows; ++row) {
      for (int64_t col = 0; col < view.cols; ++col) {
        target.values[static_cast<size_t>(offset + row * view.cols + col)] = static_cast<float>(
            static_cast<double>(
                source.values[static_cast<size_t>(hf_index(entry, view, row, col))]) *
            entry.scale);
      }
    }
  }
  for (const auto& [name, shape] : hf_zero_tensors(config)) {
    for (const float value : tensor(name, shape).values) {
      if (value != 0.0f) {
        throw UserError("Hugging Face weights: tensor '" + name + "' is not zero, but tpusim's " +
                        decoder_block_name(DecoderBlock::kGpt3) +
                        " block has no biases in its attention and MLP");
      }
    }
  }
  return weights;
}

nlohmann::json hf_config_json(const Config& config) {
  const HfNameScheme scheme = hf_scheme(config);
  const ModelDims dims = ModelDims::from_config(config);
  const HfKeys keys = hf_keys_from_config(config);
  if (scheme == HfNameScheme::kGpt2) {
    return {{"architectures", {hf_architecture(scheme)}},
            {"model_type", hf_model_type(scheme)},
            {"vocab_size", dims.vocab_size},
            {"n_embd", dims.emb_dim},
            {"n_head", dims.num_query_heads},
            {"n_layer", dims.num_layers},
            {"n_inner", dims.mlp_dim},
            {"n_positions", keys.trainable_position_size},
            {"layer_norm_epsilon", keys.normalization_layer_epsilon},
            {"activation_function", "gelu_new"},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"}};
  }
  nlohmann::json json = {{"architectures", {hf_architecture(scheme)}},
                         {"model_type", hf_model_type(scheme)},
                         {"vocab_size", dims.vocab_size},
                         {"hidden_size", dims.emb_dim},
                         {"intermediate_size", dims.mlp_dim},
                         {"num_hidden_layers", dims.num_layers},
                         {"num_attention_heads", dims.num_query_heads},
                         {"num_key_value_heads", dims.num_kv_heads},
                         {"head_dim", dims.head_dim},
                         {"hidden_act", "silu"},
                         {"max_position_embeddings", keys.max_target_length},
                         {"rms_norm_eps", keys.normalization_layer_epsilon},
                         {"rope_theta", keys.rope_max_timescale},
                         {"tie_word_embeddings", dims.logits_via_embedding},
                         {"attention_bias", false},
                         {"torch_dtype", "float32"}};
  if (const HfMoe moe = hf_moe(config); moe != HfMoe::kNone) {
    add_moe_config(json, dims, keys, moe);
  } else if (scheme == HfNameScheme::kMistral) {
    json["sliding_window"] = nullptr;  // MaxText trains Mistral with full causal attention
  } else if (scheme == HfNameScheme::kQwen3) {
    // Qwen3Config: full causal attention in every layer (MaxText's qwen3 block has no window).
    json["attention_dropout"] = 0.0;
    json["use_sliding_window"] = false;
    json["sliding_window"] = nullptr;
    json["max_window_layers"] = dims.num_layers;
    json["rope_scaling"] = nullptr;
  } else {
    json["mlp_bias"] = false;
  }
  return json;
}

void check_hf_config(const Config& config, const nlohmann::json& hf_config,
                     const std::string& path) {
  if (!hf_config.is_object()) {
    throw UserError("load_parameters_path: '" + path + "' is not a JSON object",
                    "load_parameters_path");
  }
  // Fields that do not change the math of a sequence tpusim trains (names, dtypes, the longest
  // position, windows longer than any sequence here) are not compared.
  static const std::set<std::string> kNotMath = {
      "architectures",        "torch_dtype",          "max_position_embeddings",
      "n_positions",          "attention_dropout",    "use_sliding_window",
      "sliding_window",       "max_window_layers",    "scale_attn_weights",
      "router_aux_loss_coef", "output_router_logits", "router_jitter_noise"};
  const nlohmann::json expected = hf_config_json(config);
  // The family first (its message is the clearest), then every other field.
  std::vector<std::string> fields = {"model_type"};
  for (const auto& [field, want] : expected.items()) {
    if (field != "model_type") {
      fields.push_back(field);
    }
  }
  for (const std::string& field : fields) {
    const nlohmann::json& want = expected[field];
    if (kNotMath.contains(field) || !hf_config.contains(field)) {
      continue;
    }
    const nlohmann::json& got = hf_config[field];
    bool same = got == want;
    if (!same && got.is_number() && want.is_number()) {
      const double a = got.get<double>();
      const double b = want.get<double>();
      same = std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
    }
    if (!same) {
      throw UserError("load_parameters_path: '" + path + "' says " + field + "=" + got.dump() +
                          " but this run's model has " + want.dump() +
                          " (the weights would compute another model; set the run's keys to "
                          "match, e.g. rope_max_timescale for rope_theta)",
                      "load_parameters_path");
    }
  }
}

}  // namespace tpusim
