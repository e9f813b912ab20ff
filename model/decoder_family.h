// model/decoder_family.h: the decoder families tpusim supports (MaxText's decoder_block) and one
// traits row per family: everything the program builder, MaxText's FLOP count, `train` and the
// Hugging Face names decide by family.
//
// The block name is parsed once (ModelDims::from_config; the config rules list the names from
// here); every other file reads the enum and its row, as MaxText's decoders.py picks a layer class
// from decoder_block. Adding a family is an enum value, its row in decoder_family.cpp, and, when
// its layers are new, their builder file (docs/design.md, "Adding a decoder family").
//
// Example:
//   const DecoderFamily& gemma3 = decoder_family(DecoderBlock::kGemma3);
//   gemma3.name == "gemma3";
//   gemma3.program_attention.layout == AttentionLayout::kGlobalEveryN  // period 6
//   decoder_family(DecoderBlock::kOlmo3).maxtext_attention.layout == AttentionLayout::kUniform
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

// In the order the config rules list the values (and their error messages name them).
enum class DecoderBlock {
  kLlama2,
  kMistral,
  kMixtral,
  kGemma,
  kGemma2,
  kGemma3,
  kGemma4,
  kGemma4Small,
  kGpt3,
  kQwen2,
  kQwen3,
  kQwen3Moe,
  kQwen3Next,
  kQwen3_5,
  kDeepseek,
  kGptOss,
  kLlama4,
  kOlmo3,
  kEnvy,
  kSimple,
  kQwen3CustomMoe,
  kDeepseek4,
  kCount,  // not a family: the number of them (the traits table's size is checked against it)
};

constexpr size_t kDecoderBlockCount = static_cast<size_t>(DecoderBlock::kCount);

// Which layers attend globally and which otherwise, layer index i counted from 0.
enum class AttentionLayout {
  // Every layer alike: global (the program's layers are all sliding-window ones when
  // attention_type is local_sliding and there is a window; MaxText's count ignores that).
  kUniform,
  // With a sliding window: layer i global when (i + 1) % period == 0, the others sliding-window.
  kGlobalEveryN,
  // With a sliding window: layer i sliding-window when i % period == 0, the others global.
  kLocalEveryN,
  // Every nope_layer_interval-th layer global (no RoPE), the others chunked
  // (chunk_attn_window_size; all global without chunks).
  kChunkedNopeGlobal,
  // Multi-head latent attention in every layer, whatever attention_type says.
  kMla,
  // Gated DeltaNet layers, every inhomogeneous_layer_cycle_interval-th gated full attention
  // (ModelDims::is_gated_delta_net_layer).
  kGatedDeltaNet,
  // DeepSeek-V4's compressed attention, by layer i's compress_ratios[i]: 0 = sliding-window
  // attention only, 4 = plus compressed sparse attention (an indexer picks indexer_topk of the
  // blocks of 4), larger = plus heavily compressed attention over every block of that many tokens
  // (ModelDims::compress_ratio).
  kCompressed,
};

struct AttentionPattern {
  // period for kFromCycleInterval: inhomogeneous_layer_cycle_interval, at least min_period.
  static constexpr int64_t kFromCycleInterval = 0;

  AttentionLayout layout = AttentionLayout::kUniform;
  int64_t period = kFromCycleInterval;  // kGlobalEveryN, kLocalEveryN
  int64_t min_period = 1;

  // The period of a config whose inhomogeneous_layer_cycle_interval is `cycle_interval`.
  int64_t period_for(int64_t cycle_interval) const;
};

// How wide a shared expert is: base_moe_mlp_dim's width, or (gemma4) the dense MLP's.
enum class SharedExpertWidth { kMoeMlpDim, kMlpDim };

// How the attention's query is scaled by 1/sqrt(head_dim) when qk-norm and MLA do not decide it
// (model/builder/initializers.h query_scaling_from_config).
enum class QueryScale {
  kFoldedIntoInit,        // MaxText's default Attention: in the query kernel's init
  kRuntimeGpt3,           // GPT-3 attention: query / sqrt(head_dim) at run time
  kRuntimePreAttnScalar,  // gemma: query_pre_attn_scalar = head_dim^-0.5 at run time
};

// Positions: RoPE in every layer, learned positions (trainable_position_size; no RoPE), or RoPE
// except in the global layers (NoPE).
enum class PositionEncoding { kRope, kLearned, kRopeExceptGlobal };

// The decoder layer's norms: RMSNorm (scale only) or LayerNorm (scale and bias).
enum class NormKind { kRmsNorm, kLayerNorm };

// Where the decoder layer normalizes: before attention and MLP (post norms by use_post_attn_norm
// and use_post_ffw_norm), or only after them (OLMo 2/3: no input norm).
enum class NormPlacement { kPreNorm, kPostNormOnly };

// qk-norm as the family defines it: a per-head RMSNorm before RoPE (MaxText's default Attention),
// or llama4's scale-free L2 norm after RoPE.
enum class QkNormKind { kRmsBeforeRope, kL2AfterRope };

