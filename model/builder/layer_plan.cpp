#include "model/builder/layer_plan.h"

#include "model/config.h"
#include "model/model_dims.h"

namespace tpusim {
namespace {

// gemma3 puts a global layer after every five local ones (MaxText gemma3 decoder block).
constexpr int64_t kGemma3GlobalEvery = 6;

AttentionKind attention_for_layer(const Config& config, int64_t index) {
  const std::string block = config.get_string("decoder_block");
  if (block == "deepseek" || config.get_string("attention_type") == "mla") {
    return AttentionKind::kMla;
  }
  if (config.get_int("sliding_window_size") <= 0) {
    return AttentionKind::kGlobal;
  }
  if (block == "gemma3") {
    return (index + 1) % kGemma3GlobalEvery == 0 ? AttentionKind::kGlobal
                                                 : AttentionKind::kSlidingWindow;
  }
  if (block == "gemma2" || block == "gpt_oss") {
    const int64_t cycle =
        std::max<int64_t>(2, config.get_int("inhomogeneous_layer_cycle_interval"));
    return index % cycle == 0 ? AttentionKind::kSlidingWindow : AttentionKind::kGlobal;
  }
  if (config.get_string("attention_type") == "local_sliding") {
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
  // gemma2's decoder layer holds a local and a global sublayer.
  const bool paired = config.get_string("decoder_block") == "gemma2";
  const int64_t sublayers = paired ? 2 * dims.num_layers : dims.num_layers;
  std::vector<LayerGroup> groups;
  for (int64_t index = 0; index < sublayers; ++index) {
    LayerGroup layer;
    layer.attention = attention_for_layer(config, index);
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
