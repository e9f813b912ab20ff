// tests/sim/functional/kernels/elementwise_test.cpp: the elementwise kernels
// (sim/functional/kernels/elementwise.cpp). Elementwise ops (activations, arithmetic): against
// their formulas and finite differences. The method and the helpers: kernel_test_support.h.
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

double reference_sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}
double reference_gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

struct UnaryCase {
  ElementwiseFn fn;
  ElementwiseFn grad;
  std::function<double(double)> reference;
};

std::vector<UnaryCase> unary_cases() {
  return {
      {ElementwiseFn::kSilu, ElementwiseFn::kSiluGrad,
       [](double x) { return x * reference_sigmoid(x); }},
      {ElementwiseFn::kGelu, ElementwiseFn::kGeluGrad, reference_gelu},
      {ElementwiseFn::kRelu, ElementwiseFn::kReluGrad, [](double x) { return std::max(x, 0.0); }},
      {ElementwiseFn::kSigmoid, ElementwiseFn::kSigmoidGrad, reference_sigmoid},
  };
}

// Random values in [-3, 3] kept at least 0.05 away from 0 (ReLU's kink).
TensorData away_from_zero(const Tensor& tensor, std::mt19937& rng) {
  TensorData data = random_data(tensor, rng, -3, 3);
  for (float& value : data.values) {
    if (std::abs(value) < 0.05f) {
      value += value < 0 ? -0.05f : 0.05f;
    }
  }
  return data;
}

TEST(KernelElementwise, MatchesFormulas) {
  std::mt19937 rng(3);
  std::vector<UnaryCase> cases = unary_cases();
  cases.push_back({ElementwiseFn::kScale, ElementwiseFn::kScale, [](double x) { return x; }});
  cases.push_back({ElementwiseFn::kCast, ElementwiseFn::kCast, [](double x) { return x; }});
  for (const UnaryCase& test : cases) {
    Case c;
    const TensorId x = c.tensor("x", activation_dims());
    const TensorId y = c.tensor("y", activation_dims());
    OpAttrs attrs;
    attrs.function = test.fn;
    const Op& op = c.op(OpKind::kElementwise, {x}, {y}, attrs);
    const TensorData input = away_from_zero(c.info(x), rng);
    std::vector<double> expected;
    for (const float value : input.values) {
      expected.push_back(test.reference(value));
    }
    SCOPED_TRACE(elementwise_name(test.fn));
    expect_close(run(c.graph, op, {input})[0], expected);
  }
  // Binary ops, and an input broadcast by dim name ([embed] against [batch, length, embed]).
  Case c;
  const TensorId a = c.tensor("a", activation_dims());
  const TensorId b = c.tensor("b", activation_dims());
  const TensorId row = c.tensor("row", {dim("embed", 4)});
  const TensorId y_sum = c.tensor("y_sum", activation_dims());
  const TensorId y_product = c.tensor("y_product", activation_dims());
  const TensorId y_broadcast = c.tensor("y_broadcast", activation_dims());
  const TensorData a_values = random_data(c.info(a), rng);
  const TensorData b_values = random_data(c.info(b), rng);
  const TensorData row_values = random_data(c.info(row), rng);
  OpAttrs add;
  add.function = ElementwiseFn::kAdd;
  OpAttrs mul;
  mul.function = ElementwiseFn::kMul;
  std::vector<double> sum;
  std::vector<double> product;
  std::vector<double> broadcast;
  for (size_t index = 0; index < a_values.values.size(); ++index) {
    sum.push_back(double{a_values.values[index]} + b_values.values[index]);
    product.push_back(double{a_values.values[index]} * b_values.values[index]);
    broadcast.push_back(double{a_values.values[index]} + row_values.values[index % 4]);
  }
  expect_close(
      run(c.graph, c.op(OpKind::kElementwise, {a, b}, {y_sum}, add), {a_values, b_values})[0], sum);
  expect_close(
      run(c.graph, c.op(OpKind::kElementwise, {a, b}, {y_product}, mul), {a_values, b_values})[0],
      product);
  expect_close(run(c.graph, c.op(OpKind::kElementwise, {row, a}, {y_broadcast}, add),
                   {row_values, a_values})[0],
               broadcast);
}

