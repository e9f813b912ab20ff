// model/flops_maxtext.h: the model FLOPs MaxText counts per device per training step.
//
// maxtext_training_flops_per_device() is MaxText's calculate_tflops_training_per_device
// (src/maxtext/utils/maxtext_utils.py) as of PR #1988 (2025-07-27): the numerator of the
// "TFLOP/s/device" MaxText logs, and of the MFU users compute from it. It counts matmuls only, on
// one device, with B = per_device_batch_size sequences of S = max_target_length tokens:
//   learnable = 3 x [sum over layers of (FFN + router + QKV + out projection) + unembedding]
//   attention = 3 x sum over layers of the core attention (Q.K^T and P.V)
// both x gradient_accumulation_steps; 3 = forward + backward (twice the forward). Causal attention
// counts half of the S x S score matrix; the sliding-window layers of gemma2, gemma3 and gpt_oss
// count 4.B.(S.W - W^2/2).H.h. MoE layers count the router and the top-k (plus shared) experts
// only: a dropless assumption that ignores capacity_factor. Remat recompute, the optimizer and
// elementwise ops are not counted: these are model FLOPs, not the FLOPs the hardware executes.
// Term by term: docs/reference/maxtext.md §2. The Gated DeltaNet layers of qwen3_next/qwen3_5
// are counted by a formula DERIVED here from the architecture (docs/reference/maxtext.md §2a), not
// taken from MaxText: their projections as learnable weights, the chunked delta rule's matmuls as
// attention.
//
// maxtext_2023_flops_per_device() is the convention behind MaxText's 2023 README tables (v4, v5e,
// v5p): 6.N.B.S with N = every parameter (2023a, until 2023-06), plus non-causal attention
// 12.L.H.h.S^2.B from PR #48 (2023b, until 2024-05). Use it to read published 2023 TFLOP/s figures.
//
// Example:
//   Config config = Config::load("", {"model_name=deepseek2-16b", "compile_topology=v5p-8",
//                                     "per_device_batch_size=24", "max_target_length=2048"});
//   MaxTextFlops flops = maxtext_training_flops_per_device(config);
//   flops.total_tflops();          // 764.67 (MaxText docs, reference/performance_metrics.md)
//   flops.total_tflops() / 5.667;  // 134.9, the TFLOP/s/device MaxText logs at a 5.667 s step
//   flops.forward.router;          // 2.B.S.D.E FLOPs of one MoE layer's router, forward
#pragma once

#include <cstdint>

