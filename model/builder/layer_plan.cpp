#include "model/builder/layer_plan.h"

#include <algorithm>

#include "model/config.h"
#include "model/model_dims.h"

namespace tpusim {
namespace {

// The keys that pick each layer's attention, read once per plan (not once per layer).
struct AttentionKeys {
  std::string attention_type;
  int64_t sliding_window_size = 0;
  int64_t cycle_interval = 0;
  int64_t chunk_size = 0;
  int64_t nope_interval = 0;
};

AttentionKeys attention_keys_from_config(const Config& config) {
  AttentionKeys keys;
  keys.attention_type = config.get_string("attention_type");
  keys.sliding_window_size = config.get_int("sliding_window_size");
  keys.cycle_interval = config.get_int("inhomogeneous_layer_cycle_interval");
  keys.chunk_size = config.get_int("chunk_attn_window_size");
  keys.nope_interval = config.get_int("nope_layer_interval");
  return keys;
}

// Layer `index` under the family's program pattern (DecoderFamily::program_attention).
AttentionKind attention_for_layer(const AttentionKeys& keys, const ModelDims& dims, int64_t index) {
  const AttentionPattern& pattern = dims.family().program_attention;
  if (pattern.layout == AttentionLayout::kCompressed) {
    return AttentionKind::kCompressed;
  }
  if (pattern.layout == AttentionLayout::kGatedDeltaNet) {
    return dims.is_gated_delta_net_layer(index) ? AttentionKind::kGatedDeltaNet
                                                : AttentionKind::kGlobal;
  }
  if (pattern.layout == AttentionLayout::kMla || keys.attention_type == "mla") {
    return AttentionKind::kMla;
  }
  switch (pattern.layout) {
    case AttentionLayout::kGatedDeltaNet:
    case AttentionLayout::kMla:
    case AttentionLayout::kCompressed:
      break;  // above
    case AttentionLayout::kChunkedNopeGlobal: {
      // MaxText llama4: layer i is a global no-RoPE layer when (i + 1) % nope_layer_interval == 0.
      const bool global = keys.nope_interval > 0 && (index + 1) % keys.nope_interval == 0;
      return global || keys.chunk_size <= 0 ? AttentionKind::kGlobal : AttentionKind::kChunked;
    }
    case AttentionLayout::kGlobalEveryN:
      if (keys.sliding_window_size <= 0) {
        return AttentionKind::kGlobal;
      }
      return (index + 1) % pattern.period_for(keys.cycle_interval) == 0
                 ? AttentionKind::kGlobal
                 : AttentionKind::kSlidingWindow;
    case AttentionLayout::kLocalEveryN:
      if (keys.sliding_window_size <= 0) {
        return AttentionKind::kGlobal;
      }
      return index % pattern.period_for(keys.cycle_interval) == 0 ? AttentionKind::kSlidingWindow
                                                                  : AttentionKind::kGlobal;
    case AttentionLayout::kUniform:
      return keys.sliding_window_size > 0 && keys.attention_type == "local_sliding"
                 ? AttentionKind::kSlidingWindow
                 : AttentionKind::kGlobal;
  }
  return AttentionKind::kGlobal;
}

// deepseek4's attention by compress_ratio: "window_" (0, or 2 and 3, which MaxText gives no
// compressor), "csa_" (4) or "hca<ratio>_".
std::string compressed_attention_name(int64_t ratio) {
  if (ratio == kCompressedSparseRatio) {
    return "csa_";
  }
  return ratio > kCompressedSparseRatio ? "hca" + std::to_string(ratio) + "_" : "window_";
}

bool same_kind(const LayerGroup& a, const LayerGroup& b) {
  return a.attention == b.attention && a.feed_forward == b.feed_forward &&
         a.kv_shared == b.kv_shared && a.mlp_dim == b.mlp_dim &&
         a.compress_ratio == b.compress_ratio && a.hash_routing == b.hash_routing;
}

// kMaxText: numbers the runs of each kind that has more than one (their names' suffix).
void number_runs(std::vector<LayerGroup>& groups) {
  for (size_t first = 0; first < groups.size(); ++first) {
    if (groups[first].run >= 0) {
      continue;  // numbered with an earlier run of its kind
    }
    std::vector<size_t> runs;
    for (size_t other = first; other < groups.size(); ++other) {
      if (same_kind(groups[first], groups[other])) {
        runs.push_back(other);
      }
    }
    if (runs.size() > 1) {
      for (size_t index = 0; index < runs.size(); ++index) {
        groups[runs[index]].run = static_cast<int64_t>(index);
      }
    }
  }
}

}  // namespace

std::string LayerGroup::name() const {
  const std::string suffix = run >= 0 ? "_" + std::to_string(run) : "";
  if (attention == AttentionKind::kCompressed) {
    return compressed_attention_name(compress_ratio) + (hash_routing ? "hash_" : "") +
           (feed_forward == FeedForwardKind::kMoe ? "moe_layer" : "layer") + suffix;
  }
  std::string text = kv_shared ? "kv_shared_" : "";
  text += attention == AttentionKind::kSlidingWindow   ? "local_"
          : attention == AttentionKind::kChunked       ? "chunked_"
          : attention == AttentionKind::kGatedDeltaNet ? "gdn_"
                                                       : "";
  text += feed_forward == FeedForwardKind::kMoe ? "moe_layer" : "layer";
  return text + suffix;
}

std::vector<LayerGroup> plan_layers(const Config& config, LayerOrder order) {
  const ModelDims dims = ModelDims::from_config(config);
  const AttentionKeys keys = attention_keys_from_config(config);
  // gemma2's decoder layer holds a local and a global sublayer.
  const int64_t sublayers = dims.family().layers_per_decoder_layer * dims.num_layers;
  std::vector<LayerGroup> groups;
  for (int64_t index = 0; index < sublayers; ++index) {
    LayerGroup layer;
    layer.attention = attention_for_layer(keys, dims, index);
    layer.feed_forward = dims.is_moe_layer(index) ? FeedForwardKind::kMoe : FeedForwardKind::kDense;
    layer.kv_shared = dims.is_kv_shared_layer(index);
    layer.mlp_dim = dims.layer_mlp_dim(index);
    if (layer.attention == AttentionKind::kCompressed) {
      layer.compress_ratio = dims.compress_ratio(index);
    }
    layer.hash_routing = dims.is_hash_routing_layer(index);
    // kByKind: the layer joins its kind's group wherever it is; kMaxText: only the last group.
    const auto first =
        order == LayerOrder::kMaxText && !groups.empty() ? groups.end() - 1 : groups.begin();
    const auto found = std::find_if(
        first, groups.end(), [&layer](const LayerGroup& group) { return same_kind(group, layer); });
    if (found != groups.end()) {
      ++found->count;
    } else {
      layer.count = 1;
      groups.push_back(layer);
    }
  }
  if (order == LayerOrder::kMaxText) {
    number_runs(groups);
  }
  return groups;
}

LayerOrder train_layer_order(const Config& config) {
  return ModelDims::from_config(config).family().has_compressed_attention() ? LayerOrder::kMaxText
                                                                            : LayerOrder::kByKind;
}

}  // namespace tpusim
