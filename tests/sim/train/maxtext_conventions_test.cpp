// The model tpusim trains is the model MaxText trains: every expected number below is derived by
// hand from MaxText's definitions (docs/reference/numerics.md, part C), not from tpusim's output.
//
//  (1) Initial weights: each kernel's standard deviation is variance_scaling(1, fan_in) over the
//      axes the kernel contracts, the query's divided by sqrt(head_dim) where MaxText folds the
//      attention scale into it; truncated normals never exceed 2 sigma (sigma = std / 0.8796),
//      GPT-3's attention kernels (plain normals) do; embeddings N(0, 1); norm scales 1.
//  (2) The attention's runtime scale per family, as the builder gives it to the attention op.
//  (3) Attention of a fixed 2-token example with those scales (and a soft cap): the second
//      token's softmax weights over the two keys, worked out by hand.
//  (4) qk-norm (qwen3): where the per-head query/key RMSNorm sits and what it computes.
//  (5) gemma2's soft caps and the tied logits' normalization, as the builder configures them.
//  (6) The MoE router's top-k weights per decoder block (MaxText moe.py RoutedMoE.get_topk): a
//      softmax over the chosen logits (renormalized whatever norm_topk_prob says) for mixtral, the
//      chosen probabilities renormalized only by norm_topk_prob for deepseek.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/builder/forward_builder.h"
#include "model/config.h"
#include "sim/functional/kernels.h"
#include "sim/train/trainer.h"
#include "tests/support/one_step.h"

