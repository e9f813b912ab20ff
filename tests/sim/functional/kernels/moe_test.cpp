// tests/sim/functional/kernels/moe_test.cpp: the moe kernels
// (sim/functional/kernels/moe.cpp). MoE router, dispatch and combine (with capacity and dropless),
// grouped matmuls. The method and the helpers: kernel_test_support.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

constexpr int64_t kExperts = 3;
constexpr int64_t kTopK = 2;
constexpr int64_t kCapacity = 3;  // 12 token-choices into 3 x 3 slots: some are dropped

std::vector<Dim> routing_dims() {
  return {dim("batch", 2), dim("length", 3), dim("top_k", kTopK), dim("route", 2)};
}
std::vector<Dim> grouped_dims() {
  return {dim("experts", kExperts), dim("expert_tokens", kCapacity), dim("embed", 4)};
}

// Router logits with well-separated values (no top-k switch under finite-difference steps).
TensorData separated_logits(const Tensor& tensor, std::mt19937& rng) {
  TensorData data = TensorData::zeros(tensor);
  const int64_t experts = tensor.dims.back().size;
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  for (int64_t t = 0; t < data.size() / experts; ++t) {
    std::vector<int> order(static_cast<size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t e = 0; e < experts; ++e) {
      data.values[static_cast<size_t>(t * experts + e)] =
          0.6f * static_cast<float>(order[static_cast<size_t>(e)]) + noise(rng);
    }
  }
  return data;
}

// Two distinct experts per token, random weights in (0.1, 1).
TensorData random_routing(const Tensor& tensor, std::mt19937& rng) {
  TensorData data = TensorData::zeros(tensor);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int64_t t = 0; t < 6; ++t) {
    std::vector<int> order(static_cast<size_t>(kExperts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      data.values[static_cast<size_t>((t * kTopK + choice) * 2)] =
          static_cast<float>(order[static_cast<size_t>(choice)]);
      data.values[static_cast<size_t>((t * kTopK + choice) * 2 + 1)] = weight(rng);
    }
  }
  return data;
}

// (expert, slot or -1) of each token-choice, by the documented first-come rule.
std::vector<std::pair<int64_t, int64_t>> reference_slots(const TensorData& routing) {
  std::vector<int64_t> used(kExperts, 0);
  std::vector<std::pair<int64_t, int64_t>> slots;
  for (int64_t choice = 0; choice < 6 * kTopK; ++choice) {
    const auto expert = static_cast<int64_t>(routing.values[static_cast<size_t>(choice * 2)]);
    int64_t& count = used[static_cast<size_t>(expert)];
    slots.emplace_back(expert, count < kCapacity ? count++ : -1);
  }
  return slots;
}

TEST(KernelMoe, RouterPicksTopKOfSoftmax) {
  std::mt19937 rng(19);
  Case c;
  const TensorId logits =
      c.tensor("logits", {dim("batch", 2), dim("length", 3), dim("experts", 4)});
  const TensorId routing = c.tensor("routing", routing_dims());
  OpAttrs attrs;
  attrs.top_k = kTopK;
  const Op& op = c.op(OpKind::kMoeRouter, {logits}, {routing}, attrs);
  TensorData values = random_data(c.info(logits), rng, -2, 2);
  values.values[0] = values.values[1] = 5;  // a tie: the lower index comes first
  const TensorData result = run(c.graph, op, {values})[0];
  for (int64_t t = 0; t < 6; ++t) {
    std::vector<double> p(4);
    double sum = 0;
    for (int64_t e = 0; e < 4; ++e) {
      p[static_cast<size_t>(e)] = std::exp(double{values.values[static_cast<size_t>(t * 4 + e)]});
      sum += p[static_cast<size_t>(e)];
    }
    std::vector<int64_t> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)];
    });
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      const int64_t expert = order[static_cast<size_t>(choice)];
      EXPECT_EQ(result.values[static_cast<size_t>((t * kTopK + choice) * 2)],
                static_cast<float>(expert));
      EXPECT_NEAR(result.values[static_cast<size_t>((t * kTopK + choice) * 2 + 1)],
                  p[static_cast<size_t>(expert)] / sum, 1e-6);
    }
  }
  EXPECT_EQ(result.values[0], 0.0f);
  EXPECT_EQ(result.values[2], 1.0f);
}

// The router's logits, routing and their gradients: [batch 2, length 3, experts 4] -> top-k.
struct RouterGraph {
  Case c;
  std::vector<Dim> logit_dims = {dim("batch", 2), dim("length", 3), dim("experts", 4)};
  TensorId logits = c.tensor("logits", logit_dims);
  TensorId routing = c.tensor("routing", routing_dims());
  TensorId d_routing = c.tensor("d_routing", routing_dims());
  TensorId d_logits = c.tensor("d_logits", logit_dims);
};

// Logits that rank the experts 0, 1, 2, 3 for every token (each token 0.1 higher than the last).
TensorData ranked_logits(RouterGraph& g) {
  TensorData logits = TensorData::zeros(g.c.info(g.logits));
  constexpr std::array<float, 4> kLogits = {2.0f, 1.5f, 1.0f, 0.0f};
  for (int64_t t = 0; t < 6; ++t) {
    for (int64_t e = 0; e < 4; ++e) {
      logits.values[static_cast<size_t>(t * 4 + e)] =
          kLogits[static_cast<size_t>(e)] + 0.1f * static_cast<float>(t);
    }
  }
  return logits;
}