// How MaxText's RoutedMoE.get_topk (layers/moe.py) weights a token's chosen experts. Example:
// chosen probabilities 0.3 and 0.1 weigh 0.75 and 0.25 under kSoftmaxOfChosen whatever
// norm_topk_prob says, and 0.3 and 0.1 under kChosenProbabilities unless norm_topk_prob is true.
enum class RouterWeights {
  // A softmax over the chosen experts' logits, i.e. the chosen probabilities renormalized to sum
  // to 1 (every block but the ones below).
  kSoftmaxOfChosen,
  // The chosen experts' probabilities (deepseek: times routed_scaling_factor; gemma4: gathered
  // from the softmax over all experts), renormalized only when norm_topk_prob is true.
  kChosenProbabilities,
  // llama4: the sigmoid of each chosen logit scales the token before its expert.
  kSigmoidScalesInput,
};

// The Hugging Face Transformers names a family's parameters map to (sim/train/hf_names.h).
enum class HfNameScheme { kNone, kLlama, kMistral, kQwen3, kGpt2 };

// One family's row. Fields are what the code decides by family; keys that a config sets
// (use_qk_norm, sliding_window_size, ...) stay in the config.
struct DecoderFamily {
  DecoderBlock block = DecoderBlock::kCount;
  const char* name = "";  // decoder_block's value
  // The attention pattern the program builds (model/builder/layer_plan.cpp) and the one
  // MaxText's logged TFLOP/s counts (model/flops_maxtext.cpp); they differ where MaxText's count
  // differs from the model it runs (olmo3, deepseek, gemma2, gpt_oss: see the rows).
  AttentionPattern program_attention;
  AttentionPattern maxtext_attention;
  // Real layers per decoder layer of base_num_decoder_layers (gemma2: a local + a global one).
  int64_t layers_per_decoder_layer = 1;
  // MoE layers add shared_experts (the generic MoE path has none), and how wide one is.
  bool moe_shared_experts = false;
  SharedExpertWidth shared_expert_width = SharedExpertWidth::kMoeMlpDim;
  // MaxText's FLOP count adds the shared experts (false: its generic MoE path, which deepseek4
  // falls into, counts the router and the top-k routed experts only).
  bool maxtext_counts_shared_experts = true;
  // qwen3_custom_moe: the attention projects to attention_output_dim, the experts work at
  // moe_expert_input_dim (= attention_output_dim) after a latent RMSNorm, and a layer up
  // projection returns to emb_dim; the layer has no MLP norm and one residual.
  bool latent_moe = false;
  // deepseek4: the residual stream is mhc_expansion_rate streams mixed by manifold-constrained
  // hyper-connections around the attention and the MoE, and the first first_num_hash_layers MoE
  // layers pick their experts by token id (hash routing).
  bool hyper_connections = false;
  bool hash_routing = false;
  RouterWeights router_weights = RouterWeights::kSoftmaxOfChosen;
  // Global layers with their own head width, kv heads and shared K/V (global_head_dim, ...).
  bool global_layers_own_shape = false;
  // Per-layer inputs (hidden_size_per_layer_input) and the last num_kv_shared_layers layers
  // reusing an earlier layer's keys and values (gemma4_small).
  bool per_layer_inputs = false;
  bool kv_shared_layers = false;
  // qk-norm even when use_qk_norm is false (Qwen3-Next's full-attention layers).
  bool always_qk_norm = false;
  QkNormKind qk_norm = QkNormKind::kRmsBeforeRope;
  QueryScale query_scale = QueryScale::kFoldedIntoInit;
  PositionEncoding positions = PositionEncoding::kRope;
  NormKind norm = NormKind::kRmsNorm;
  NormPlacement norm_placement = NormPlacement::kPreNorm;
  // The attention kernels are initialized from a normal distribution (GPT-3), not a truncated one.
  bool normal_attention_init = false;
  HfNameScheme hf_names = HfNameScheme::kNone;
  // Why `tpusim train` refuses the family (nullptr: train builds it); estimate and explore model
  // every family.
  const char* train_refusal = nullptr;
  // MaxText keys outside tpusim's base.yml that the family's builder reads (ModelDims), so they
  // are not reported as "not modeled" for it (deepseek4: mhc_expansion_rate, indexer_*).
  std::span<const std::string_view> builder_maxtext_keys = {};
  // Keys configs/maxtext/train_keys.tsv refuses for every family that `train` computes for this
  // one, or refuses by its own checks (sim/train/trainer.cpp check_functional_support).
  std::span<const std::string_view> train_checked_keys = {};

  bool has_gated_delta_net() const {
    return program_attention.layout == AttentionLayout::kGatedDeltaNet;
  }
  bool always_mla() const { return program_attention.layout == AttentionLayout::kMla; }
  bool has_compressed_attention() const {
    return program_attention.layout == AttentionLayout::kCompressed;
  }
};

// The table: one row per DecoderBlock, in enum order.
const std::array<DecoderFamily, kDecoderBlockCount>& decoder_families();
const DecoderFamily& decoder_family(DecoderBlock block);
const char* decoder_block_name(DecoderBlock block);
// Every family's name, in enum order (the values config rules allow for decoder_block).
std::vector<std::string> decoder_block_names();
// UserError "decoder_block: 'x' is not one of ..." (as the config rules word it) for other names.
DecoderBlock parse_decoder_block(std::string_view name);

// Transformers' model_type ("llama", ...) and architecture ("LlamaForCausalLM", ...) of a scheme
// other than kNone.
const char* hf_model_type(HfNameScheme scheme);
const char* hf_architecture(HfNameScheme scheme);
// The families that have Transformers names, by scheme: "llama2, mistral: Llama/Mistral names;
// qwen3: Qwen3 names; gpt3: GPT-2 names".
std::string hf_mapped_families();

}  // namespace tpusim
