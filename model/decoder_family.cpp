#include "model/decoder_family.h"

#include <algorithm>
#include <stdexcept>

#include "common/error.h"
#include "common/suggest.h"

namespace tpusim {
namespace {

using enum AttentionLayout;
constexpr int64_t kCycle = AttentionPattern::kFromCycleInterval;

// Every layer alike (global unless attention_type says local_sliding; see AttentionLayout).
constexpr AttentionPattern kUniformPattern = {kUniform};
// gemma3 and gemma4 put a global layer after every five local ones (MaxText's gemma3 block,
// GEMMA3_ATTENTION_PATTERN_LENGTH; for gemma4 the pattern reproduces the TFLOP/s that MaxText's
// Ironwood recipes publish, see tests/model/flops_maxtext_test.cpp).
constexpr AttentionPattern kGemma3Pattern = {kGlobalEveryN, 6};
// gemma4_small (gemma4-e2b/e4b) puts a global layer after every four local ones: with it, the
// TFLOP/s that MaxText logs for the gemma4-e2b Ironwood recipe is reproduced exactly (7 global
// layers of 35; tests/model/flops_maxtext_test.cpp), where one in six is 3% short.
constexpr AttentionPattern kGemma4SmallPattern = {kGlobalEveryN, 5};
// gemma2 and gpt_oss alternate (local, global) in the program, every
// inhomogeneous_layer_cycle_interval-th (at least 2nd) layer local.
constexpr AttentionPattern kAlternatingPattern = {kLocalEveryN, kCycle, 2};
// Qwen3-Next's hybrid layout (Hugging Face Qwen3NextConfig.layer_types).
constexpr AttentionPattern kGatedDeltaNetPattern = {kGatedDeltaNet, kCycle, 1};

// The Gated DeltaNet layers are built for estimate and explore only: their chunked delta rule is
// written as independent per-chunk matmuls with the FLOPs, bytes and memory of the real one, not
// as the recurrence (model/builder/gated_delta_net.cpp).
constexpr const char* kGatedDeltaNetRefusal =
    "its Gated DeltaNet layers are modeled for estimate and explore only, not computed";

// The MaxText keys the deepseek4 builder reads that are not modeled for other families: the mHC
// streams and the CSA indexer's shape and top-k, the compressed layers' RoPE wavelength
// (model/builder/hyper_connections.cpp, compressed_attention.cpp; not in tpusim's base.yml), and
// the load-balance loss and the router bias's update, built for deepseek4's routers alone.
constexpr std::array<std::string_view, 8> kDeepseek4MaxTextKeys = {
    "mhc_expansion_rate",       "indexer_n_heads",
    "indexer_head_dim",         "indexer_topk",
    "sinkhorn_iterations",      "compressed_rope_max_timescale",
    "load_balance_loss_weight", "routed_bias_update_rate"};

// The keys train_keys.tsv refuses for every family that train checks itself for deepseek4 (the
// compressed attention's shape, built at ratio 0; the rest refused by key when turned on) and
// computes for qwen3_custom_moe (its latent widths).
constexpr std::array<std::string_view, 14> kDeepseek4TrainKeys = {
    "compress_ratios",          "o_groups",           "o_lora_rank",
    "first_num_hash_layers",    "mhc_expansion_rate", "indexer_n_heads",
    "indexer_head_dim",         "indexer_topk",       "routed_bias_update_rate",
    "mlp_activations_limit",    "routed_score_func",  "routed_bias",
    "load_balance_loss_weight", "sinkhorn_iterations"};
constexpr std::array<std::string_view, 2> kLatentMoeTrainKeys = {"attention_output_dim",
                                                                 "moe_expert_input_dim"};

// clang-format off
constexpr std::array<DecoderFamily, kDecoderBlockCount> kFamilies = {{
    {.block = DecoderBlock::kLlama2, .name = "llama2",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern,
     .hf_names = HfNameScheme::kLlama},
    {.block = DecoderBlock::kMistral, .name = "mistral",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern,
     .hf_names = HfNameScheme::kMistral},
    {.block = DecoderBlock::kMixtral, .name = "mixtral",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern},
    {.block = DecoderBlock::kGemma, .name = "gemma",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern},
    // Each decoder layer is a (local sliding-window, global) pair of real layers; MaxText's count
    // (PRs #2009/#2030) takes every second real layer as global, whatever the cycle interval.
    {.block = DecoderBlock::kGemma2, .name = "gemma2",
     .program_attention = kAlternatingPattern,
     .maxtext_attention = {kGlobalEveryN, 2},
     .layers_per_decoder_layer = 2,
     .query_scale = QueryScale::kRuntimePreAttnScalar},
    {.block = DecoderBlock::kGemma3, .name = "gemma3",
     .program_attention = kGemma3Pattern, .maxtext_attention = kGemma3Pattern,
     .query_scale = QueryScale::kRuntimePreAttnScalar},
    {.block = DecoderBlock::kGemma4, .name = "gemma4",
     .program_attention = kGemma3Pattern, .maxtext_attention = kGemma3Pattern,
     .moe_shared_experts = true, .shared_expert_width = SharedExpertWidth::kMlpDim,
     .router_weights = RouterWeights::kChosenProbabilities, .global_layers_own_shape = true,
     .query_scale = QueryScale::kRuntimePreAttnScalar},
    {.block = DecoderBlock::kGemma4Small, .name = "gemma4_small",
     .program_attention = kGemma4SmallPattern, .maxtext_attention = kGemma4SmallPattern,
     .global_layers_own_shape = true, .per_layer_inputs = true, .kv_shared_layers = true,
     .query_scale = QueryScale::kRuntimePreAttnScalar},
    {.block = DecoderBlock::kGpt3, .name = "gpt3",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern,
     .query_scale = QueryScale::kRuntimeGpt3, .positions = PositionEncoding::kLearned,
     .norm = NormKind::kLayerNorm, .normal_attention_init = true,
     .hf_names = HfNameScheme::kGpt2},
    {.block = DecoderBlock::kQwen2, .name = "qwen2",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern},
    {.block = DecoderBlock::kQwen3, .name = "qwen3",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern,
     .hf_names = HfNameScheme::kQwen3},
    {.block = DecoderBlock::kQwen3Moe, .name = "qwen3_moe",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern},
    {.block = DecoderBlock::kQwen3Next, .name = "qwen3_next",
     .program_attention = kGatedDeltaNetPattern, .maxtext_attention = kGatedDeltaNetPattern,
     .moe_shared_experts = true, .always_qk_norm = true,
     .train_refusal = kGatedDeltaNetRefusal},
    // Qwen3.5's text decoder is Qwen3-Next's.
    {.block = DecoderBlock::kQwen3_5, .name = "qwen3_5",
     .program_attention = kGatedDeltaNetPattern, .maxtext_attention = kGatedDeltaNetPattern,
     .moe_shared_experts = true, .always_qk_norm = true,
     .train_refusal = kGatedDeltaNetRefusal},
    // MLA in every layer; MaxText counts its attention as global layers (with MLA's widths when
    // attention_type is mla).
    {.block = DecoderBlock::kDeepseek, .name = "deepseek",
     .program_attention = {kMla}, .maxtext_attention = kUniformPattern,
     .moe_shared_experts = true, .router_weights = RouterWeights::kChosenProbabilities},
    // The program alternates (local, global) as gemma2 does; MaxText counts one global layer per
    // inhomogeneous_layer_cycle_interval (the same for the preset's 2).
    {.block = DecoderBlock::kGptOss, .name = "gpt_oss",
     .program_attention = kAlternatingPattern,
     .maxtext_attention = {kGlobalEveryN, kCycle}},
    {.block = DecoderBlock::kLlama4, .name = "llama4",
     .program_attention = {kChunkedNopeGlobal}, .maxtext_attention = {kChunkedNopeGlobal},
     .moe_shared_experts = true, .router_weights = RouterWeights::kSigmoidScalesInput,
     .qk_norm = QkNormKind::kL2AfterRope,
     .positions = PositionEncoding::kRopeExceptGlobal},
    // OLMo 3 (Hugging Face Olmo3Config.layer_types): sliding-window attention except in every
    // inhomogeneous_layer_cycle_interval-th layer (MaxText's preset: 4), which is global. MaxText's
    // logged TFLOP/s count its sliding-window layers as global: beyond the 4096-token window they
    // count more attention than the model does (the program computes the windows). train refuses
    // it: its rotary embedding is YaRN-scaled and its qk-norm spans all heads (Hugging Face's
    // Olmo3Attention), where the functional engine builds plain RoPE and per-head qk-norm.
    {.block = DecoderBlock::kOlmo3, .name = "olmo3",
     .program_attention = {kGlobalEveryN, kCycle, 1}, .maxtext_attention = kUniformPattern,
     .norm_placement = NormPlacement::kPostNormOnly,
     .train_refusal = "its YaRN rotary embedding and all-heads qk-norm are not built; estimate "
                      "and explore model it"},
    {.block = DecoderBlock::kEnvy, .name = "envy",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern},
    {.block = DecoderBlock::kSimple, .name = "simple",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern},
    // MaxText's Qwen3CustomMoeDecoderLayer (models/qwen3_custom.py): GQA attention projecting to
    // attention_output_dim, a latent RMSNorm, routed experts at that width, an up projection. Its
    // attention always gets query_pre_attn_scalar = head_dim^-0.5 (qk-norm or not).
    {.block = DecoderBlock::kQwen3CustomMoe, .name = "qwen3_custom_moe",
     .program_attention = kUniformPattern, .maxtext_attention = kUniformPattern,
     .latent_moe = true, .query_scale = QueryScale::kRuntimePreAttnScalar,
     .train_checked_keys = kLatentMoeTrainKeys},
    // MaxText's DeepSeek4DecoderLayer (models/deepseek4.py, layers/attention_compressed.py,
    // layers/mhc.py). MaxText's logged TFLOP/s count it by the generic path: every layer's
    // attention as global causal attention of num_query_heads x head_dim with Q, K, V and out
    // projections from emb_dim, the router and top-k experts without the shared one
    // (docs/reference/deepseek4.md).
    {.block = DecoderBlock::kDeepseek4, .name = "deepseek4",
     .program_attention = {kCompressed}, .maxtext_attention = kUniformPattern,
     .moe_shared_experts = true, .maxtext_counts_shared_experts = false,
     .hyper_connections = true, .hash_routing = true,
     .builder_maxtext_keys = kDeepseek4MaxTextKeys, .train_checked_keys = kDeepseek4TrainKeys},
}};
// clang-format on

// Every row sits at its enum's index (checked at compile time, so a missing row or one out of
// order does not build).
constexpr bool rows_in_enum_order() {
  for (size_t index = 0; index < kDecoderBlockCount; ++index) {
    if (static_cast<size_t>(kFamilies[index].block) != index) {
      return false;
    }
  }
  return true;
}

struct HfSchemeNames {
  HfNameScheme scheme;
  const char* model_type;
  const char* architecture;
  const char* label;  // as hf_mapped_families lists it
};

constexpr std::array<HfSchemeNames, 4> kHfSchemes = {{
    {HfNameScheme::kLlama, "llama", "LlamaForCausalLM", "Llama/Mistral names"},
    {HfNameScheme::kMistral, "mistral", "MistralForCausalLM", "Llama/Mistral names"},
    {HfNameScheme::kQwen3, "qwen3", "Qwen3ForCausalLM", "Qwen3 names"},
    {HfNameScheme::kGpt2, "gpt2", "GPT2LMHeadModel", "GPT-2 names"},
}};

const HfSchemeNames& hf_scheme_names(HfNameScheme scheme) {
  for (const HfSchemeNames& names : kHfSchemes) {
    if (names.scheme == scheme) {
      return names;
    }
  }
  throw std::logic_error("hf_scheme_names: HfNameScheme::kNone has no Transformers names");
}

}  // namespace

int64_t AttentionPattern::period_for(int64_t cycle_interval) const {
  return period == kFromCycleInterval ? std::max(min_period, cycle_interval) : period;
}

const std::array<DecoderFamily, kDecoderBlockCount>& decoder_families() {
  static_assert(kFamilies.size() == kDecoderBlockCount, "one traits row per DecoderBlock");
  return kFamilies;
}

const DecoderFamily& decoder_family(DecoderBlock block) {
  if (block == DecoderBlock::kCount) {
    throw std::logic_error("decoder_family: DecoderBlock::kCount is not a family");
  }
  const DecoderFamily& family = kFamilies[static_cast<size_t>(block)];
  if (family.block != block) {
    throw std::logic_error(std::string("decoder_family: the row of '") + family.name +
                           "' is out of enum order");
  }
  return family;
}

const char* decoder_block_name(DecoderBlock block) {
  return decoder_family(block).name;
}

std::vector<std::string> decoder_block_names() {
  std::vector<std::string> names;
  names.reserve(kFamilies.size());
  for (const DecoderFamily& family : kFamilies) {
    names.emplace_back(family.name);
  }
  return names;
}

DecoderBlock parse_decoder_block(std::string_view name) {
  for (const DecoderFamily& family : kFamilies) {
    if (name == family.name) {
      return family.block;
    }
  }
  const std::vector<std::string> names = decoder_block_names();
  std::string list;
  for (const std::string& known : names) {
    list += (list.empty() ? "" : ", ") + known;
  }
  throw UserError("decoder_block: '" + std::string(name) + "' is not one of " + list +
                  did_you_mean(name, names));
}

const char* hf_model_type(HfNameScheme scheme) {
  return hf_scheme_names(scheme).model_type;
}

const char* hf_architecture(HfNameScheme scheme) {
  return hf_scheme_names(scheme).architecture;
}

std::string hf_mapped_families() {
  std::string text;
  std::string pending;  // families of the current label
  for (size_t index = 0; index < kHfSchemes.size(); ++index) {
    for (const DecoderFamily& family : kFamilies) {
      if (family.hf_names == kHfSchemes[index].scheme) {
        pending += (pending.empty() ? "" : ", ") + std::string(family.name);
      }
    }
    const bool last_of_label =
        index + 1 == kHfSchemes.size() ||
        std::string_view(kHfSchemes[index + 1].label) != std::string_view(kHfSchemes[index].label);
    if (last_of_label) {
      text += (text.empty() ? "" : "; ") + pending + ": " + kHfSchemes[index].label;
      pending.clear();
    }
  }
  return text;
}

static_assert(rows_in_enum_order(),
              "decoder_family.cpp: the rows must follow DecoderBlock's order");

}  // namespace tpusim
