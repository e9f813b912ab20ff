// model/builder/layer_plan.h: which kinds of decoder layer a model has, and how many of each.
//
// Decoder layers differ by attention (global causal, sliding window, MLA) and by feed-forward
// (dense MLP or mixture of experts). MaxText's decoder blocks fix the pattern:
//   gemma2: every layer is a local (sliding window) + a global sublayer;
//   gemma3: every 6th layer is global, the others local;
//   gpt_oss: alternating local/global (inhomogeneous_layer_cycle_interval);
//   deepseek: the first first_num_dense_layers are dense, the rest MoE, all MLA.
// Identical layers form one group, which becomes one repeated region of the graph (scan_layers).
//
// Example (deepseek2-16b): {{dense, mla, x1}, {moe, mla, x26}}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpusim {

class Config;

enum class AttentionKind { kGlobal, kSlidingWindow, kMla };
enum class FeedForwardKind { kDense, kMoe };

struct LayerGroup {
  AttentionKind attention = AttentionKind::kGlobal;
  FeedForwardKind feed_forward = FeedForwardKind::kDense;
  int64_t count = 0;
  std::string name() const;  // "layer", "moe_layer", "local_layer", ...
};

std::vector<LayerGroup> plan_layers(const Config& config);

}  // namespace tpusim
