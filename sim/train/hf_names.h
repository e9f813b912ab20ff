// sim/train/hf_names.h: tpusim's parameters under Hugging Face Transformers' names and layouts.
//
// The one place that knows how a tpusim (MaxText-layout) parameter corresponds to a tensor of a
// Transformers checkpoint; import (load_parameters_path) and export (`tpusim export-hf`) both use
// it. Families:
//   decoder_block llama2 / mistral (dense)  -> LlamaForCausalLM / MistralForCausalLM names
//   decoder_block qwen3 (dense, use_qk_norm) -> Qwen3ForCausalLM names (Llama's plus
//                                               self_attn.q_norm / k_norm, [head_dim] each)
//   decoder_block gpt3                       -> GPT2LMHeadModel names
//   decoder_block mixtral (MoE)              -> MixtralForCausalLM names (block_sparse_moe.gate,
//                                               experts.E.w1 / w3 / w2)
//   decoder_block qwen3_moe (MoE, qk-norm)   -> Qwen3MoeForCausalLM names (mlp.gate,
//                                               mlp.experts.E.gate_proj / up_proj / down_proj)
// A MoE maps only when Transformers computes the same routing: every layer MoE, no shared
// expert, dropless (capacity_factor <= 0), routed_scaling_factor 1. Both blocks renormalize the
// top-k weights in MaxText whatever norm_topk_prob says (a softmax over the chosen logits), as
// MixtralSparseMoeBlock does; the exported Qwen3-MoE config says norm_topk_prob true.
// Layouts: a torch Linear weight is [out, in], MaxText's kernel [in, out] (with the heads axes
// split out: query [embed, heads, head_dim] <-> q_proj [heads*head_dim, embed]); GPT-2's Conv1D
// weights are already [in, out], and its c_attn holds query, key and value side by side. The query
// kernel is scaled as MaxText's conversion scripts scale it: Transformers multiplies q.k by
// 1/sqrt(head_dim) at run time, MaxText's default Attention does not (it lives in the query
// kernel), so tpusim's query = q_proj^T x (1/sqrt(head_dim)) / (tpusim's runtime scale): 1/4 for
// tiny-llama (head_dim 16), 1 for GPT-3 and Qwen3 (which scale at run time themselves). HF's rotary
// layout (q_proj rows of each head: the even then the odd frequencies, rotate_half) is already
// MaxText's split-halves RoPE, so no row permutation is needed. GPT-2's biases, which tpusim's gpt3
// block does not have, are written as zeros and must be zeros on import.
//
// Example (tiny-llama):
//   std::vector<HfTensor> map = hf_tensor_map(config);
//   // {"layer/attention/query#0" [64,4,16]  <->  "model.layers.0.self_attn.q_proj.weight" [64,64],
//   //  transposed, scale 0.25}, ...
//   auto hf = to_hf(config, checkpoint.weights);         // for model.safetensors
//   auto back = from_hf(config, hf);                      // the same weights (up to rounding)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/train/safetensors.h"

namespace tpusim {

class Config;

// One tpusim parameter and where it sits in a Transformers tensor. Both are viewed as matrices:
// tpusim's as [rows, cols] with rows = the product of its first `split` dims; the HF tensor holds
// that matrix (or its transpose) in columns [column_offset, column_offset + cols) of its own
// [hf_rows, hf_cols] view (hf_shape's first dim x the rest; a 1-D tensor is [n, 1]).
struct HfTensor {
  std::string name;            // tpusim "<region>/<tensor>#<layer>"
  std::vector<int64_t> shape;  // tpusim's global shape
  int64_t split = 1;
  std::string hf_name;  // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> hf_shape;
  bool transposed = false;
  int64_t column_offset = 0;
  double scale = 1;  // tpusim value = HF value x scale
  // >= 0: the entry is this block of the tpusim tensor's first dim (one expert of an
  // [experts, ...] kernel); the matrix view is then of the block, rows = the product of dims
  // [1, split).
  int64_t block = -1;
};

// The Transformers family of a config: "llama", "mistral", "qwen3", "gpt2", "mixtral" or
// "qwen3_moe". UserError naming
// decoder_block (or the key that rules the family out) otherwise; exit code 2.
std::string hf_family(const Config& config);

// Every parameter of the model with its HF tensor, plus (zeros_only) the HF tensors tpusim has no
// parameter for (GPT-2's biases): those export as zeros and must be zeros on import.
std::vector<HfTensor> hf_tensor_map(const Config& config);
std::map<std::string, std::vector<int64_t>> hf_zero_tensors(const Config& config);

// tpusim's global weights ("<region>/<tensor>#<layer>") -> the HF tensors of model.safetensors.
// logic_error when a weight the map names is missing (a checkpoint of another model is refused
// before, by its recorded model_config).
std::map<std::string, CheckpointTensor> to_hf(
    const Config& config, const std::map<std::string, CheckpointTensor>& weights);

// HF tensors -> tpusim's global weights. UserError naming the HF tensor when one is missing, has
// another shape than the config's model needs, or is a GPT-2 bias that is not zero.
std::map<std::string, CheckpointTensor> from_hf(const Config& config,
                                                const std::map<std::string, CheckpointTensor>& hf);

// config.json for the export: the fields of Transformers' LlamaConfig / MistralConfig /
// Qwen3Config / GPT2Config / MixtralConfig / Qwen3MoeConfig.
nlohmann::json hf_config_json(const Config& config);

// UserError naming the field when a Hugging Face config.json (read from `path`) describes another
// model than `config`'s: every field hf_config_json writes that fixes the math (sizes, epsilon,
// rope_theta, activation, tied embeddings, biases) must agree; absent fields are not checked.
void check_hf_config(const Config& config, const nlohmann::json& hf_config,
                     const std::string& path);

}  // namespace tpusim