TEST(KernelElementwise, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(4);
  for (const UnaryCase& test : unary_cases()) {
    Case c;
    const TensorId x = c.tensor("x", activation_dims());
    const TensorId y = c.tensor("y", activation_dims());
    const TensorId dy = c.tensor("dy", activation_dims());
    const TensorId dx = c.tensor("dx", activation_dims());
    OpAttrs attrs;
    attrs.function = test.fn;
    const Op& forward = c.op(OpKind::kElementwise, {x}, {y}, attrs);
    OpAttrs grad_attrs;
    grad_attrs.function = test.grad;
    const Op& grad = c.op(OpKind::kElementwise, {dy, x}, {dx}, grad_attrs, true);
    const std::vector<TensorData> inputs = {away_from_zero(c.info(x), rng)};
    const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
    // A step below the 0.05 margin keeps ReLU's finite differences off its kink.
    expect_fd(std::string(elementwise_name(test.grad)), c.graph, forward, inputs, weights, 0,
              run(c.graph, grad, {weights[0], inputs[0]})[0], {}, 1e-2);
  }
  // Mul: the VJP of each operand is mul(dy, other).
  Case c;
  const TensorId a = c.tensor("a", activation_dims());
  const TensorId b = c.tensor("b", activation_dims());
  const TensorId y = c.tensor("y", activation_dims());
  const TensorId dy = c.tensor("dy", activation_dims());
  const TensorId grad = c.tensor("grad", activation_dims());
  OpAttrs mul;
  mul.function = ElementwiseFn::kMul;
  const Op& forward = c.op(OpKind::kElementwise, {a, b}, {y}, mul);
  const Op& vjp = c.op(OpKind::kElementwise, {dy, b}, {grad}, mul, true);
  const std::vector<TensorData> inputs = {random_data(c.info(a), rng), random_data(c.info(b), rng)};
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  expect_fd("mul da", c.graph, forward, inputs, weights, 0,
            run(c.graph, vjp, {weights[0], inputs[1]})[0]);
  expect_fd("mul db", c.graph, forward, inputs, weights, 1,
            run(c.graph, vjp, {weights[0], inputs[0]})[0]);
}

// The clipped SwiGLU of deepseek's routed experts (attrs.activation_limit L, MaxText moe.py
// apply_ffn_activation): silu(min(g, L)) and s clip(u, -L, L) against those formulas written
// out, and the VJPs autodiff emits (kSiluGrad and kMul carrying L; the up projection's gradient
// kMul(dy, s, u)) against finite differences, with values kept 0.05 off the kinks at +-L.
TEST(KernelElementwise, ClippedSwigluMatchesFormulasAndFiniteDifferences) {
  constexpr double kLimit = 1.0;
  std::mt19937 rng(5);
  Case c;
  const TensorId gate = c.tensor("gate", activation_dims());
  const TensorId up = c.tensor("up", activation_dims());
  const TensorId silu = c.tensor("silu", activation_dims());
  const TensorId product = c.tensor("product", activation_dims());
  const TensorId dy = c.tensor("dy", activation_dims());
  const TensorId d_gate = c.tensor("d_gate", activation_dims());
  const TensorId d_silu = c.tensor("d_silu", activation_dims());
  const TensorId d_up = c.tensor("d_up", activation_dims());
  const auto off_kinks = [&](const Tensor& tensor) {
    TensorData data = random_data(tensor, rng, -3, 3);
    for (float& value : data.values) {
      if (std::abs(std::abs(value) - kLimit) < 0.05) {
        value += value < 0 ? -0.1f : 0.1f;
      }
    }
    return data;
  };
  const TensorData gate_values = off_kinks(c.info(gate));
  const TensorData up_values = off_kinks(c.info(up));
  const TensorData silu_values = random_data(c.info(silu), rng);
  OpAttrs silu_attrs;
  silu_attrs.function = ElementwiseFn::kSilu;
  silu_attrs.activation_limit = kLimit;
  OpAttrs mul_attrs;
  mul_attrs.function = ElementwiseFn::kMul;
  mul_attrs.activation_limit = kLimit;
  OpAttrs silu_grad_attrs = silu_attrs;
  silu_grad_attrs.function = ElementwiseFn::kSiluGrad;
  const Op& silu_op = c.op(OpKind::kElementwise, {gate}, {silu}, silu_attrs);
  const Op& mul_op = c.op(OpKind::kElementwise, {silu, up}, {product}, mul_attrs);
  std::vector<double> expected_silu;
  std::vector<double> expected_product;
  int64_t clipped_gates = 0;
  int64_t clipped_ups = 0;
  for (size_t index = 0; index < gate_values.values.size(); ++index) {
    const double g = std::min(double{gate_values.values[index]}, kLimit);
    const double u = std::clamp(double{up_values.values[index]}, -kLimit, kLimit);
    clipped_gates += gate_values.values[index] > kLimit ? 1 : 0;
    clipped_ups += std::abs(up_values.values[index]) > kLimit ? 1 : 0;
    expected_silu.push_back(g * reference_sigmoid(g));
    expected_product.push_back(double{silu_values.values[index]} * u);
  }
  // The random values cross the limit on both sides, or the test would not test the clip.
  ASSERT_GT(clipped_gates, 0);
  ASSERT_GT(clipped_ups, 0);
  expect_close(run(c.graph, silu_op, {gate_values})[0], expected_silu);
  expect_close(run(c.graph, mul_op, {silu_values, up_values})[0], expected_product);
  const Op& silu_grad = c.op(OpKind::kElementwise, {dy, gate}, {d_gate}, silu_grad_attrs, true);
  const Op& silu_side = c.op(OpKind::kElementwise, {dy, up}, {d_silu}, mul_attrs, true);
  const Op& up_side = c.op(OpKind::kElementwise, {dy, silu, up}, {d_up}, mul_attrs, true);
  const std::vector<TensorData> silu_weights = random_weights(c.graph, silu_op, rng);
  expect_fd("clipped silu", c.graph, silu_op, {gate_values}, silu_weights, 0,
            run(c.graph, silu_grad, {silu_weights[0], gate_values})[0], {}, 1e-2);
  const std::vector<TensorData> mul_weights = random_weights(c.graph, mul_op, rng);
  expect_fd("clipped product d silu", c.graph, mul_op, {silu_values, up_values}, mul_weights, 0,
            run(c.graph, silu_side, {mul_weights[0], up_values})[0], {}, 1e-2);
  expect_fd("clipped product d up", c.graph, mul_op, {silu_values, up_values}, mul_weights, 1,
            run(c.graph, up_side, {mul_weights[0], silu_values, up_values})[0], {}, 1e-2);
}

