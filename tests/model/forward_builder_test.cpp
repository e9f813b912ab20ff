#include "model/builder/forward_builder.h"

#include <gtest/gtest.h>

#include <set>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "model/ir/op_flops.h"

namespace tpusim {
namespace {

// Forward matmul FLOPs of the graph, each region weighted by its repeat count.
double forward_matmul_flops(const ForwardGraph& forward) {
  double total = 0;
  for (const Op& op : forward.graph.ops()) {
    if (!counted_by_maxtext(op)) {
      continue;  // use_iota_embed's one-hot lookup (the gpt3 presets set it)
    }
    total += static_cast<double>(forward.graph.region(op.region).repeat) *
             op_flops(forward.graph, op).matmul;
  }
  return total;
}

// The graph's forward matmuls x 3 (forward + 2x backward) must equal MaxText's
// calculate_tflops_training_per_device for every preset: the builder and the formula are written
// independently, so agreement checks both.
TEST(ForwardBuilder, MatmulFlopsEqualMaxTextConventionForEveryPreset) {
  for (const std::string& name : available_model_presets("")) {
    for (const int64_t batch : {1, 3}) {
      SCOPED_TRACE(name + " batch " + std::to_string(batch));
      const Config config = Config::load(
          "", {"model_name=" + name, "per_device_batch_size=" + std::to_string(batch) + ".0",
               "max_target_length=512", "override_model_config=true"});
      const ForwardGraph forward = build_forward(config, batch);
      // gemma4_small's kv-shared layers project keys and values that MaxText reuses.
      const MaxTextFlops maxtext = maxtext_training_flops_per_device(config);
      const double expected =
          (maxtext.total_tflops() + maxtext.kv_shared_projection_tflops()) * 1e12;
      EXPECT_NEAR(3.0 * forward_matmul_flops(forward) / expected, 1.0, 1e-9);
    }
  }
}

// Every op reads tensors that exist before it: parameters, inputs, the region's carry input, or
// outputs of earlier ops of the same region.
TEST(ForwardBuilder, GraphIsWellFormed) {
  for (const char* name : {"tiny-llama", "tiny-gpt3", "tiny-moe", "tiny-mla", "gemma2-2b",
                           "deepseek3-671b", "gpt-oss-20b"}) {
    SCOPED_TRACE(name);
    const Config config = Config::load("", {std::string("model_name=") + name,
                                            "per_device_batch_size=2.0", "max_target_length=256"});
    const ForwardGraph forward = build_forward(config, 2);
    const Graph& graph = forward.graph;
    std::set<TensorId> available;
    for (const Tensor& tensor : graph.tensors()) {
      if (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kInput ||
          graph.producer(tensor.id) < 0) {
        available.insert(tensor.id);
      }
    }
    for (const Op& op : graph.ops()) {
      for (const TensorId input : op.inputs) {
        EXPECT_TRUE(available.contains(input)) << op.name << " reads " << graph.tensor(input).name;
      }
      for (const TensorId output : op.outputs) {
        available.insert(output);
      }
    }
    EXPECT_GE(forward.loss, 0);
    EXPECT_EQ(forward.layer_inputs.size(), forward.layer_regions.size());
  }
}

TEST(ForwardBuilder, LayerPlansFollowDecoderBlocks) {
  auto groups_of = [](const std::string& name) {
    return plan_layers(Config::load("", {"model_name=" + name}));
  };
  const auto deepseek = groups_of("deepseek2-16b");
  ASSERT_EQ(deepseek.size(), 2u);
  EXPECT_EQ(deepseek[0].feed_forward, FeedForwardKind::kDense);
  EXPECT_EQ(deepseek[0].count, 1);
  EXPECT_EQ(deepseek[1].feed_forward, FeedForwardKind::kMoe);
  EXPECT_EQ(deepseek[1].count, 26);
  EXPECT_EQ(deepseek[1].attention, AttentionKind::kMla);
  const auto gemma2 = groups_of("gemma2-9b");  // 21 layers of local + global sublayers
  ASSERT_EQ(gemma2.size(), 2u);
  EXPECT_EQ(gemma2[0].count + gemma2[1].count, 42);
  const auto llama = groups_of("llama3.1-405b");
  ASSERT_EQ(llama.size(), 1u);
  EXPECT_EQ(llama[0].count, 126);
}

// OLMo 3: three sliding-window layers then a global one, normalized after attention and MLP
// only. MaxText's count names only gemma and gpt-oss windows, so it counts olmo3's attention as
// global: equal to the program up to the 4096-token window; at 8192 tokens it is larger by, per
// windowed layer and by hand, 3 x (2 S^2 - 4 (S W - W^2 / 2)) H h (B = 1, H h = 32 x 128).
TEST(ForwardBuilder, Olmo3LayersAndNorms) {
  const auto groups = plan_layers(Config::load("", {"model_name=olmo3-7b"}));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].attention, AttentionKind::kSlidingWindow);
  EXPECT_EQ(groups[0].count, 24);
  EXPECT_EQ(groups[1].attention, AttentionKind::kGlobal);
  EXPECT_EQ(groups[1].count, 8);
  const auto config_at = [](int64_t length) {
    return Config::load("", {"model_name=olmo3-7b", "per_device_batch_size=1.0",
                             "max_target_length=" + std::to_string(length)});
  };
  const ForwardGraph forward = build_forward(config_at(8192), 1);
  std::set<std::string> norms;
  for (const Op& op : forward.graph.ops()) {
    if (op.kind == OpKind::kRmsNorm && forward.graph.region(op.region).name != "head") {
      norms.insert(op.name);
    }
  }
  EXPECT_FALSE(norms.contains("pre_attention_norm"));
  EXPECT_FALSE(norms.contains("pre_mlp_norm"));
  EXPECT_TRUE(norms.contains("post_attention_norm"));
  EXPECT_TRUE(norms.contains("post_mlp_norm"));
  EXPECT_NEAR(3.0 * forward_matmul_flops(build_forward(config_at(4096), 1)) /
                  (maxtext_training_flops_per_device(config_at(4096)).total_tflops() * 1e12),
              1.0, 1e-9);
  const double length = 8192;
  const double window = 4096;
  const double per_layer =
      3.0 * (2 * length * length - 4 * (length * window - window * window / 2)) * 32 * 128;
  const double counted = maxtext_training_flops_per_device(config_at(8192)).total_tflops() * 1e12;
  EXPECT_NEAR((counted - 3.0 * forward_matmul_flops(forward)) / (24 * per_layer), 1.0, 1e-9);
}

TEST(ForwardBuilder, SizeDoesNotGrowWithLayerCount) {
  const auto ops_for = [](int layers) {
    const Config config = Config::load("", {"model_name=tiny-llama", "override_model_config=true",
                                            "base_num_decoder_layers=" + std::to_string(layers)});
    return build_forward(config, 1).graph.ops().size();
  };
  EXPECT_EQ(ops_for(2), ops_for(200));
}

}  // namespace
}  // namespace tpusim
