// The qwen3_next / qwen3_5 decoder (model/builder/gated_delta_net.cpp):
// its layer cycle, its size against the model card, and its FLOPs, the graph's matmuls against the
// derived count of model/flops_maxtext.cpp, both against numbers worked out by hand here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "model/builder/forward_builder.h"
#include "model/builder/layer_plan.h"
#include "model/config.h"
#include "model/flops_maxtext.h"
#include "model/ir/op_flops.h"

namespace tpusim {
namespace {

Config qwen3_next(const std::vector<std::string>& extra = {}, int64_t length = 4096) {
  std::vector<std::string> overrides = {"model_name=qwen3-next-80b-a3b", "per_device_batch_size=1",
                                        "max_target_length=" + std::to_string(length)};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return Config::load("", overrides);
}

// Three Gated DeltaNet layers, then one full-attention layer (inhomogeneous_layer_cycle_interval
// = 4 in MaxText's presets; Hugging Face Qwen3NextConfig.layer_types), every layer MoE.
TEST(GatedDeltaNet, LayerCycleOfThePresets) {
  struct Case {
    const char* preset;
    int64_t gdn_layers;   // 3/4 of base_num_decoder_layers
    int64_t full_layers;  // 1/4
  };
  for (const Case& test : {Case{"qwen3-next-80b-a3b", 36, 12}, Case{"qwen3.5-35b-a3b", 30, 10},
                           Case{"qwen3.5-397b-a17b", 45, 15}}) {
    SCOPED_TRACE(test.preset);
    const auto groups = plan_layers(Config::load("", {std::string("model_name=") + test.preset}));
    ASSERT_EQ(groups.size(), 2U);
    EXPECT_EQ(groups[0].attention, AttentionKind::kGatedDeltaNet);
    EXPECT_EQ(groups[0].feed_forward, FeedForwardKind::kMoe);
    EXPECT_EQ(groups[0].count, test.gdn_layers);
    EXPECT_EQ(groups[0].name(), "gdn_moe_layer");
    EXPECT_EQ(groups[1].attention, AttentionKind::kGlobal);
    EXPECT_EQ(groups[1].feed_forward, FeedForwardKind::kMoe);
    EXPECT_EQ(groups[1].count, test.full_layers);
  }
}

// The model card of Qwen3-Next-80B-A3B: 80B parameters in total. By hand: embedding and
// unembedding 2 x 151936 x 2048; per layer 512 experts + 1 shared of 3 x 2048 x 512, the router
// 2048 x 512 and the shared gate 2048; 36 GDN layers of 2048 x (2.16.128 + 2.32.128 + 2.32) +
// 32.128 x 2048; 12 attention layers of 2048 x (2.16.256 + 2.2.256) + 16.256 x 2048: 79.67B
// (plus norm scales, dt_bias).
TEST(GatedDeltaNet, ParameterCountIsTheModelCards) {
  const ForwardGraph forward = build_forward(qwen3_next(), 1);
  double parameters = 0;
  for (const Tensor& tensor : forward.graph.tensors()) {
    if (tensor.kind == TensorKind::kParameter) {
      parameters += static_cast<double>(forward.graph.region(tensor.region).repeat) *
                    static_cast<double>(tensor.num_elements());
    }
  }
  EXPECT_NEAR(parameters / 1e9, 79.67, 0.01);
}

// Forward matmul FLOPs of the ops of `region` whose names start with `prefix`, per layer.
double region_matmul_flops(const ForwardGraph& forward, const std::string& region,
                           const std::string& prefix) {
  double total = 0;
  for (const Op& op : forward.graph.ops()) {
    if (forward.graph.region(op.region).name == region && op.name.starts_with(prefix)) {
      total += op_flops(forward.graph, op).matmul;
    }
  }
  return total;
}

// B = 1, S = T = 4096, D = 2048, Hk = 16, Hv = 32, dk = dv = 128, C = 64, H = 16, K = 2,
// h = 256, worked out by hand from the formulas of docs/reference/maxtext.md §2a:
//   GDN projections 2.T.D.(2.Hk.dk + 2.Hv.dv + 2.Hv) + 2.T.Hv.dv.D
//     = 16777216 x 12352 + 68719476736 = 275951648768
//   GDN core T.Hv.(2.C.(3.dk + 2.dv) + 6.dk.dv) = 131072 x (81920 + 98304) = 23622320128
//   gated attention's projections 2.T.D.(2.H + 2.K).h = 16777216 x 9216 = 154618822656
//   the shared expert's gate 2.T.D = 16777216
TEST(GatedDeltaNet, FlopsOfOneLayerByHand) {
  const Config config = qwen3_next();
  const MaxTextForwardFlops counted = maxtext_training_flops_per_device(config).forward;
  EXPECT_EQ(counted.num_gated_delta_net_layers, 36);
  EXPECT_EQ(counted.num_global_attention_layers, 12);
  EXPECT_DOUBLE_EQ(counted.gated_delta_net_projections, 275951648768.0);
  EXPECT_DOUBLE_EQ(counted.gated_delta_net_core, 23622320128.0);
  EXPECT_DOUBLE_EQ(counted.global_qkv, 154618822656.0);
  EXPECT_DOUBLE_EQ(counted.shared_expert_gate, 16777216.0);
  // The graph executes exactly these matmuls in each kind of layer.
  const ForwardGraph forward = build_forward(config, 1);
  EXPECT_DOUBLE_EQ(region_matmul_flops(forward, "gdn_moe_layer", "gdn/"),
                   275951648768.0 + 23622320128.0);
  EXPECT_DOUBLE_EQ(region_matmul_flops(forward, "moe_layer", "moe/shared_gate"), 16777216.0);
  // The projections (attention/query, .../gate, .../out, ...) and the attention op itself.
  EXPECT_DOUBLE_EQ(region_matmul_flops(forward, "moe_layer", "attention"),
                   counted.global_qkv + counted.out_proj + counted.global_attention);
}

TEST(GatedDeltaNet, ChunkMustDivideTheSequence) {
  try {
    qwen3_next({}, 4000);
    ADD_FAILURE() << "a sequence of partial chunks loaded";
  } catch (const UserError& error) {
    EXPECT_EQ(error.key(), "gdn_chunk_size");
    EXPECT_NE(std::string(error.what()).find("must divide max_target_length (4000)"),
              std::string::npos)
        << error.what();
  }
  try {
    qwen3_next({"override_model_config=true", "gdn_num_key_heads=12"});
    ADD_FAILURE() << "value heads in unequal groups loaded";
  } catch (const UserError& error) {
    EXPECT_EQ(error.key(), "gdn_num_key_heads");
  }
}

}  // namespace
}  // namespace tpusim
