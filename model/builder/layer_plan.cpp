#include "model/builder/layer_plan.h"

#include <algorithm>

#include "model/config.h"
#include "model/model_dims.h"

namespace tpusim {
namespace {

// gemma3 puts a global layer after every five local ones (MaxText gemma3 decoder block).
constexpr int64_t kGemma3GlobalEvery = 6;

// The keys that pick each layer's attention, read once per plan (not once per layer).
struct AttentionKeys {
  explicit AttentionKeys(const Config& config)
      : block(config.get_string("decoder_block")),
        attention_type(config.get_string("attention_type")),
        sliding_window_size(config.get_int("sliding_window_size")),
        cycle_interval(config.get_int("inhomogeneous_layer_cycle_interval")) {}

  std::string block;
  std::string attention_type;
  int64_t sliding_window_size;
  int64_t cycle_interval;
};

AttentionKind attention_for_layer(const AttentionKeys& keys, int64_t index) {
  if (keys.block == "deepseek" || keys.attention_type == "mla") {
    return AttentionKind::kMla;
  }
  if (keys.sliding_window_size <= 0) {
    return AttentionKind::kGlobal;
  }
  if (keys.block == "gemma3") {
    return (index + 1) % kGemma3GlobalEvery == 0 ? AttentionKind::kGlobal
                                                 : AttentionKind::kSlidingWindow;
  }
  if (keys.block == "gemma2" || keys.block == "gpt_oss") {
    const int64_t cycle = std::max<int64_t>(2, keys.cycle_interval);
    return index % cycle == 0 ? AttentionKind::kSlidingWindow : AttentionKind::kGlobal;
  }
  if (keys.attention_type == "local_sliding") {
    return AttentionKind::kSlidingWindow;
  }
  return AttentionKind::kGlobal;
}

}  // namespace

std::string LayerGroup::name() const {
  std::string text = attention == AttentionKind::kSlidingWindow ? "local_" : "";
  text += feed_forward == FeedForwardKind::kMoe ? "moe_layer" : "layer";
  return text;
}

std::vector<LayerGroup> plan_layers(const Config& config) {
  const ModelDims dims = ModelDims::from_config(config);
  const AttentionKeys keys(config);
  // gemma2's decoder layer holds a local and a global sublayer.
  const bool paired = keys.block == "gemma2";
  const int64_t sublayers = paired ? 2 * dims.num_layers : dims.num_layers;
  std::vector<LayerGroup> groups;
  for (int64_t index = 0; index < sublayers; ++index) {
    LayerGroup layer;
    layer.attention = attention_for_layer(keys, index);
    layer.feed_forward = dims.is_moe() && index >= dims.first_num_dense_layers
                             ? FeedForwardKind::kMoe
                             : FeedForwardKind::kDense;
    bool merged = false;
    for (LayerGroup& group : groups) {
      if (group.attention == layer.attention && group.feed_forward == layer.feed_forward) {
        ++group.count;
        merged = true;
        break;
      }
    }
    if (!merged) {
      layer.count = 1;
      groups.push_back(layer);
    }
  }
  return groups;
}

}  // namespace tpusim