namespace tpusim {
namespace {

struct Statistics {
  double std = 0;
  double max_abs = 0;
  int64_t count = 0;
};

// Over every layer of the parameter "<region>/<tensor>" (names "<region>/<tensor>#<layer>").
Statistics statistics(const std::map<std::string, std::vector<float>>& state,
                      const std::string& parameter) {
  double sum = 0;
  double squares = 0;
  Statistics result;
  for (const auto& [name, values] : state) {
    if (name.substr(0, name.find('#')) != parameter) {
      continue;
    }
    for (const float value : values) {
      sum += value;
      squares += static_cast<double>(value) * value;
      result.max_abs = std::max(result.max_abs, std::abs(static_cast<double>(value)));
      ++result.count;
    }
  }
  if (result.count > 0) {
    const double mean = sum / static_cast<double>(result.count);
    result.std = std::sqrt(squares / static_cast<double>(result.count) - mean * mean);
  }
  return result;
}

std::map<std::string, std::vector<float>> initial_state(const std::string& model) {
  ShardedModel sharded(Config::load("", {"model_name=" + model, "compile_topology=v5e-1",
                                         "per_device_batch_size=1", "max_target_length=16"}));
  return sharded.global_state();
}

// The std of N(0, 1) truncated to [-2, 2]: jax divides its target std by it.
constexpr double kTruncatedStd = 0.87962566103423978;

struct Expected {
  std::string parameter;
  double std;
  bool truncated;  // truncated normal (else plain normal)
};

void expect_statistics(const std::map<std::string, std::vector<float>>& state,
                       const std::vector<Expected>& expected) {
  for (const Expected& kernel : expected) {
    SCOPED_TRACE(kernel.parameter);
    const Statistics measured = statistics(state, kernel.parameter);
    ASSERT_GE(measured.count, 512);
    // The sample std of n draws is within 3/sqrt(2n) (< 10% for n >= 512) of the truth at 3 sigma.
    EXPECT_NEAR(measured.std / kernel.std, 1.0,
                3.0 / std::sqrt(2.0 * static_cast<double>(measured.count)));
    const double bound = 2.0 * kernel.std / kTruncatedStd;
    if (kernel.truncated) {
      EXPECT_LT(measured.max_abs, bound);
    } else {
      EXPECT_GT(measured.max_abs, bound);  // ~2.3% of a normal's draws lie beyond 2.27 std
    }
  }
}

// tiny-llama: embed 64, 4 query heads, 2 kv heads, head_dim 16, mlp 128.
TEST(MaxTextInit, TinyLlamaKernelStatistics) {
  const auto state = initial_state("tiny-llama");
  const double inv_sqrt_64 = 0.125;  // 1 / sqrt(64)
  expect_statistics(state, {
                               {"layer/attention/query", inv_sqrt_64 / 4.0, true},  // / sqrt(16)
                               {"layer/attention/key", inv_sqrt_64, true},          // fan-in embed
                               {"layer/attention/value", inv_sqrt_64, true},
                               {"layer/attention/out", inv_sqrt_64, true},  // fan-in 4 x 16
                               {"layer/mlp/wi_0", inv_sqrt_64, true},
                               {"layer/mlp/wi_1", inv_sqrt_64, true},
                               {"layer/mlp/wo", 1.0 / std::sqrt(128.0), true},  // fan-in mlp
                               {"head/unembedding", inv_sqrt_64, true},
                               {"embed/token_embedding", 1.0, false},  // normal(stddev=1)
                           });
  for (const char* norm :
       {"layer/pre_attention_norm/scale", "layer/pre_mlp_norm/scale", "head/final_norm/scale"}) {
    const Statistics scale = statistics(state, norm);
    EXPECT_GT(scale.count, 0) << norm;
    EXPECT_EQ(scale.std, 0.0) << norm;
    EXPECT_EQ(scale.max_abs, 1.0) << norm;
  }
}

// tiny-gpt3: GPT-3's attention scales at run time, so its query is initialized like the key;
// its attention kernels are plain normals (Gpt3MultiHeadAttention), its MLP truncated.
TEST(MaxTextInit, TinyGpt3KernelStatistics) {
  const auto state = initial_state("tiny-gpt3");
  expect_statistics(state, {
                               {"layer/attention/query", 0.125, false},
                               {"layer/attention/key", 0.125, false},
                               {"layer/attention/out", 0.125, false},
                               {"layer/mlp/wi", 0.125, true},
                               {"layer/mlp/wo", 1.0 / 16.0, true},  // fan-in mlp 256
                               {"embed/position_embedding", 1.0, false},
                           });
}

// tiny-moe: 4 experts of mlp 128. MaxText initializes the [experts, a, b] expert kernels with
// in_axis = 0 (experts), out_axis = 1, so jax's fan-in is experts x b.
TEST(MaxTextInit, TinyMoeExpertStatistics) {
  const auto state = initial_state("tiny-moe");
  expect_statistics(state, {
                               {"moe_layer/attention/query", 0.125 / 4.0, true},
                               {"moe_layer/moe/gate", 0.125, true},
                               {"moe_layer/moe/experts/wi_0", 1.0 / std::sqrt(4.0 * 128), true},
                               {"moe_layer/moe/experts/wo", 1.0 / std::sqrt(4.0 * 64), true},
                           });
}

// tiny-qwen3 (qk-norm): embed 64, 4 query / 2 kv heads of head_dim 32, mlp 128. The query is
// initialized like the key (its 1/sqrt(head_dim) is applied at run time), the out projection has
// fan-in heads x head_dim = 128, and the query and key norms' [head_dim] scales start at ones.
TEST(MaxTextInit, TinyQwen3KernelStatistics) {
  const auto state = initial_state("tiny-qwen3");
  expect_statistics(state, {
                               {"layer/attention/query", 0.125, true},  // not divided
                               {"layer/attention/key", 0.125, true},
                               {"layer/attention/out", 1.0 / std::sqrt(128.0), true},
                               {"embed/token_embedding", 1.0, false},
                           });
  for (const char* norm : {"layer/attention/query_norm/scale", "layer/attention/key_norm/scale"}) {
    const Statistics scale = statistics(state, norm);
    EXPECT_EQ(scale.count, 2 * 32) << norm;  // [head_dim] in each of the 2 layers
    EXPECT_EQ(scale.std, 0.0) << norm;
    EXPECT_EQ(scale.max_abs, 1.0) << norm;
  }
}

const Op& attention_op(const ForwardGraph& forward) {
  for (const Op& op : forward.graph.ops()) {
    if (op.kind == OpKind::kAttention) {
      return op;
    }
  }
  throw std::logic_error("no attention op");
}

Config tiny_config(std::vector<std::string> overrides) {
  overrides.emplace_back("max_target_length=16");
  return Config::load("", overrides);
}

double runtime_scale(const std::vector<std::string>& overrides) {
  return attention_op(build_forward(tiny_config(overrides), 1)).attrs.attention_scale;
}

TEST(MaxTextQueryScaling, RuntimeScalePerFamily) {
  // MaxText's default Attention: no runtime scale (it is in the query's init).
  EXPECT_EQ(runtime_scale({"model_name=tiny-llama"}), 1.0);
  EXPECT_EQ(runtime_scale({"model_name=tiny-moe"}), 1.0);
  // GPT-3: query / sqrt(head_dim 16).
  EXPECT_EQ(runtime_scale({"model_name=tiny-gpt3"}), 0.25);
  // qk-norm: head_dim^-0.5 at run time.
  EXPECT_EQ(runtime_scale({"model_name=tiny-llama", "use_qk_norm=true"}), 0.25);
  // MLA: qk_head_dim = 16 + 8, times mscale^2 with mscale = 0.1 x 1.0 x ln(40) + 1 (the base's
  // max_position_embeddings 163840 > original 4096, rope_factor 40).
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(runtime_scale({"model_name=tiny-mla"}), mscale * mscale / std::sqrt(24.0), 1e-12);
}

const Op& op_named(const Graph& graph, const std::string& name) {
  for (const Op& op : graph.ops()) {
    if (op.name == name) {
      return op;
    }
  }
  throw std::logic_error("no op " + name);
}

std::string producer_name(const Graph& graph, TensorId tensor) {
  const int producer = graph.producer(tensor);
  return producer < 0 ? "" : graph.ops().at(static_cast<size_t>(producer)).name;
}

// MaxText's Attention with use_qk_norm: projection -> RMSNorm over head_dim (own [head_dim] scale,
// epsilon normalization_layer_epsilon) -> RoPE, for the query and the key; the values are not
// normalized; q.k is scaled by head_dim^-0.5 = 1/sqrt(32) at run time.
TEST(MaxTextQkNorm, NormSitsBetweenProjectionAndRope) {
  const ForwardGraph forward = build_forward(tiny_config({"model_name=tiny-qwen3"}), 1);
  const Graph& graph = forward.graph;
  for (const std::string which : {"query", "key"}) {
    SCOPED_TRACE(which);
    const Op& norm = op_named(graph, "attention/" + which + "_norm");
    EXPECT_EQ(norm.kind, OpKind::kRmsNorm);
    EXPECT_EQ(norm.attrs.epsilon, 1e-6);
    ASSERT_EQ(norm.inputs.size(), 2u);
    EXPECT_EQ(producer_name(graph, norm.inputs[0]), "attention/" + which);  // projection
    const Tensor& scale = graph.tensor(norm.inputs[1]);
    ASSERT_EQ(scale.dims.size(), 1u);
    EXPECT_EQ(scale.dims[0].name, "head_dim");
    EXPECT_EQ(scale.dims[0].size, 32);
    EXPECT_EQ(scale.kind, TensorKind::kParameter);
    const ParameterInit& init = forward.initializers.at("layer/attention/" + which + "_norm/scale");
    EXPECT_EQ(init.distribution, InitDistribution::kConstant);
    EXPECT_EQ(init.value, 1.0);
    const Op& rope = op_named(graph, "attention/" + which + "_rope");
    EXPECT_EQ(rope.inputs[0], norm.outputs[0]);
  }
  const Op& attention = attention_op(forward);
  EXPECT_EQ(producer_name(graph, attention.inputs[2]), "attention/value");
  EXPECT_DOUBLE_EQ(attention.attrs.attention_scale, 1.0 / std::sqrt(32.0));
  // Without use_qk_norm, no norm inside the attention.
  const ForwardGraph llama = build_forward(tiny_config({"model_name=tiny-llama"}), 1);
  for (const Op& op : llama.graph.ops()) {
    EXPECT_EQ(op.name.find("attention/query_norm"), std::string::npos);
  }
}

// The norm as MaxText's RMSNorm computes it, per head: x / sqrt(mean over head_dim of x^2 + eps)
// x scale. Head 0 = (3, 4): mean square 12.5; head 1 = (1, -1): mean square 1 (eps 1e-6);
// scale (2, 0.5).
TEST(MaxTextQkNorm, EachHeadIsNormalizedOnItsOwn) {
  Graph graph;
  const int region = graph.add_region("layer", 1, Phase::kForward);
  const std::vector<Dim> dims = {Dim{"batch", 1, ""}, Dim{"length", 1, ""}, Dim{"heads", 2, ""},
                                 Dim{"head_dim", 2, ""}};
  const TensorId x = graph.add_tensor("x", dims, DType::kF32, TensorKind::kActivation, region);
  const TensorId scale = graph.add_tensor("scale", {Dim{"head_dim", 2, "norm"}}, DType::kF32,
                                          TensorKind::kParameter, region);
  const TensorId y = graph.add_tensor("y", dims, DType::kF32, TensorKind::kActivation, region);
  OpAttrs attrs;
  attrs.contracted = {"head_dim"};
  attrs.epsilon = 1e-6;
  graph.add_op(OpKind::kRmsNorm, "attention/query_norm", {x, scale}, {y}, attrs, region);
  TensorData x_data = TensorData::zeros(graph.tensor(x));
  TensorData scale_data = TensorData::zeros(graph.tensor(scale));
  x_data.values = {3, 4, 1, -1};
  scale_data.values = {2, 0.5};
  TensorData y_data = TensorData::zeros(graph.tensor(y));
  run_kernel(graph, graph.ops().back(), {&x_data, &scale_data}, {&y_data}, {});
  const double rstd0 = 1.0 / std::sqrt(12.5 + 1e-6);
  const double rstd1 = 1.0 / std::sqrt(1.0 + 1e-6);
  EXPECT_NEAR(y_data.values[0], 3 * rstd0 * 2, 1e-6);
  EXPECT_NEAR(y_data.values[1], 4 * rstd0 * 0.5, 1e-6);
  EXPECT_NEAR(y_data.values[2], 1 * rstd1 * 2, 1e-6);
  EXPECT_NEAR(y_data.values[3], -1 * rstd1 * 0.5, 1e-6);
}

TEST(MaxTextQueryScaling, QueryInitCarriesTheScaleOnlyWithoutRuntimeScaling) {
  const auto query_std = [](const std::vector<std::string>& overrides) {
    return build_forward(tiny_config(overrides), 1).initializers.at("layer/attention/query").stddev;
  };
  EXPECT_DOUBLE_EQ(query_std({"model_name=tiny-llama"}), 0.125 / 4.0);
  EXPECT_DOUBLE_EQ(query_std({"model_name=tiny-llama", "use_qk_norm=true"}), 0.125);
  EXPECT_DOUBLE_EQ(query_std({"model_name=tiny-gpt3"}), 0.125);
  EXPECT_DOUBLE_EQ(query_std({"model_name=tiny-qwen3"}), 0.125);
}

// Token 1 attends to keys 0 and 1 with q1 = (1, 2), k0 = (1, 0), k1 = (0, 1): q.k = (1, 2).
// With v0 = (1, 0), v1 = (0, 1) its output is its softmax weights (p0, p1), p0 = 1 / (1 + e^s)
// for runtime scale s. Token 0 sees only itself: output v0.
std::vector<float> two_token_attention(double scale, double soft_cap = 0) {
  Graph graph;
  const int region = graph.add_region("layer", 1, Phase::kForward);
  const auto tensor = [&](const std::string& name) {
    return graph.add_tensor(
        name,
        {Dim{"batch", 1, ""}, Dim{"length", 2, ""}, Dim{"heads", 1, ""}, Dim{"head_dim", 2, ""}},
        DType::kF32, TensorKind::kActivation, region);
  };
  const TensorId q = tensor("q");
  const TensorId k = tensor("k");
  const TensorId v = tensor("v");
  const TensorId out = tensor("out");
  OpAttrs attrs;
  attrs.attention_scale = scale;
  attrs.logit_soft_cap = soft_cap;
  graph.add_op(OpKind::kAttention, "attention", {q, k, v}, {out}, attrs, region);
  TensorData q_data = TensorData::zeros(graph.tensor(q));
  TensorData k_data = TensorData::zeros(graph.tensor(k));
  TensorData v_data = TensorData::zeros(graph.tensor(v));
  q_data.values = {1, 0, 1, 2};  // q0 (unused by token 1), q1
  k_data.values = {1, 0, 0, 1};
  v_data.values = {1, 0, 0, 1};
  TensorData out_data = TensorData::zeros(graph.tensor(out));
  run_kernel(graph, graph.ops().back(), {&q_data, &k_data, &v_data}, {&out_data}, {});
  return out_data.values;
}

TEST(MaxTextQueryScaling, TwoTokenAttentionLogits) {
  // tiny-llama (scale 1): p0 = 1 / (1 + e) = 0.2689414213699951.
  const std::vector<float> llama = two_token_attention(runtime_scale({"model_name=tiny-llama"}));
  EXPECT_NEAR(llama[0], 1.0, 1e-7);
  EXPECT_NEAR(llama[2], 0.2689414213699951, 1e-7);
  EXPECT_NEAR(llama[3], 0.7310585786300049, 1e-7);
  // tiny-gpt3 (scale 1/4): p0 = 1 / (1 + e^0.25) = 0.43782349911420193.
  const std::vector<float> gpt3 = two_token_attention(runtime_scale({"model_name=tiny-gpt3"}));
  EXPECT_NEAR(gpt3[2], 0.43782349911420193, 1e-7);
  EXPECT_NEAR(gpt3[3], 0.56217650088579807, 1e-7);
  // attn_logits_soft_cap 1 (scale 1): logits (1, 2) -> (tanh 1, tanh 2) = (0.7616, 0.9640), so
  // p0 = 1 / (1 + e^(tanh 2 - tanh 1)) = 0.44956376321847996.
  const std::vector<float> capped = two_token_attention(1.0, 1.0);
  EXPECT_NEAR(capped[2], 0.44956376321847996, 1e-7);
  EXPECT_NEAR(capped[3], 0.55043623678152004, 1e-7);
}

// gemma2-2b as MaxText configures it: attention logits capped at 50 after the query scaling
// head_dim^-0.5 = 1/16; tied logits divided by sqrt(emb_dim 2304) = 48 (normalize_embedding_logits,
// MaxText's default) and then capped at 30, both applied by the loss as it reads the logits.
TEST(MaxTextSoftCaps, Gemma2AttentionAndTiedLogits) {
  const ForwardGraph forward = build_forward(tiny_config({"model_name=gemma2-2b"}), 1);
  const Op& attention = attention_op(forward);
  EXPECT_EQ(attention.attrs.logit_soft_cap, 50.0);
  EXPECT_EQ(attention.attrs.attention_scale, 1.0 / 16.0);
  const Op& loss = op_named(forward.graph, "cross_entropy");
  EXPECT_EQ(loss.attrs.logit_soft_cap, 30.0);
  EXPECT_DOUBLE_EQ(loss.attrs.logit_multiplier, 1.0 / 48.0);
  EXPECT_EQ(producer_name(forward.graph, loss.inputs[0]), "logits");
  // Untied logits (tiny-llama) and tied ones neither divided nor capped (tiny-qwen3): untouched.
  for (const char* model : {"model_name=tiny-llama", "model_name=tiny-qwen3"}) {
    const ForwardGraph other = build_forward(tiny_config({model}), 1);
    const Op& other_loss = op_named(other.graph, "cross_entropy");
    EXPECT_EQ(other_loss.attrs.logit_soft_cap, 0.0) << model;
    EXPECT_EQ(other_loss.attrs.logit_multiplier, 1.0) << model;
    EXPECT_EQ(attention_op(other).attrs.logit_soft_cap, 0.0) << model;
  }
  // A final cap on untied logits, as MaxText's logits_dense branch: not applied.
  const ForwardGraph untied = build_forward(
      tiny_config({"model_name=tiny-llama", "final_logits_soft_cap=30", "attn_logits_soft_cap=20"}),
      1);
  EXPECT_EQ(op_named(untied.graph, "cross_entropy").attrs.logit_soft_cap, 0.0);
  EXPECT_EQ(attention_op(untied).attrs.logit_soft_cap, 20.0);
}

// (6) One step on one device with norm_topk_prob false and true: mixtral's router renormalizes
// either way, so the two steps are the same step bit for bit; deepseek's does so only with the
// key, so its two steps differ.
testing::OneStep router_step(const std::string& model, const std::string& norm_topk_prob) {
  return testing::run_one_step(
      Config::load("", {"model_name=" + model, "max_target_length=16", "dataset_type=synthetic",
                        "functional_precision=reference", "compile_topology=v5e-1",
                        "per_device_batch_size=2", "norm_topk_prob=" + norm_topk_prob}));
}

TEST(MaxTextRouter, TopKWeightsFollowTheDecoderBlock) {
  const testing::OneStep mixtral_keyed_off = router_step("tiny-moe", "false");
  const testing::OneStep mixtral_keyed_on = router_step("tiny-moe", "true");
  EXPECT_EQ(mixtral_keyed_off.loss, mixtral_keyed_on.loss);
  EXPECT_EQ(
      testing::worst_relative_difference(mixtral_keyed_off.gradients, mixtral_keyed_on.gradients),
      0.0);
  const testing::OneStep deepseek_keyed_off = router_step("tiny-mla", "false");
  const testing::OneStep deepseek_keyed_on = router_step("tiny-mla", "true");
  EXPECT_GT(
      testing::worst_relative_difference(deepseek_keyed_off.gradients, deepseek_keyed_on.gradients),
      1e-3);
}

}  // namespace
}  // namespace tpusim