// kReshape (the Gated DeltaNet layer's split of length into chunks): the same values in the same
// row-major order under the new dims, and its VJP, the reshape back, returns dy unchanged.
// kAdd of one input copies it into every index of the output's extra dims (mHC's streams).
TEST(KernelElementwise, AddOfOneInputBroadcastsIt) {
  std::mt19937 rng(23);
  Case c;
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId streams =
      c.tensor("streams", {dim("batch", 2), dim("length", 3), dim("streams", 4), dim("embed", 4)});
  OpAttrs attrs;
  attrs.function = ElementwiseFn::kAdd;
  const Op& op = c.op(OpKind::kElementwise, {x}, {streams}, attrs);
  const TensorData input = random_data(c.info(x), rng);
  const TensorData result = run(c.graph, op, {input})[0];
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t l = 0; l < 3; ++l) {
      for (int64_t k = 0; k < 4; ++k) {
        for (int64_t e = 0; e < 4; ++e) {
          EXPECT_EQ(result.at({b, l, k, e}), input.at({b, l, e}));
        }
      }
    }
  }
}

TEST(KernelElementwise, ReshapeKeepsRowMajorOrder) {
  std::mt19937 rng(5);
  Case c;
  const TensorId x = c.tensor("x", {dim("batch", 2), dim("length", 6), dim("embed", 3)});
  const TensorId y =
      c.tensor("y", {dim("batch", 2), dim("chunks", 3), dim("chunk", 2), dim("embed", 3)});
  const TensorId dx = c.tensor("dx", {dim("batch", 2), dim("length", 6), dim("embed", 3)});
  OpAttrs attrs;
  attrs.function = ElementwiseFn::kReshape;
  const Op& forward = c.op(OpKind::kElementwise, {x}, {y}, attrs);
  const TensorData input = random_data(c.info(x), rng);
  const std::vector<double> same(input.values.begin(), input.values.end());
  expect_close(run(c.graph, forward, {input})[0], same);
  const Op& vjp = c.op(OpKind::kElementwise, {y}, {dx}, attrs, true);
  const TensorData dy = random_data(c.info(y), rng);
  expect_close(run(c.graph, vjp, {dy})[0], std::vector<double>(dy.values.begin(), dy.values.end()));
}

}  // namespace
}  // namespace tpusim::kernel_test
