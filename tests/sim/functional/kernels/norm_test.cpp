// tests/sim/functional/kernels/norm_test.cpp: the norm kernels
// (sim/functional/kernels/norm.cpp). RMSNorm and LayerNorm: forward, gradients, and the reduced dim
// split with partial statistics. The method and the helpers: kernel_test_support.h.
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

constexpr double kNormEpsilon = 1e-5;

// [batch, length, embed] rows normalized over embed.
std::vector<double> reference_norm(const TensorData& x, const TensorData& scale,
                                   const TensorData* bias) {
  const int64_t n = x.shape.back();
  const int64_t rows = x.size() / n;
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0;
    double square = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double value = x.values[static_cast<size_t>(r * n + i)];
      mean += value / static_cast<double>(n);
      square += value * value / static_cast<double>(n);
    }
    const double center = bias ? mean : 0.0;
    const double variance = bias ? square - mean * mean : square;
    for (int64_t i = 0; i < n; ++i) {
      const double value = x.values[static_cast<size_t>(r * n + i)];
      y.push_back((value - center) / std::sqrt(variance + kNormEpsilon) *
                      scale.values[static_cast<size_t>(i)] +
                  (bias ? bias->values[static_cast<size_t>(i)] : 0.0));
    }
  }
  return y;
}

// x, scale[, bias] with x offset from 0 so LayerNorm's mean matters.
std::vector<TensorData> norm_inputs(const Case& c, const std::vector<TensorId>& ids,
                                    std::mt19937& rng) {
  std::vector<TensorData> inputs = {random_data(c.info(ids[0]), rng, -0.5f, 1.5f)};
  inputs.push_back(random_data(c.info(ids[1]), rng, 0.5f, 1.5f));
  if (ids.size() > 2) {
    inputs.push_back(random_data(c.info(ids[2]), rng));
  }
  return inputs;
}

TEST(KernelNorm, ForwardMatchesFormula) {
  std::mt19937 rng(5);
  for (const bool layer : {false, true}) {
    Case c;
    const TensorId x = c.tensor("x", activation_dims());
    const TensorId scale = c.tensor("scale", {dim("embed", 4)}, TensorKind::kParameter);
    const TensorId bias = c.tensor("bias", {dim("embed", 4)}, TensorKind::kParameter);
    const TensorId y = c.tensor("y", activation_dims());
    OpAttrs attrs;
    attrs.contracted = {"embed"};
    attrs.epsilon = kNormEpsilon;
    std::vector<TensorId> ids = {x, scale};
    if (layer) {
      ids.push_back(bias);
    }
    const Op& op = c.op(layer ? OpKind::kLayerNorm : OpKind::kRmsNorm, ids, {y}, attrs);
    const std::vector<TensorData> inputs = norm_inputs(c, ids, rng);
    SCOPED_TRACE(layer ? "layer" : "rms");
    expect_close(run(c.graph, op, inputs)[0],
                 reference_norm(inputs[0], inputs[1], layer ? &inputs[2] : nullptr));
  }
}

TEST(KernelNorm, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(6);
  for (const bool layer : {false, true}) {
    Case c;
    const TensorId x = c.tensor("x", activation_dims());
    const TensorId scale = c.tensor("scale", {dim("embed", 4)}, TensorKind::kParameter);
    const TensorId bias = c.tensor("bias", {dim("embed", 4)}, TensorKind::kParameter);
    const TensorId y = c.tensor("y", activation_dims());
    const TensorId dy = c.tensor("dy", activation_dims());
    const TensorId dx = c.tensor("dx", activation_dims());
    const TensorId dscale = c.tensor("dscale", {dim("embed", 4)});
    const TensorId dbias = c.tensor("dbias", {dim("embed", 4)});
    OpAttrs attrs;
    attrs.contracted = {"embed"};
    attrs.epsilon = kNormEpsilon;
    std::vector<TensorId> ids = {x, scale};
    std::vector<TensorId> grad_inputs = {dy, x, scale};
    std::vector<TensorId> grad_outputs = {dx, dscale};
    if (layer) {
      ids.push_back(bias);
      grad_inputs.push_back(bias);
      grad_outputs.push_back(dbias);
    }
    const Op& forward = c.op(layer ? OpKind::kLayerNorm : OpKind::kRmsNorm, ids, {y}, attrs);
    const Op& grad = c.op(OpKind::kNormGrad, grad_inputs, grad_outputs, attrs, true);
    const std::vector<TensorData> inputs = norm_inputs(c, ids, rng);
    const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
    std::vector<TensorData> grad_values = {weights[0]};
    grad_values.insert(grad_values.end(), inputs.begin(), inputs.end());
    const std::vector<TensorData> analytic = run(c.graph, grad, grad_values);
    const std::string name = layer ? "layer_norm" : "rms_norm";
    // A smaller step for dx: with 4-element rows the norm's curvature makes the O(h^2)
    // truncation error of a 1e-2 step reach ~4e-4 (LayerNorm).
    expect_fd(name + " dx", c.graph, forward, inputs, weights, 0, analytic[0], {}, 3e-3);
    expect_fd(name + " dscale", c.graph, forward, inputs, weights, 1, analytic[1]);
    if (layer) {
      expect_fd(name + " dbias", c.graph, forward, inputs, weights, 2, analytic[2]);
    }
  }
}

