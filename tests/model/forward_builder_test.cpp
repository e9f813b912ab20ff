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
