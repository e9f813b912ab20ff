// tests/sim/functional/kernels/cross_entropy_test.cpp: the cross entropy kernels
// (sim/functional/kernels/cross_entropy.cpp). Cross-entropy: loss and gradient, transformed logits,
// vocab and token shards.
// The method and the helpers: kernel_test_support.h.
#include <gtest/gtest.h>

#include <algorithm>
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

std::vector<Dim> logits_dims(int64_t vocab) {
  return {dim("batch", 2), dim("length", 3), dim("vocab", vocab)};
}

double reference_loss(const TensorData& logits, const TensorData& targets) {
  const int64_t vocab = logits.shape.back();
  const int64_t tokens = targets.size();
  double total = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    double max = -kInfinity;
    for (int64_t v = 0; v < vocab; ++v) {
      max = std::max(max, double{logits.values[static_cast<size_t>(t * vocab + v)]});
    }
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      sum += std::exp(logits.values[static_cast<size_t>(t * vocab + v)] - max);
    }
    const auto target = static_cast<int64_t>(targets.values[static_cast<size_t>(t)]);
    total += max + std::log(sum) - logits.values[static_cast<size_t>(t * vocab + target)];
  }
  return total / static_cast<double>(tokens);
}

TEST(KernelCrossEntropy, LossMatchesFormulaAndGradientFiniteDifferences) {
  std::mt19937 rng(16);
  Case c;
  const TensorId logits = c.tensor("logits", logits_dims(6));
  const TensorId targets = c.tensor("targets", token_dims(), TensorKind::kInput);
  const TensorId loss = c.tensor("loss", {}, TensorKind::kScalar);
  const TensorId dlogits = c.tensor("dlogits", logits_dims(6));
  const Op& forward = c.op(OpKind::kCrossEntropy, {logits, targets}, {loss});
  const Op& grad = c.op(OpKind::kCrossEntropyGrad, {logits, targets}, {dlogits}, {}, true);
  const std::vector<TensorData> inputs = {random_data(c.info(logits), rng, -2, 2),
                                          random_ints(c.info(targets), rng, 6)};
  const TensorData result = run(c.graph, forward, inputs)[0];
  ASSERT_EQ(result.size(), 1);
  EXPECT_NEAR(result.values[0], reference_loss(inputs[0], inputs[1]), 1e-5);
  TensorData one = TensorData::zeros(c.info(loss));
  one.values[0] = 1;
  expect_fd("cross_entropy dlogits", c.graph, forward, inputs, {one}, 0,
            run(c.graph, grad, inputs)[0]);
}

// The tied output head's transform, read by the loss: z = c tanh(m x / c) (c = 0: z = m x); the
// loss is the plain cross-entropy of z, and the gradient with respect to x matches the finite
// differences of that loss.
TEST(KernelCrossEntropy, TransformedLogitsMatchFormulaAndFiniteDifferences) {
  std::mt19937 rng(19);
  for (const auto& [cap, multiplier] :
       {std::pair{1.5, 1.0}, std::pair{1.5, 0.5}, std::pair{0.0, 0.125}}) {
    SCOPED_TRACE("cap " + std::to_string(cap) + " multiplier " + std::to_string(multiplier));
    Case c;
    const TensorId logits = c.tensor("logits", logits_dims(6));
    const TensorId targets = c.tensor("targets", token_dims(), TensorKind::kInput);
    const TensorId loss = c.tensor("loss", {}, TensorKind::kScalar);
    const TensorId dlogits = c.tensor("dlogits", logits_dims(6));
    OpAttrs attrs;
    attrs.logit_soft_cap = cap;
    attrs.logit_multiplier = multiplier;
    const Op& forward = c.op(OpKind::kCrossEntropy, {logits, targets}, {loss}, attrs);
    const Op& grad = c.op(OpKind::kCrossEntropyGrad, {logits, targets}, {dlogits}, attrs, true);
    const std::vector<TensorData> inputs = {random_data(c.info(logits), rng, -4, 4),
                                            random_ints(c.info(targets), rng, 6)};
    TensorData z = inputs[0];
    for (float& value : z.values) {
      const double scaled = multiplier * value;
      value = static_cast<float>(cap > 0 ? cap * std::tanh(scaled / cap) : scaled);
    }
    const TensorData result = run(c.graph, forward, inputs)[0];
    EXPECT_NEAR(result.values[0], reference_loss(z, inputs[1]), 1e-5);
    TensorData one = TensorData::zeros(c.info(loss));
    one.values[0] = 1;
    expect_fd("transformed cross_entropy dlogits", c.graph, forward, inputs, {one}, 0,
              run(c.graph, grad, inputs)[0]);
  }
}