// The reduced dim split in two: partial statistics summed over both devices (the engine's
// all-reduce), then each device's norm (or norm gradient) equals its slice of the unsplit one.
TEST(KernelNorm, SplitReducedDimWithStatisticsMatchesWhole) {
  std::mt19937 rng(7);
  const int64_t embed = 8;
  const int64_t half = embed / 2;
  for (const bool layer : {false, true}) {
    for (const bool gradient : {false, true}) {
      SCOPED_TRACE(std::string(layer ? "layer" : "rms") + (gradient ? " grad" : " forward"));
      const std::vector<Dim> whole_dims = {dim("batch", 2), dim("length", 3), dim("embed", embed)};
      const std::vector<Dim> local_dims = {dim("batch", 2), dim("length", 3),
                                           split("embed", half, embed, "tensor")};
      Case c;
      OpAttrs attrs;
      attrs.contracted = {"embed"};
      attrs.epsilon = kNormEpsilon;
      // Whole and local versions of every tensor: dy?, x, scale, bias?; outputs.
      auto tensors = [&](const std::vector<Dim>& dims, const Dim& row_dim) {
        std::vector<TensorId> in;
        if (gradient) {
          in.push_back(c.tensor("dy", dims));
        }
        in.push_back(c.tensor("x", dims));
        in.push_back(c.tensor("scale", {row_dim}, TensorKind::kParameter));
        if (layer) {
          in.push_back(c.tensor("bias", {row_dim}, TensorKind::kParameter));
        }
        std::vector<TensorId> out = {c.tensor("out", dims)};
        if (gradient) {
          out.push_back(c.tensor("dscale", {row_dim}));
          if (layer) {
            out.push_back(c.tensor("dbias", {row_dim}));
          }
        }
        return std::pair{in, out};
      };
      const auto [whole_in, whole_out] = tensors(whole_dims, whole_dims[2]);
      const auto [local_in, local_out] = tensors(local_dims, local_dims[2]);
      const OpKind kind = gradient ? OpKind::kNormGrad
                          : layer  ? OpKind::kLayerNorm
                                   : OpKind::kRmsNorm;
      const Op& whole = c.op(kind, whole_in, whole_out, attrs, gradient);
      const int64_t values = gradient ? (layer ? 4 : 2) : (layer ? 2 : 1);
      const TensorId stats =
          c.tensor("stats", {dim("batch", 2), dim("length", 3), dim("statistics", values)});
      OpAttrs stat_attrs;
      stat_attrs.contracted = {"embed"};
      const Op& statistics = c.op(OpKind::kNormStatistics, local_in, {stats}, stat_attrs, gradient);
      std::vector<TensorId> with_stats = local_in;
      with_stats.push_back(stats);
      const Op& local = c.op(kind, with_stats, local_out, attrs, gradient);

      std::vector<TensorData> inputs;
      for (const TensorId id : whole_in) {
        const bool is_scale = c.info(id).name == "scale";
        inputs.push_back(random_data(c.info(id), rng, is_scale ? 0.5f : -0.5f, 1.5f));
      }
      const std::vector<TensorData> expected = run(c.graph, whole, inputs);
      std::vector<std::vector<TensorData>> local_inputs(2);
      TensorData total = TensorData::zeros(c.info(stats));
      for (int device = 0; device < 2; ++device) {
        for (const TensorData& input : inputs) {
          local_inputs[static_cast<size_t>(device)].push_back(
              slice(input, input.shape.size() - 1, device * half, half));
        }
        const TensorData partial =
            run(c.graph, statistics, local_inputs[static_cast<size_t>(device)],
                device_on("tensor", device, 2))[0];
        for (size_t index = 0; index < total.values.size(); ++index) {
          total.values[index] += partial.values[index];
        }
      }
      for (int device = 0; device < 2; ++device) {
        std::vector<TensorData> with_total = local_inputs[static_cast<size_t>(device)];
        with_total.push_back(total);
        const std::vector<TensorData> result =
            run(c.graph, local, with_total, device_on("tensor", device, 2));
        for (size_t out = 0; out < result.size(); ++out) {
          const TensorData& full = expected[out];
          expect_close(result[out], slice(full, full.shape.size() - 1, device * half, half), 1e-5);
        }
      }
    }
  }
}

