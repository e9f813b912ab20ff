#include "sim/train/model_identity.h"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "common/error.h"
#include "common/yaml_text.h"
#include "sim/train/token_cache.h"

namespace tpusim {
namespace {

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
                                                "norm_topk_prob",
                                                "routed_scaling_factor",
                                                "capacity_factor",
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
// Not a config key either: which tokenizer the embedding rows belong to, by the tokenizer file's
// content ("byte-level" without tokenizer_path). Another tokenizer gives the same ids other
// meanings, so its run resumes into nonsense with shapes that fit (issue 35, item 5).
constexpr const char* kTokenizerKey = "tokenizer";

std::string tokenizer_identity(const std::string& path) {
  if (path.empty()) {
    return "byte-level";
  }
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return "unreadable " + path;  // the tokenizer's own loading names the problem
  }
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx",
                static_cast<unsigned long long>(content_hash(read_text_file(path))));
  return std::string("content ") + digest;
}

}  // namespace

nlohmann::json model_identity_from_config(const Config& config) {
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
  identity[kTokenizerKey] = tokenizer_identity(config.get_string("tokenizer_path"));
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
  const nlohmann::json current = model_identity_from_config(config);
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
    if (key == kTokenizerKey && current[key] != value) {
      throw UserError("checkpoint '" + directory + "' was trained with tokenizer " + value.dump() +
                          " but this run's tokenizer_path gives " + current[key].dump() +
                          ": its token ids would mean other text (use the checkpoint's tokenizer)",
                      "tokenizer_path");
    }
    if (current[key] != value) {
      throw UserError("checkpoint '" + directory + "' was made with " + key + "=" + value.dump() +
                          " but this run has " + key + "=" + current[key].dump() +
                          " (a checkpoint loads only into the model it was made from)",
                      key);
    }
  }
}

}  // namespace tpusim