namespace tpusim {

class Config;

// Forward FLOPs of one microbatch on one device (FLOPs, not TFLOPs), per layer of each kind, and
// the number of layers of each kind. A layer's feed-forward block is dense or MoE, and its
// attention global (causal) or local (sliding window). D = emb_dim, F = mlp_dim, a =
// len(mlp_activations), E/k = num_experts/num_experts_per_tok, H/K = query/kv heads, h = head_dim,
// W = sliding_window_size, V = vocab_size.
struct MaxTextForwardFlops {
  double dense_ffn = 0;  // one dense layer: 2.B.S.D.F.a + 2.B.S.D.F
  double moe_ffn = 0;  // one MoE layer's experts: shared x FFN(shared width) + k x FFN(moe_mlp_dim)
  double router = 0;   // one MoE layer's router: 2.B.S.D.E
  double qkv = 0;      // one layer: 2.B.S.D.(H+2K).h, or MLA's q and kv projections
  double out_proj = 0;  // one layer: 2.B.S.D.H.h (MLA: h = v_head_dim)
  // gemma4's global layers: QKV 2.B.S.D.(H+K_g).h_g (one shared K/V projection) and out
  // projection 2.B.S.D.H.h_g; the other blocks: qkv and out_proj.
  double global_qkv = 0;
  double global_out_proj = 0;
  double global_attention = 0;  // one causal layer: 2.B.S^2.H.h (MLA: B.S^2.H.(nope+rope+v))
  double local_attention = 0;   // one sliding-window layer: 4.B.(S.W - W^2/2).H.h, W <= S
  // One llama4 chunked layer: 4.B.(n.C^2/2 + r^2/2).H.h, n = S // C whole chunks, r = S % C.
  double chunked_attention = 0;
  double unembed = 0;  // once per model: 2.B.S.D.V (the input lookup is a gather)
  // gemma4_small: the K and V projections a kv-shared layer does not compute (2.B.S.D.2K.h, and
  // with the global layers' K and h for a global one), the dense FFN of a kv-shared layer (twice
  // as wide with use_double_wide_mlp), and the per-layer inputs over the whole model: the
  // projection of the embeddings to L.P (2.B.S.D.L.P) plus each layer's gate and output
  // projections (2 x 2.B.S.D.P), P = hidden_size_per_layer_input.
  double kv_projection = 0;
  double global_kv_projection = 0;
  double kv_shared_dense_ffn = 0;
  double per_layer_inputs = 0;
  // qwen3_next / qwen3_5 (derived, docs/reference/maxtext.md §2a), with Hk/Hv = gdn key/value
  // heads, dk/dv their widths, C = gdn_chunk_size, T = B.S:
  //   one Gated DeltaNet layer's projections: 2.T.D.(2.Hk.dk + 2.Hv.dv + 2.Hv) + 2.T.Hv.dv.D
  //   (q, k, v, the output gate z, beta and the decay; out_proj);
  //   its chunked delta rule: T.Hv.(2.C.(3.dk + 2.dv) + 6.dk.dv);
  //   one MoE layer's shared-expert gate: 2.T.D.
  // Their full-attention layers' query projection also yields the output gate: global_qkv is
  // 2.T.D.(2.H + 2.K).h there.
  // qwen3_custom_moe: each layer's up projection from attention_output_dim A to emb_dim, 2.B.S.A.D
  // (its out_proj is 2.B.S.A.H.h, its router and experts read moe_expert_input_dim = A).
  double layer_up_projection = 0;
  double gated_delta_net_projections = 0;
  double gated_delta_net_core = 0;
  double shared_expert_gate = 0;
  int64_t num_gated_delta_net_layers = 0;
  int64_t num_kv_shared_layers = 0;
  int64_t num_kv_shared_global_layers = 0;
  int64_t num_layers = 0;  // the real depth (gemma2: 2 x base_num_decoder_layers)
  int64_t num_dense_layers = 0;
  int64_t num_moe_layers = 0;
  int64_t num_global_attention_layers = 0;
  int64_t num_local_attention_layers = 0;
  int64_t num_chunked_attention_layers = 0;

  // FFN + router + QKV + out projection over all layers, plus the unembedding.
  double learnable_weight_flops() const;
  // Core attention over all layers.
  double attention_flops() const;
};

// MaxText's current accounting, per device per optimizer step (all microbatches).
struct MaxTextFlops {
  double learnable_weight_tflops = 0;  // 3 x G x forward.learnable_weight_flops() / 1e12
  double attention_tflops = 0;         // 3 x G x forward.attention_flops() / 1e12
  MaxTextForwardFlops forward;         // one microbatch, forward only
  int64_t gradient_accumulation_steps = 1;

  double total_tflops() const { return learnable_weight_tflops + attention_tflops; }
  // The K/V projections of gemma4_small's kv-shared layers over the step (3 x G x forward):
  // MaxText skips them and does not count them; tpusim's program computes them
  // (model/builder/attention_block.cpp), so its matmul FLOPs are total_tflops() plus these.
  double kv_shared_projection_tflops() const;
};

// MaxText's calculate_tflops_training_per_device for `config` (dims after global_parameter_scale).
// UserError if gpt_oss has inhomogeneous_layer_cycle_interval < 1.
MaxTextFlops maxtext_training_flops_per_device(const Config& config);

// The 2023 convention, per device per optimizer step (x gradient_accumulation_steps, which 2023
// MaxText did not have; it is 1 in the published runs).
struct MaxText2023Flops {
  // N: every parameter, embedding table included (and the unembedding unless
  // logits_via_embedding); MoE layers count all experts; norm scales two per layer plus a final
  // one.
  double num_params = 0;
  double weight_tflops = 0;     // 6.N.B.S x G / 1e12: the whole 2023a formula
  double attention_tflops = 0;  // 12.L.H.h.S^2.B x G / 1e12: added by 2023b (non-causal)

  double total_2023a_tflops() const { return weight_tflops; }
  double total_2023b_tflops() const { return weight_tflops + attention_tflops; }
};

MaxText2023Flops maxtext_2023_flops_per_device(const Config& config);

}  // namespace tpusim