// A selection bias that puts expert 2 ahead of expert 1 (logits + bias: 2, 0.5, 1.6, 0 + 0.1 t).
TensorData lifting_bias(RouterGraph& g, TensorId bias) {
  TensorData values = TensorData::zeros(g.c.info(bias));
  values.values = {0.0f, -1.0f, 0.6f, 0.0f};
  return values;
}

// The plain router, and with norm_topk_prob and routed_scaling_factor (the chosen probabilities
// over their sum, times the scale): the gradient matches finite differences.
TEST(KernelMoe, RouterGradientMatchesFiniteDifferences) {
  for (const bool normalized : {false, true}) {
    SCOPED_TRACE(normalized ? "normalized, scaled" : "plain");
    std::mt19937 rng(20);
    RouterGraph g;
    OpAttrs attrs;
    attrs.top_k = kTopK;
    attrs.normalize_top_k = normalized;
    attrs.route_scale = normalized ? 2.5 : 1.0;
    g.c.op(OpKind::kMoeRouter, {g.logits}, {g.routing}, attrs);
    g.c.op(OpKind::kRouterGrad, {g.d_routing, g.logits}, {g.d_logits}, attrs, true);
    const Op& forward = g.c.graph.ops()[0];
    const Op& grad = g.c.graph.ops()[1];
    const std::vector<TensorData> inputs = {separated_logits(g.c.info(g.logits), rng)};
    const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
    expect_fd("router d_logits", g.c.graph, forward, inputs, weights, 0,
              run(g.c.graph, grad, {weights[0], inputs[0]})[0]);
  }
}

// norm_topk_prob and routed_scaling_factor: each token's weights are 2.5 x its chosen
// probabilities over their sum, so they add up to 2.5.
TEST(KernelMoe, RouterRenormalizesAndScalesTheTopK) {
  std::mt19937 rng(21);
  RouterGraph g;
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  attrs.route_scale = 2.5;
  const Op& forward = g.c.op(OpKind::kMoeRouter, {g.logits}, {g.routing}, attrs);
  const std::vector<TensorData> inputs = {separated_logits(g.c.info(g.logits), rng)};
  const TensorData result = run(g.c.graph, forward, inputs)[0];
  for (int64_t t = 0; t < 6; ++t) {
    std::vector<double> p(4);
    double sum = 0;
    for (int64_t e = 0; e < 4; ++e) {
      p[static_cast<size_t>(e)] =
          std::exp(double{inputs[0].values[static_cast<size_t>(t * 4 + e)]});
      sum += p[static_cast<size_t>(e)];
    }
    auto chosen = [&](int64_t choice) {
      return static_cast<size_t>(result.values[static_cast<size_t>((t * kTopK + choice) * 2)]);
    };
    double top_sum = 0;
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      top_sum += p[chosen(choice)] / sum;
    }
    double weights = 0;
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      const double weight = result.values[static_cast<size_t>((t * kTopK + choice) * 2 + 1)];
      EXPECT_NEAR(weight, 2.5 * (p[chosen(choice)] / sum) / top_sum, 1e-6);
      weights += weight;
    }
    EXPECT_NEAR(weights, 2.5, 1e-5);
  }
}

// DeepSeek-V4's sqrtsoftplus scores (MaxText routed_score_func, GateLogit then get_topk's softmax
// over the chosen scores): the top-k of s = sqrt(log(1 + e^l)) and weights e^s_c / sum over the
// chosen of e^s, here worked in the test from the logits.
TEST(KernelMoe, RouterSqrtSoftplusScoresPickAndWeightTheTopK) {
  std::mt19937 rng(22);
  RouterGraph g;
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  attrs.sqrt_softplus_scores = true;
  const Op& forward = g.c.op(OpKind::kMoeRouter, {g.logits}, {g.routing}, attrs);
  const TensorData logits = random_data(g.c.info(g.logits), rng, -3, 3);
  const TensorData result = run(g.c.graph, forward, {logits})[0];
  for (int64_t t = 0; t < 6; ++t) {
    std::vector<double> score(4);
    for (int64_t e = 0; e < 4; ++e) {
      score[static_cast<size_t>(e)] = std::sqrt(
          std::log(1.0 + std::exp(double{logits.values[static_cast<size_t>(t * 4 + e)]})));
    }
    std::vector<size_t> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return score[a] > score[b]; });
    const double chosen_sum = std::exp(score[order[0]]) + std::exp(score[order[1]]);
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      const size_t expert = order[static_cast<size_t>(choice)];
      EXPECT_EQ(result.values[static_cast<size_t>((t * kTopK + choice) * 2)],
                static_cast<float>(expert));
      EXPECT_NEAR(result.values[static_cast<size_t>((t * kTopK + choice) * 2 + 1)],
                  std::exp(score[expert]) / chosen_sum, 1e-6);
    }
  }
}

// The sqrtsoftplus router's gradient (through the softmax over the chosen scores, then
// d score / d logit = sigmoid(l) / (2 score)) matches finite differences, at logits of both signs.
TEST(KernelMoe, RouterSqrtSoftplusGradientMatchesFiniteDifferences) {
  std::mt19937 rng(23);
  RouterGraph g;
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  attrs.sqrt_softplus_scores = true;
  g.c.op(OpKind::kMoeRouter, {g.logits}, {g.routing}, attrs);
  g.c.op(OpKind::kRouterGrad, {g.d_routing, g.logits}, {g.d_logits}, attrs, true);
  const Op& forward = g.c.graph.ops()[0];
  const Op& grad = g.c.graph.ops()[1];
  TensorData logits = separated_logits(g.c.info(g.logits), rng);
  for (float& value : logits.values) {
    value = 2.0f * value - 1.8f;  // in [-1.9, 1.9], 1.2 apart within a token
  }
  const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
  expect_fd("sqrtsoftplus router d_logits", g.c.graph, forward, {logits}, weights, 0,
            run(g.c.graph, grad, {weights[0], logits})[0]);
}

