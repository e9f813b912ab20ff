// hw/attention_kernel_table.h: a GPU's measured fused-attention kernel throughput by sequence
// length, from a catalog file's `attention_kernel:` section (GPU entries only; TPUs leave it
// empty).
//
// The rates are whole-kernel figures (matmuls, softmax and masking together), counted in
// attention FLOPs the way the FlashAttention papers count them: forward 4 * Sq * Skv * head_dim
// per head, halved under a causal mask; backward 2.5 times the forward. `rate_scale` carries a
// table measured on one GPU over to another (B200 priced from the H100 table).
//
// Example (configs/hw/h100-sxm.yml):
//   attention_kernel:
//     kernel: "cuDNN fused attention, bf16, head dim 128"
//     source: "[FA3] ..."
//     seq_lengths: [512, 1024, 2048, 4096, 8192, 16384]
//     forward_tflops: [497, 574, 617, 609, 600, 595]
//     forward_causal_tflops: [315, 410, 484, 518, 529, 539]
//     backward_tflops: [305, 408, 465, 499, 518, 516]
//     rate_scale: {value: 1, source: "measured on this GPU"}
//   -> attention_kernel_tflops(table, 4096, AttentionPass::kForward, true) == 518
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace tpusim {

enum class AttentionPass { kForward, kBackward };

struct AttentionKernelTable {
  std::string kernel;  // which kernel the figures measure
  std::string source;  // where the figures come from
  std::vector<double> seq_lengths;
  std::vector<double> forward_tflops;         // no mask
  std::vector<double> forward_causal_tflops;  // causal mask, causal FLOPs (half the square)
  std::vector<double> backward_tflops;        // no mask (no causal backward was measured)
  double rate_scale = 1;
  std::string rate_scale_note;
  bool rate_scale_is_assumption = false;

  bool empty() const { return seq_lengths.empty(); }
};

// The kernel's TFLOP/s at `seq_length`, linear in log(seq_length) between the measured lengths
// and held at the end values outside them, times rate_scale. The causal backward keeps the
// forward's causal/non-causal ratio at that length (an assumption: no causal backward was
// measured).
double attention_kernel_tflops(const AttentionKernelTable& table, double seq_length,
                               AttentionPass pass, bool causal);

// Parses an `attention_kernel:` section; `where` names it in errors (UserError naming the key).
AttentionKernelTable parse_attention_kernel_table(const YAML::Node& node, std::string_view where);

}  // namespace tpusim