// DeepSeek-V4's unweighted RMSNorm (q_up_norm): kRmsNorm(x) without a scale input, its gradient
// kNormGrad(dy, x) -> dx alone; the formula, finite differences, and the reduced dim split in two
// with statistics (x) forward and (dy, x) backward.
TEST(KernelNorm, ScaleFreeRmsNormMatchesFormulaGradientAndSplit) {
  std::mt19937 rng(33);
  const int64_t embed = 8;
  const int64_t half = embed / 2;
  const std::vector<Dim> whole_dims = {dim("batch", 2), dim("length", 3), dim("embed", embed)};
  const std::vector<Dim> local_dims = {dim("batch", 2), dim("length", 3),
                                       split("embed", half, embed, "tensor")};
  Case c;
  OpAttrs attrs;
  attrs.contracted = {"embed"};
  attrs.epsilon = kNormEpsilon;
  const TensorId x = c.tensor("x", whole_dims);
  const TensorId y = c.tensor("y", whole_dims);
  const TensorId dy = c.tensor("dy", whole_dims);
  const TensorId dx = c.tensor("dx", whole_dims);
  const Op& forward = c.op(OpKind::kRmsNorm, {x}, {y}, attrs);
  const Op& grad = c.op(OpKind::kNormGrad, {dy, x}, {dx}, attrs, true);
  const TensorData input = random_data(c.info(x), rng, -0.5f, 1.5f);
  TensorData ones = TensorData::zeros(std::vector<int64_t>{embed});
  std::fill(ones.values.begin(), ones.values.end(), 1.0f);
  expect_close(run(c.graph, forward, {input})[0], reference_norm(input, ones, nullptr));
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  const TensorData analytic = run(c.graph, grad, {weights[0], input})[0];
  expect_fd("scale-free rms_norm dx", c.graph, forward, {input}, weights, 0, analytic, {}, 3e-3);

  for (const bool gradient : {false, true}) {
    SCOPED_TRACE(gradient ? "split grad" : "split forward");
    const TensorId local_x = c.tensor("local_x", local_dims);
    const TensorId local_dy = c.tensor("local_dy", local_dims);
    const TensorId local_out = c.tensor("local_out", local_dims);
    const TensorId stats =
        c.tensor("stats", {dim("batch", 2), dim("length", 3), dim("statistics", gradient ? 2 : 1)});
    std::vector<TensorId> local_in = {local_x};
    if (gradient) {
      local_in.insert(local_in.begin(), local_dy);
    }
    OpAttrs stat_attrs;
    stat_attrs.contracted = {"embed"};
    const Op& statistics = c.op(OpKind::kNormStatistics, local_in, {stats}, stat_attrs, gradient);
    std::vector<TensorId> with_stats = local_in;
    with_stats.push_back(stats);
    const Op& local = c.op(gradient ? OpKind::kNormGrad : OpKind::kRmsNorm, with_stats, {local_out},
                           attrs, gradient);
    std::vector<TensorData> whole_inputs = {input};
    if (gradient) {
      whole_inputs.insert(whole_inputs.begin(), weights[0]);
    }
    const TensorData expected = run(c.graph, gradient ? grad : forward, whole_inputs)[0];
    TensorData total = TensorData::zeros(c.info(stats));
    std::vector<std::vector<TensorData>> parts(2);
    for (int device = 0; device < 2; ++device) {
      for (const TensorData& value : whole_inputs) {
        parts[static_cast<size_t>(device)].push_back(slice(value, 2, device * half, half));
      }
      const TensorData partial = run(c.graph, statistics, parts[static_cast<size_t>(device)],
                                     device_on("tensor", device, 2))[0];
      for (size_t index = 0; index < total.values.size(); ++index) {
        total.values[index] += partial.values[index];
      }
    }
    for (int device = 0; device < 2; ++device) {
      std::vector<TensorData> with_total = parts[static_cast<size_t>(device)];
      with_total.push_back(total);
      expect_close(run(c.graph, local, with_total, device_on("tensor", device, 2))[0],
                   slice(expected, 2, device * half, half), 1e-5);
    }
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