// routed_bias (MaxText's GateLogit bias, deepseek_routing): the experts are the top-k of
// score + bias, their weights a softmax over the scores alone. Logits (2, 1.5, 1, 0) + 0.1 t with
// bias (0, -1, 0.6, 0) rank (2, 0.5, 1.6, 0): experts 0 and 2 (without the bias 0 and 1), weighted
// e^2 / (e^2 + e^1) = 0.731 and e^1 / (e^2 + e^1) = 0.269 (the pre-bias logits 2 and 1).
TEST(KernelMoe, RouterBiasPicksTheExpertsButDoesNotWeightThem) {
  RouterGraph g;
  const TensorId bias = g.c.tensor("bias", {dim("experts", 4)});
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  const Op& forward = g.c.op(OpKind::kMoeRouter, {g.logits, bias}, {g.routing}, attrs);
  const TensorData logits = ranked_logits(g);
  const TensorData bias_values = lifting_bias(g, bias);
  const TensorData result = run(g.c.graph, forward, {logits, bias_values})[0];
  const double first = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));
  for (int64_t t = 0; t < 6; ++t) {
    const auto at = [&](int64_t choice, int64_t channel) {
      return result.values[static_cast<size_t>((t * kTopK + choice) * 2 + channel)];
    };
    EXPECT_EQ(at(0, 0), 0.0f);
    EXPECT_EQ(at(1, 0), 2.0f);
    EXPECT_NEAR(at(0, 1), first, 1e-6);
    EXPECT_NEAR(at(1, 1), 1.0 - first, 1e-6);
  }
}

// With a bias, the logits' gradient (renormalized top-k) matches finite differences, and the bias
// gets exactly 0. Each token ranks its experts 0..3 apart by 1 in a shuffled order; the bias
// (0.75, -0.75, 0.15, -0.45) keeps every biased gap >= 0.1 (no tie within the 1e-2 steps) and
// changes some tokens' experts (counted below, so the bias is seen).
TEST(KernelMoe, RouterBiasGradientMatchesFiniteDifferences) {
  std::mt19937 rng(24);
  RouterGraph g;
  const TensorId bias = g.c.tensor("bias", {dim("experts", 4)});
  const TensorId d_bias = g.c.tensor("d_bias", {dim("experts", 4)});
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  g.c.op(OpKind::kMoeRouter, {g.logits, bias}, {g.routing}, attrs);
  g.c.op(OpKind::kRouterGrad, {g.d_routing, g.logits, bias}, {g.d_logits, d_bias}, attrs, true);
  const Op& forward = g.c.graph.ops()[0];
  const Op& grad = g.c.graph.ops()[1];
  TensorData logits = TensorData::zeros(g.c.info(g.logits));
  for (int64_t t = 0; t < 6; ++t) {
    std::array<int, 4> order = {0, 1, 2, 3};
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t e = 0; e < 4; ++e) {
      logits.values[static_cast<size_t>(t * 4 + e)] =
          static_cast<float>(order[static_cast<size_t>(e)]) + 0.01f * static_cast<float>(t);
    }
  }
  TensorData bias_values = TensorData::zeros(g.c.info(bias));
  const TensorData unbiased = run(g.c.graph, forward, {logits, bias_values})[0];
  bias_values.values = {0.75f, -0.75f, 0.15f, -0.45f};
  const TensorData biased = run(g.c.graph, forward, {logits, bias_values})[0];
  int changed = 0;
  for (size_t at = 0; at < biased.values.size(); at += 2) {
    changed += biased.values[at] != unbiased.values[at] ? 1 : 0;
  }
  EXPECT_GT(changed, 0);
  const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
  const std::vector<TensorData> grads = run(g.c.graph, grad, {weights[0], logits, bias_values});
  expect_fd("biased router d_logits", g.c.graph, forward, {logits, bias_values}, weights, 0,
            grads[0]);
  EXPECT_EQ(grads[1].values, std::vector<float>(4, 0.0f));
}

// With routed_bias_update_rate the biased router's VJP has a third output, the choices of each
// expert over its tokens (the loads the bias's update reads). The logits and bias of
// RouterBiasPicksTheExpertsButDoesNotWeightThem make all 6 tokens pick experts 0 and 2 (without the
// bias: 0 and 1), so the loads are (6, 0, 6, 0), and its other outputs are those without it.
TEST(KernelMoe, RouterGradCountsTheBiasedChoicesOfEachExpert) {
  std::mt19937 rng(25);
  RouterGraph g;
  const TensorId bias = g.c.tensor("bias", {dim("experts", 4)});
  const TensorId d_bias = g.c.tensor("d_bias", {dim("experts", 4)});
  const TensorId load = g.c.tensor("load", {dim("experts", 4)});
  const TensorId d_logits_with = g.c.tensor("d_logits_with", g.logit_dims);
  const TensorId d_bias_with = g.c.tensor("d_bias_with", {dim("experts", 4)});
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  g.c.op(OpKind::kMoeRouter, {g.logits, bias}, {g.routing}, attrs);
  g.c.op(OpKind::kRouterGrad, {g.d_routing, g.logits, bias}, {g.d_logits, d_bias}, attrs, true);
  g.c.op(OpKind::kRouterGrad, {g.d_routing, g.logits, bias}, {d_logits_with, d_bias_with, load},
         attrs, true);
  const TensorData logits = ranked_logits(g);
  const TensorData bias_values = lifting_bias(g, bias);
  const std::vector<TensorData> weights = random_weights(g.c.graph, g.c.graph.ops()[0], rng);
  const std::vector<TensorData> without =
      run(g.c.graph, g.c.graph.ops()[1], {weights[0], logits, bias_values});
  const std::vector<TensorData> with =
      run(g.c.graph, g.c.graph.ops()[2], {weights[0], logits, bias_values});
  EXPECT_EQ(with[2].values, (std::vector<float>{6, 0, 6, 0}));
  EXPECT_EQ(with[0].values, without[0].values);
  EXPECT_EQ(with[1].values, without[1].values);
}