// Vocab split over two devices (5 = 3 + 2, with one padding entry on the second): statistics
// combined as the engine's log-sum-exp all-reduce; loss and gradient equal the unsplit ones.
TEST(KernelCrossEntropy, VocabShardsWithStatisticsMatchWhole) {
  std::mt19937 rng(17);
  Case c;
  const TensorId logits = c.tensor("logits", logits_dims(5));
  const TensorId targets = c.tensor("targets", token_dims(), TensorKind::kInput);
  const TensorId loss = c.tensor("loss", {}, TensorKind::kScalar);
  const TensorId dlogits = c.tensor("dlogits", logits_dims(5));
  std::vector<Dim> local_dims = logits_dims(5);
  local_dims[2] = split("vocab", 3, 5, "tensor");
  const TensorId local_logits = c.tensor("local_logits", local_dims);
  const TensorId local_dlogits = c.tensor("local_dlogits", local_dims);
  const TensorId stats =
      c.tensor("stats", {dim("batch", 2), dim("length", 3), dim("statistics", 3)});
  const Op& whole = c.op(OpKind::kCrossEntropy, {logits, targets}, {loss});
  const Op& whole_grad = c.op(OpKind::kCrossEntropyGrad, {logits, targets}, {dlogits}, {}, true);
  const Op& statistics = c.op(OpKind::kCrossEntropyStatistics, {local_logits, targets}, {stats});
  const TensorId local_loss = c.tensor("local_loss", {}, TensorKind::kScalar);
  const Op& local = c.op(OpKind::kCrossEntropy, {local_logits, targets, stats}, {local_loss});
  const Op& local_grad =
      c.op(OpKind::kCrossEntropyGrad, {local_logits, targets, stats}, {local_dlogits}, {}, true);
  const TensorData logit_values = random_data(c.info(logits), rng, -2, 2);
  TensorData target_values = random_ints(c.info(targets), rng, 5);
  target_values.values[0] = 4;  // targets on both shards
  target_values.values[1] = 0;
  const double expected = run(c.graph, whole, {logit_values, target_values})[0].values[0];
  const TensorData expected_grad = run(c.graph, whole_grad, {logit_values, target_values})[0];
  std::vector<TensorData> shards;
  std::vector<TensorData> partials;
  for (int device = 0; device < 2; ++device) {
    TensorData shard = TensorData::zeros(c.info(local_logits));
    for (int64_t t = 0; t < 6; ++t) {
      for (int64_t v = 0; v < 3; ++v) {
        const int64_t global = device * 3 + v;
        shard.values[static_cast<size_t>(t * 3 + v)] =
            global < 5 ? logit_values.values[static_cast<size_t>(t * 5 + global)] : 50.0f;
      }
    }
    shards.push_back(shard);
    partials.push_back(
        run(c.graph, statistics, {shard, target_values}, device_on("tensor", device, 2))[0]);
  }
  TensorData combined = TensorData::zeros(c.info(stats));
  for (int64_t t = 0; t < 6; ++t) {
    const auto at = [&](int device, int64_t value) {
      return double{
          partials[static_cast<size_t>(device)].values[static_cast<size_t>(t * 3 + value)]};
    };
    const double max = std::max(at(0, 0), at(1, 0));
    combined.values[static_cast<size_t>(t * 3)] = static_cast<float>(max);
    combined.values[static_cast<size_t>(t * 3 + 1)] = static_cast<float>(
        at(0, 1) * std::exp(at(0, 0) - max) + at(1, 1) * std::exp(at(1, 0) - max));
    combined.values[static_cast<size_t>(t * 3 + 2)] = static_cast<float>(at(0, 2) + at(1, 2));
  }
  for (int device = 0; device < 2; ++device) {
    const DeviceContext context = device_on("tensor", device, 2);
    const std::vector<TensorData> in = {shards[static_cast<size_t>(device)], target_values,
                                        combined};
    EXPECT_NEAR(run(c.graph, local, in, context)[0].values[0], expected, 1e-5);
    const TensorData grad = run(c.graph, local_grad, in, context)[0];
    const int64_t valid = device == 0 ? 3 : 2;
    for (int64_t t = 0; t < 6; ++t) {
      for (int64_t v = 0; v < 3; ++v) {
        const double want =
            v < valid ? expected_grad.values[static_cast<size_t>(t * 5 + device * 3 + v)] : 0.0;
        EXPECT_NEAR(grad.values[static_cast<size_t>(t * 3 + v)], want, 1e-6);
      }
    }
  }
}

// Tokens split over two devices: each loss is its tokens' sum over the GLOBAL token count.
TEST(KernelCrossEntropy, TokenShardsDivideByGlobalCount) {
  std::mt19937 rng(18);
  Case c;
  const TensorId logits = c.tensor("logits", logits_dims(4));
  const TensorId targets = c.tensor("targets", token_dims(), TensorKind::kInput);
  const TensorId loss = c.tensor("loss", {}, TensorKind::kScalar);
  const TensorId local_logits =
      c.tensor("local_logits", {split("batch", 1, 2, "data"), dim("length", 3), dim("vocab", 4)});
  const TensorId local_targets =
      c.tensor("local_targets", {split("batch", 1, 2, "data"), dim("length", 3)});
  const Op& whole = c.op(OpKind::kCrossEntropy, {logits, targets}, {loss});
  const TensorId local_loss = c.tensor("local_loss", {}, TensorKind::kScalar);
  const Op& local = c.op(OpKind::kCrossEntropy, {local_logits, local_targets}, {local_loss});
  const TensorData logit_values = random_data(c.info(logits), rng, -2, 2);
  const TensorData target_values = random_ints(c.info(targets), rng, 4);
  const double expected = run(c.graph, whole, {logit_values, target_values})[0].values[0];
  double total = 0;
  for (int device = 0; device < 2; ++device) {
    total +=
        run(c.graph, local, {slice(logit_values, 0, device, 1), slice(target_values, 0, device, 1)},
            device_on("data", device, 2))[0]
            .values[0];
  }
  EXPECT_NEAR(total, expected, 1e-5);
}

}  // namespace
}  // namespace tpusim::kernel_test
