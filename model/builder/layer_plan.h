// model/builder/layer_plan.h: which kinds of decoder layer a model has, and how many of each.
//
// Decoder layers differ by attention (global causal, sliding window, MLA) and by feed-forward
// (dense MLP or mixture of experts). MaxText's decoder blocks fix the pattern (each family's
// DecoderFamily::program_attention, model/decoder_family.cpp):
//   gemma2: every layer is a local (sliding window) + a global sublayer;
//   gemma3, gemma4: every 6th layer is global, the others local (gemma4's global layers have
//     their own head width, kv heads and shared K/V: ModelDims::global_layers_differ);
//   gemma4_small: every 5th layer is global; the last num_kv_shared_layers reuse an earlier
//     layer's keys and values (kv_shared; twice as wide an MLP with use_double_wide_mlp);
//   llama4: every nope_layer_interval-th layer is global (no RoPE), the others chunked
//     (chunk_attn_window_size); every interleave_moe_layer_step-th layer is MoE;
//   gpt_oss: alternating local/global (inhomogeneous_layer_cycle_interval);
//   deepseek: the first first_num_dense_layers are dense, the rest MoE, all MLA;
//   olmo3: sliding-window layers, every inhomogeneous_layer_cycle_interval-th (4th) global;
//   qwen3_next, qwen3_5: Gated DeltaNet (linear attention) layers, every
//     inhomogeneous_layer_cycle_interval-th (4th) gated full attention; every layer MoE;
//   deepseek4: compressed attention of each layer's compress_ratios entry, every layer MoE, the
//     first first_num_hash_layers hash-routed.
// Identical layers form one group, which becomes one repeated region of the graph (scan_layers):
// every layer of a kind wherever it sits (LayerOrder::kByKind, estimate and explore), or only
// consecutive ones, so that the groups run in MaxText's layer order (LayerOrder::kMaxText, train).
//
// Example (deepseek2-16b): {{dense, mla, x1}, {moe, mla, x26}}
// Example (qwen3-next-80b-a3b): {{moe, gated_delta_net, x36}, {moe, global, x12}}
// Example (deepseek4-284b): {{window, hash moe, x2}, {csa, hash moe, x1}, {hca128, moe, x20},
//   {csa, moe, x20}}; in MaxText's order {{window, hash moe, x2}, {csa, hash moe, x1},
//   {hca128, moe, x1, run 0}, {csa, moe, x1, run 0}, {hca128, moe, x1, run 1}, ...,
//   {csa, moe, x1, run 19}}: regions window_hash_moe_layer, csa_hash_moe_layer,
//   hca128_moe_layer_0, csa_moe_layer_0, ..., csa_moe_layer_19.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpusim {

class Config;

// kGatedDeltaNet: linear attention by the gated delta rule (build_gated_delta_net in
// model/builder/gated_delta_net.cpp); kCompressed: DeepSeek-V4's attention of a layer's
// compress_ratio (build_compressed_attention in model/builder/compressed_attention.cpp).
enum class AttentionKind { kGlobal, kSlidingWindow, kChunked, kMla, kGatedDeltaNet, kCompressed };
enum class FeedForwardKind { kDense, kMoe };

// deepseek4 (MaxText CompressedAttention): a layer of this compress_ratio has compressed sparse
// attention (overlapping blocks, the indexer's top-k); a larger ratio heavily compressed attention
// (every block); a smaller one only the sliding window.
inline constexpr int64_t kCompressedSparseRatio = 4;

// How plan_layers groups identical layers. kByKind: one group per kind of layer, in the order the
// kinds first appear. A step's FLOPs, bytes and time do not depend on the layers' order, and fewer
// regions partition faster, so estimate and explore build this. kMaxText: one group per run of
// consecutive identical layers, so the program computes the layers in MaxText's order (train's
// functional engine).
enum class LayerOrder { kByKind, kMaxText };

struct LayerGroup {
  AttentionKind attention = AttentionKind::kGlobal;
  FeedForwardKind feed_forward = FeedForwardKind::kDense;
  // gemma4_small's last num_kv_shared_layers (ModelDims::is_kv_shared_layer).
  bool kv_shared = false;
  int64_t mlp_dim = 0;  // the dense MLP's width (ModelDims::layer_mlp_dim)
  // deepseek4: the layer's compress_ratio (kCompressed) and whether it routes by token id.
  int64_t compress_ratio = 0;
  bool hash_routing = false;
  int64_t count = 0;
  // LayerOrder::kMaxText: which of its kind's runs of layers this group is (0, 1, ...), named as a
  // suffix; -1 when the kind has one run (always with kByKind), whose name has none.
  int64_t run = -1;
  // "layer", "moe_layer", "local_layer", "chunked_moe_layer", "kv_shared_local_layer",
  // "gdn_moe_layer", deepseek4's "window_hash_moe_layer", "csa_moe_layer", "hca128_moe_layer",
  // ..., with "_<run>" appended when the kind has several runs ("csa_moe_layer_3").
  std::string name() const;
};

std::vector<LayerGroup> plan_layers(const Config& config, LayerOrder order = LayerOrder::kByKind);

// The order tpusim train builds for this config: kMaxText for deepseek4 (whose preset alternates
// compressed sparse and heavily compressed layers), kByKind for the other families, whose trained
// regions (checkpoints, the fp64 reference's names) keep the merged plan.
LayerOrder train_layer_order(const Config& config);

}  // namespace tpusim