// MaxText's load-balance loss (OpAttrs::load_balance_scale c): the router's extra outputs are
// c x softmax(score + bias) and the one-hot choices. Worked by hand: one sequence of 2 tokens,
// 2 experts, top 1, logits (ln 3, 0) and (0, ln 3): softmax (3/4, 1/4) and (1/4, 3/4), choices
// expert 0 then expert 1; with c = 0.5 the first output is half the softmax.
TEST(KernelMoe, RouterLoadBalanceOutputsAreScaledSoftmaxAndOneHotChoices) {
  Case c;
  const std::vector<Dim> logit_dims = {dim("batch", 1), dim("length", 2), dim("experts", 2)};
  const TensorId logits = c.tensor("logits", logit_dims);
  const TensorId routing =
      c.tensor("routing", {dim("batch", 1), dim("length", 2), dim("top_k", 1), dim("route", 2)});
  const TensorId probabilities = c.tensor("balance_probabilities", logit_dims);
  const TensorId choices = c.tensor("balance_choices", logit_dims);
  OpAttrs attrs;
  attrs.top_k = 1;
  attrs.load_balance_scale = 0.5;
  const Op& router = c.op(OpKind::kMoeRouter, {logits}, {routing, probabilities, choices}, attrs);
  TensorData values = TensorData::zeros(c.info(logits));
  const auto ln3 = static_cast<float>(std::log(3.0));
  values.values = {ln3, 0.0f, 0.0f, ln3};
  const std::vector<TensorData> out = run(c.graph, router, {values});
  expect_close(out[1], std::vector<double>{0.375, 0.125, 0.125, 0.375});
  EXPECT_EQ(out[2].values, (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(out[0].values[0], 0.0f);  // token 0 picks expert 0, token 1 expert 1
  EXPECT_EQ(out[0].values[2], 1.0f);
}

// With the load-balance loss, the router's VJP given the per-sequence counts C[b, e] is the
// gradient of sum over (b, s, e) of C[b, e] x output 1 (the loss's value, the counts held
// constant): checked by finite differences on the logits and the bias, with the sqrtsoftplus
// scores and a non-zero bias (the preset's router).
TEST(KernelMoe, RouterLoadBalanceGradientMatchesFiniteDifferences) {
  std::mt19937 rng(27);
  RouterGraph g;
  const TensorId bias = g.c.tensor("bias", {dim("experts", 4)});
  const TensorId d_bias = g.c.tensor("d_bias", {dim("experts", 4)});
  const TensorId probabilities = g.c.tensor("balance_probabilities", g.logit_dims);
  const TensorId choices = g.c.tensor("balance_choices", g.logit_dims);
  const TensorId counts = g.c.tensor("counts", {dim("batch", 2), dim("experts", 4)});
  OpAttrs attrs;
  attrs.top_k = kTopK;
  attrs.normalize_top_k = true;
  attrs.sqrt_softplus_scores = true;
  attrs.load_balance_scale = 0.3;
  g.c.op(OpKind::kMoeRouter, {g.logits, bias}, {g.routing, probabilities, choices}, attrs);
  g.c.op(OpKind::kRouterGrad, {g.d_routing, g.logits, bias, counts}, {g.d_logits, d_bias}, attrs,
         true);
  const Op& forward = g.c.graph.ops()[0];
  const Op& grad = g.c.graph.ops()[1];
  const TensorData logits = separated_logits(g.c.info(g.logits), rng);
  TensorData bias_values = TensorData::zeros(g.c.info(bias));
  bias_values.values = {0.75f, -0.75f, 0.15f, -0.45f};
  const std::vector<TensorData> out = run(g.c.graph, forward, {logits, bias_values});
  // The counts: the one-hot choices summed over each sequence's 3 tokens, by hand.
  TensorData count_values = TensorData::zeros(g.c.info(counts));
  for (size_t b = 0; b < 2; ++b) {
    for (size_t s = 0; s < 3; ++s) {
      for (size_t e = 0; e < 4; ++e) {
        count_values.values[b * 4 + e] += out[2].values[(b * 3 + s) * 4 + e];
      }
    }
  }
  EXPECT_EQ(std::accumulate(count_values.values.begin(), count_values.values.end(), 0.0f),
            static_cast<float>(2 * 3 * kTopK));
  std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
  for (size_t b = 0; b < 2; ++b) {
    for (size_t s = 0; s < 3; ++s) {
      for (size_t e = 0; e < 4; ++e) {
        weights[1].values[(b * 3 + s) * 4 + e] = count_values.values[b * 4 + e];
      }
    }
  }
  // The choices (index channel and one-hot) are piecewise constant: a finite step across a
  // near-tie of score + bias would jump. The routing weights' own gradient is checked above
  // (RouterBias..., RouterSqrtSoftplus...); here d_routing is 0 and only the load-balance term,
  // smooth in the logits and the bias, is differentiated.
  weights[0] = TensorData::zeros(g.c.info(g.routing));
  weights[2] = TensorData::zeros(g.c.info(choices));
  const std::vector<TensorData> grads =
      run(g.c.graph, grad, {weights[0], logits, bias_values, count_values});
  expect_fd("load-balanced router d_logits", g.c.graph, forward, {logits, bias_values}, weights, 0,
            grads[0]);
  expect_fd("load-balanced router d_bias", g.c.graph, forward, {logits, bias_values}, weights, 1,
            grads[1]);
  EXPECT_NE(grads[1].values, std::vector<float>(4, 0.0f));
}

struct MoeGraph {
  Case c;
  TensorId x = c.tensor("x", activation_dims());
  TensorId routing = c.tensor("routing", routing_dims());
  TensorId grouped = c.tensor("grouped", grouped_dims());
  TensorId y = c.tensor("y", activation_dims());
};

OpAttrs with_capacity() {
  OpAttrs attrs;
  attrs.capacity_factor = 1.0;
  return attrs;
}

TEST(KernelMoe, DispatchAndCombineFollowSlots) {
  std::mt19937 rng(21);
  MoeGraph g;
  const Op& dispatch = g.c.op(OpKind::kMoeDispatch, {g.x, g.routing}, {g.grouped}, with_capacity());
  const Op& combine = g.c.op(OpKind::kMoeCombine, {g.grouped, g.routing}, {g.y}, with_capacity());
  const TensorData x = random_data(g.c.info(g.x), rng);
  const TensorData routing = random_routing(g.c.info(g.routing), rng);
  const TensorData expert_out = random_data(g.c.info(g.grouped), rng);
  const TensorData grouped = run(g.c.graph, dispatch, {x, routing})[0];
  const TensorData y = run(g.c.graph, combine, {expert_out, routing})[0];
  const auto slots = reference_slots(routing);
  std::vector<double> expected_grouped(grouped.values.size(), 0.0);
  std::vector<double> expected_y(y.values.size(), 0.0);
  int dropped = 0;
  for (int64_t choice = 0; choice < 6 * kTopK; ++choice) {
    const auto [expert, slot] = slots[static_cast<size_t>(choice)];
    if (slot < 0) {
      ++dropped;
      continue;
    }
    const int64_t token = choice / kTopK;
    const double weight = routing.values[static_cast<size_t>(choice * 2 + 1)];
    for (int64_t e = 0; e < 4; ++e) {
      const auto at = static_cast<size_t>((expert * kCapacity + slot) * 4 + e);
      expected_grouped[at] = x.values[static_cast<size_t>(token * 4 + e)];
      expected_y[static_cast<size_t>(token * 4 + e)] += weight * expert_out.values[at];
    }
  }
  EXPECT_GE(dropped, 3);
  expect_close(grouped, expected_grouped);
  expect_close(y, expected_y);
}

TEST(KernelMoe, VjpsMatchFiniteDifferences) {
  std::mt19937 rng(22);
  MoeGraph g;
  const TensorId d_grouped = g.c.tensor("d_grouped", grouped_dims());
  const TensorId d_x = g.c.tensor("d_x", activation_dims());
  const TensorId d_y = g.c.tensor("d_y", activation_dims());
  const TensorId d_expert_out = g.c.tensor("d_expert_out", grouped_dims());
  const TensorId d_routing = g.c.tensor("d_routing", routing_dims());
  const OpAttrs capacity = with_capacity();
  const Op& dispatch = g.c.op(OpKind::kMoeDispatch, {g.x, g.routing}, {g.grouped}, capacity);
  const Op& combine = g.c.op(OpKind::kMoeCombine, {g.grouped, g.routing}, {g.y}, capacity);
  // VJP of dispatch: an unweighted combine; of combine: a weighted dispatch and the router grad.
  const Op& dispatch_vjp =
      g.c.op(OpKind::kMoeCombine, {d_grouped, g.routing}, {d_x}, capacity, true);
  const Op& combine_vjp =
      g.c.op(OpKind::kMoeDispatch, {d_y, g.routing}, {d_expert_out}, capacity, true);
  const Op& weights_vjp =
      g.c.op(OpKind::kRouterGrad, {d_y, g.grouped, g.routing}, {d_routing}, capacity, true);
  const TensorData x = random_data(g.c.info(g.x), rng);
  const TensorData routing = random_routing(g.c.info(g.routing), rng);
  const TensorData expert_out = random_data(g.c.info(g.grouped), rng);

  const std::vector<TensorData> w_grouped = random_weights(g.c.graph, dispatch, rng);
  expect_fd("moe dispatch dx (combine bwd)", g.c.graph, dispatch, {x, routing}, w_grouped, 0,
            run(g.c.graph, dispatch_vjp, {w_grouped[0], routing})[0]);

  const std::vector<TensorData> w_y = random_weights(g.c.graph, combine, rng);
  expect_fd("moe combine d_out (dispatch bwd)", g.c.graph, combine, {expert_out, routing}, w_y, 0,
            run(g.c.graph, combine_vjp, {w_y[0], routing})[0]);
  const TensorData analytic = run(g.c.graph, weights_vjp, {w_y[0], expert_out, routing})[0];
  for (int64_t index = 0; index < analytic.size(); index += 2) {
    EXPECT_EQ(analytic.values[static_cast<size_t>(index)], 0.0f);  // index channel
  }
  expect_fd("moe router grad d_weights", g.c.graph, combine, {expert_out, routing}, w_y, 1,
            analytic, {}, 1e-2, [](int64_t index) { return index % 2 == 1; });
}

// --- dropless MoE: ragged rows and grouped matmuls ----------------------------------------------

// 6 tokens x top-2 = 12 choices; 3 experts x 4 rows = 12 rows hold them however they route.
constexpr int64_t kRows = 4;

std::vector<Dim> ragged_dims(int64_t experts = kExperts, int64_t rows = kRows,
                             const std::string& feature = "embed", int64_t features = 4) {
  return {dim("experts", experts), dim("expert_tokens", rows), dim(feature, features)};
}
std::vector<Dim> row_expert_dims(int64_t experts = kExperts, int64_t rows = kRows) {
  return {dim("experts", experts), dim("expert_tokens", rows)};
}

// The most unbalanced routing top-2 allows: every token picks experts 0 and 1 (in a random
// order), 6 choices each where balanced routing gives 4; random weights in (0.1, 1).
TensorData skewed_routing(const Tensor& tensor, std::mt19937& rng) {
  TensorData data = TensorData::zeros(tensor);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  std::bernoulli_distribution swap(0.5);
  for (int64_t t = 0; t < 6; ++t) {
    const bool swapped = swap(rng);
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      const auto expert = static_cast<float>(swapped ? 1 - choice : choice);
      data.values[static_cast<size_t>((t * kTopK + choice) * 2)] = expert;
      data.values[static_cast<size_t>((t * kTopK + choice) * 2 + 1)] = weight(rng);
    }
  }
  return data;
}

// The flat row of each token-choice by the documented dropless rule: per block of experts,
// sorted by expert, then token, then choice.
std::vector<int64_t> dropless_rows(const TensorData& routing, int64_t experts, int64_t rows,
                                   int64_t shards) {
  const int64_t shard_experts = experts / shards;
  std::vector<int64_t> result(6 * kTopK, -1);
  for (int64_t shard = 0; shard < shards; ++shard) {
    int64_t next = shard * shard_experts * rows;
    for (int64_t e = shard * shard_experts; e < (shard + 1) * shard_experts; ++e) {
      for (int64_t choice = 0; choice < 6 * kTopK; ++choice) {
        if (static_cast<int64_t>(routing.values[static_cast<size_t>(choice * 2)]) == e) {
          result[static_cast<size_t>(choice)] = next++;
        }
      }
    }
  }
  return result;
}

// Nothing is dropped, rows are sorted by expert within their expert shard's block, row_experts
// names each row's expert, and combine adds every choice back.
TEST(KernelMoe, DroplessDispatchKeepsEveryChoiceSortedByExpert) {
  std::mt19937 rng(41);
  for (const int64_t shards : {1, 2}) {
    SCOPED_TRACE("expert_shards " + std::to_string(shards));
    // Two shards of 2 experts: a block must hold 6 tokens x min(2, k) choices = 12 rows.
    const int64_t experts = shards == 1 ? kExperts : 4;
    const int64_t rows = shards == 1 ? kRows : 6;
    Case c;
    const TensorId x = c.tensor("x", activation_dims());
    const TensorId routing = c.tensor("routing", routing_dims());
    const TensorId grouped = c.tensor("grouped", ragged_dims(experts, rows));
    const TensorId row_experts = c.tensor("row_experts", row_expert_dims(experts, rows));
    const TensorId y = c.tensor("y", activation_dims());
    OpAttrs attrs;
    attrs.expert_shards = shards;
    const Op& dispatch = c.op(OpKind::kMoeDispatch, {x, routing}, {grouped, row_experts}, attrs);
    const Op& combine = c.op(OpKind::kMoeCombine, {grouped, routing}, {y}, attrs);
    const TensorData x_values = random_data(c.info(x), rng);
    const TensorData routing_values = skewed_routing(c.info(routing), rng);
    const TensorData expert_out = random_data(c.info(grouped), rng);
    const std::vector<TensorData> dispatched = run(c.graph, dispatch, {x_values, routing_values});
    const TensorData combined = run(c.graph, combine, {expert_out, routing_values})[0];
    const std::vector<int64_t> placed = dropless_rows(routing_values, experts, rows, shards);
    std::vector<double> expected_grouped(dispatched[0].values.size(), 0.0);
    std::vector<double> expected_rows(dispatched[1].values.size(), -1.0);
    std::vector<double> expected_y(combined.values.size(), 0.0);
    for (int64_t choice = 0; choice < 6 * kTopK; ++choice) {
      const int64_t row = placed[static_cast<size_t>(choice)];
      ASSERT_GE(row, 0);
      const int64_t token = choice / kTopK;
      const double weight = routing_values.values[static_cast<size_t>(choice * 2 + 1)];
      expected_rows[static_cast<size_t>(row)] =
          routing_values.values[static_cast<size_t>(choice * 2)];
      for (int64_t e = 0; e < 4; ++e) {
        const auto at = static_cast<size_t>(row * 4 + e);
        expected_grouped[at] = x_values.values[static_cast<size_t>(token * 4 + e)];
        expected_y[static_cast<size_t>(token * 4 + e)] += weight * expert_out.values[at];
      }
    }
    expect_close(dispatched[0], expected_grouped);
    EXPECT_EQ(as_double(dispatched[1]), expected_rows);
    expect_close(combined, expected_y);
  }
}

// A block that cannot hold its shard's choices is an error, never a silent drop; unless
// ragged_buffer_factor bounded it, and then the choices past its end (the last in expert, token,
// choice order) are dropped.
TEST(KernelMoe, DroplessOverflowIsAnErrorUnlessBounded) {
  std::mt19937 rng(42);
  Case c;
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId routing = c.tensor("routing", routing_dims());
  const TensorId grouped = c.tensor("grouped", ragged_dims(kExperts, 3));  // 9 rows < 12
  const TensorId row_experts = c.tensor("row_experts", row_expert_dims(kExperts, 3));
  const TensorId y = c.tensor("y", activation_dims());
  const Op& dispatch = c.op(OpKind::kMoeDispatch, {x, routing}, {grouped, row_experts});
  const TensorData x_values = random_data(c.info(x), rng);
  const TensorData routing_values = skewed_routing(c.info(routing), rng);
  EXPECT_THROW(run(c.graph, dispatch, {x_values, routing_values}), std::logic_error);
  OpAttrs bounded;
  bounded.ragged_buffer_factor = 1.0;
  const Op& combine = c.op(OpKind::kMoeCombine, {grouped, routing}, {y}, bounded);
  const TensorData expert_out = random_data(c.info(grouped), rng);
  const TensorData combined = run(c.graph, combine, {expert_out, routing_values})[0];
  // Expert 0's six choices take rows 0-5, expert 1's first three rows 6-8, its last three drop.
  std::vector<double> expected(combined.values.size(), 0.0);
  int64_t row = 0;
  for (const int64_t expert : {0, 1}) {
    for (int64_t choice = 0; choice < 6 * kTopK && row < 9; ++choice) {
      if (static_cast<int64_t>(routing_values.values[static_cast<size_t>(choice * 2)]) != expert) {
        continue;
      }
      const double weight = routing_values.values[static_cast<size_t>(choice * 2 + 1)];
      for (int64_t e = 0; e < 4; ++e) {
        expected[static_cast<size_t>(choice / kTopK * 4 + e)] +=
            weight * expert_out.values[static_cast<size_t>(row * 4 + e)];
      }
      ++row;
    }
  }
  expect_close(combined, expected);
}

// Rows of three experts (and empty ones) in random order; explicit loops per row.
struct GroupedCase {
  Case c;
  TensorId x = c.tensor("x", ragged_dims());
  TensorId w = c.tensor("w", {dim("experts", kExperts), dim("embed", 4), dim("mlp", 5)});
  TensorId rows = c.tensor("row_experts", row_expert_dims());
  TensorId y = c.tensor("y", ragged_dims(kExperts, kRows, "mlp", 5));
  TensorId dy = c.tensor("dy", ragged_dims(kExperts, kRows, "mlp", 5));
  TensorId dx = c.tensor("dx", ragged_dims());
  TensorId dw = c.tensor("dw", {dim("experts", kExperts), dim("embed", 4), dim("mlp", 5)});

  TensorData random_rows(std::mt19937& rng) const {
    TensorData data = TensorData::zeros(c.info(rows));
    std::uniform_int_distribution<int> expert(-1, kExperts - 1);
    for (float& value : data.values) {
      value = static_cast<float>(expert(rng));
    }
    data.values[0] = 2;  // every expert has a row
    data.values[1] = 0;
    data.values[2] = 1;
    return data;
  }
};

OpAttrs contracting(std::vector<std::string> names) {
  OpAttrs attrs;
  attrs.contracted = std::move(names);
  attrs.routed_fraction = 0.5;
  return attrs;
}

TEST(KernelMoe, GroupedMatmulMatchesPerRowLoops) {
  std::mt19937 rng(43);
  GroupedCase g;
  const Op& forward = g.c.op(OpKind::kEinsum, {g.x, g.w, g.rows}, {g.y}, contracting({"embed"}));
  const Op& grad_x = g.c.op(OpKind::kEinsum, {g.dy, g.w, g.rows}, {g.dx}, contracting({"mlp"}));
  const Op& grad_w =
      g.c.op(OpKind::kEinsum, {g.dy, g.x, g.rows}, {g.dw}, contracting({"expert_tokens"}));
  const TensorData x = random_data(g.c.info(g.x), rng);
  const TensorData w = random_data(g.c.info(g.w), rng);
  const TensorData rows = g.random_rows(rng);
  const TensorData dy = random_data(g.c.info(g.dy), rng);
  std::vector<double> y(static_cast<size_t>(kExperts * kRows * 5), 0.0);
  std::vector<double> dx(static_cast<size_t>(kExperts * kRows * 4), 0.0);
  std::vector<double> dw(static_cast<size_t>(kExperts * 4 * 5), 0.0);
  for (int64_t row = 0; row < kExperts * kRows; ++row) {
    const auto e = static_cast<int64_t>(rows.values[static_cast<size_t>(row)]);
    if (e < 0) {
      continue;
    }
    for (int64_t d = 0; d < 4; ++d) {
      for (int64_t m = 0; m < 5; ++m) {
        const auto w_at = static_cast<size_t>((e * 4 + d) * 5 + m);
        const auto x_at = static_cast<size_t>(row * 4 + d);
        const auto y_at = static_cast<size_t>(row * 5 + m);
        y[y_at] += double{x.values[x_at]} * w.values[w_at];
        dx[x_at] += double{dy.values[y_at]} * w.values[w_at];
        dw[w_at] += double{x.values[x_at]} * dy.values[y_at];
      }
    }
  }
  expect_close(run(g.c.graph, forward, {x, w, rows})[0], y);
  expect_close(run(g.c.graph, grad_x, {dy, w, rows})[0], dx);
  expect_close(run(g.c.graph, grad_w, {dy, x, rows})[0], dw);
  // And the VJPs against finite differences of the forward grouped matmul.
  expect_fd("grouped matmul dx", g.c.graph, forward, {x, w, rows}, {dy}, 0,
            run(g.c.graph, grad_x, {dy, w, rows})[0]);
  expect_fd("grouped matmul dw", g.c.graph, forward, {x, w, rows}, {dy}, 1,
            run(g.c.graph, grad_w, {dy, x, rows})[0]);
}

// Under expert parallelism a device holds some experts' weights: rows name GLOBAL experts, and a
// row of an expert the device does not hold is an error.
TEST(KernelMoe, GroupedMatmulOnAnExpertShard) {
  std::mt19937 rng(44);
  Case c;
  const TensorId x = c.tensor("x", ragged_dims(1, kRows));
  const TensorId w =
      c.tensor("w", {split("experts", 1, 2, "expert"), dim("embed", 4), dim("mlp", 5)});
  const TensorId rows = c.tensor("row_experts", row_expert_dims(1, kRows));
  const TensorId y = c.tensor("y", ragged_dims(1, kRows, "mlp", 5));
  const Op& op = c.op(OpKind::kEinsum, {x, w, rows}, {y}, contracting({"embed"}));
  const TensorData x_values = random_data(c.info(x), rng);
  const TensorData w_values = random_data(c.info(w), rng);
  TensorData row_values = TensorData::zeros(c.info(rows));
  row_values.values = {1, 1, 1, -1};  // expert 1, the second device's
  const DeviceContext second = device_on("expert", 1, 2);
  const TensorData result = run(c.graph, op, {x_values, w_values, row_values}, second)[0];
  std::vector<double> expected(static_cast<size_t>(kRows * 5), 0.0);
  for (int64_t row = 0; row < 3; ++row) {
    for (int64_t d = 0; d < 4; ++d) {
      for (int64_t m = 0; m < 5; ++m) {
        expected[static_cast<size_t>(row * 5 + m)] +=
            double{x_values.values[static_cast<size_t>(row * 4 + d)]} *
            w_values.values[static_cast<size_t>(d * 5 + m)];
      }
    }
  }
  expect_close(result, expected);
  EXPECT_THROW(run(c.graph, op, {x_values, w_values, row_values}, device_on("expert", 0, 2)),
               std::logic_error);
}

// The whole dropless expert block (dispatch, a grouped MLP silu(x wi) wo, combine) on
// the most unbalanced routing equals the dense per-token computation
// y[t] = sum over choices c of weight_c silu(x[t] wi[e_c]) wo[e_c]: no choice is lost.
TEST(KernelMoe, DroplessExpertsMatchDenseComputation) {
  std::mt19937 rng(45);
  Case c;
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId routing = c.tensor("routing", routing_dims());
  const TensorId grouped = c.tensor("grouped", ragged_dims());
  const TensorId rows = c.tensor("row_experts", row_expert_dims());
  const TensorId wi = c.tensor("wi", {dim("experts", kExperts), dim("embed", 4), dim("mlp", 5)});
  const TensorId wo = c.tensor("wo", {dim("experts", kExperts), dim("mlp", 5), dim("embed", 4)});
  const TensorId hidden = c.tensor("hidden", ragged_dims(kExperts, kRows, "mlp", 5));
  const TensorId activated = c.tensor("activated", ragged_dims(kExperts, kRows, "mlp", 5));
  const TensorId out = c.tensor("out", ragged_dims());
  const TensorId y = c.tensor("y", activation_dims());
  OpAttrs silu;
  silu.function = ElementwiseFn::kSilu;
  const Op& dispatch = c.op(OpKind::kMoeDispatch, {x, routing}, {grouped, rows});
  const Op& up = c.op(OpKind::kEinsum, {grouped, wi, rows}, {hidden}, contracting({"embed"}));
  const Op& act = c.op(OpKind::kElementwise, {hidden}, {activated}, silu);
  const Op& down = c.op(OpKind::kEinsum, {activated, wo, rows}, {out}, contracting({"mlp"}));
  const Op& combine = c.op(OpKind::kMoeCombine, {out, routing}, {y});
  const TensorData x_values = random_data(c.info(x), rng);
  const TensorData routing_values = skewed_routing(c.info(routing), rng);
  const TensorData wi_values = random_data(c.info(wi), rng);
  const TensorData wo_values = random_data(c.info(wo), rng);
  const std::vector<TensorData> dispatched = run(c.graph, dispatch, {x_values, routing_values});
  const TensorData h = run(c.graph, up, {dispatched[0], wi_values, dispatched[1]})[0];
  const TensorData a = run(c.graph, act, {h})[0];
  const TensorData o = run(c.graph, down, {a, wo_values, dispatched[1]})[0];
  const TensorData result = run(c.graph, combine, {o, routing_values})[0];
  std::vector<double> expected(static_cast<size_t>(6 * 4), 0.0);
  for (int64_t token = 0; token < 6; ++token) {
    for (int64_t choice = 0; choice < kTopK; ++choice) {
      const auto at = static_cast<size_t>((token * kTopK + choice) * 2);
      const auto e = static_cast<int64_t>(routing_values.values[at]);
      const double weight = routing_values.values[at + 1];
      for (int64_t m = 0; m < 5; ++m) {
        double pre = 0;
        for (int64_t d = 0; d < 4; ++d) {
          pre += double{x_values.values[static_cast<size_t>(token * 4 + d)]} *
                 wi_values.values[static_cast<size_t>((e * 4 + d) * 5 + m)];
        }
        const double activation = pre / (1.0 + std::exp(-pre));
        for (int64_t d = 0; d < 4; ++d) {
          expected[static_cast<size_t>(token * 4 + d)] +=
              weight * activation * wo_values.values[static_cast<size_t>((e * 5 + m) * 4 + d)];
        }
      }
    }
  }
  expect_close(result, expected);
}

}  // namespace
}  // namespace tpusim::kernel_test
