// The functional engine's kernels, table-driven in the spirit of ggml's test-backend-ops: tiny
// one-op graphs built by hand, random inputs from a fixed seed, and
//  (1) every forward op against a naive reference written here;
//  (2) every backward kernel against central finite differences of its forward op: for
//      L = sum(w * forward(inputs)) with random w, the VJP kernel fed w must give dL/d(input)
//      (error = max |analytic - numeric| / max |numeric|, required < 1e-3);
//  (3) split-dim semantics: a computation split over two simulated devices (statistics combined
//      here as the engine would) equals the unsplit one;
//  (4) AdamW against its formula;
//  (5) every op kind run_kernel executes has a test case here (KernelCoverage).
#include "sim/functional/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sharding/mesh.h"
#include "sim/functional/kernels/families.h"

namespace tpusim {
namespace {

constexpr double kFdTolerance = 1e-3;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

Dim dim(const std::string& name, int64_t size) {
  return Dim{name, size, ""};
}

// A dim split over mesh axis `axis`: `local` of `global` elements on each device.
Dim split(const std::string& name, int64_t local, int64_t global, const std::string& axis) {
  Dim result{name, local, ""};
  result.global_size = global;
  result.sharded_over = {axis};
  return result;
}

// A device at `coordinate` of `size` along mesh axis `axis` (every other axis of size 1).
DeviceContext device_on(const std::string& axis, int coordinate, int size) {
  DeviceContext device;
  device.sizes.fill(1);
  const auto index = static_cast<size_t>(mesh_axis_index(axis));
  device.coordinates[index] = coordinate;
  device.sizes[index] = size;
  return device;
}

// A graph holding the ops of one test, in a forward and a backward region.
struct Case {
  Graph graph;
  int forward = graph.add_region("forward", 1, Phase::kForward);
  int backward = graph.add_region("backward", 1, Phase::kBackward);

  TensorId tensor(const std::string& name, std::vector<Dim> dims,
                  TensorKind kind = TensorKind::kActivation) {
    return graph.add_tensor(name, std::move(dims), DType::kF32, kind, forward);
  }
  const Op& op(OpKind kind, std::vector<TensorId> inputs, std::vector<TensorId> outputs,
               OpAttrs attrs = {}, bool backward_phase = false) {
    const int id = graph.add_op(kind, op_kind_name(kind), std::move(inputs), std::move(outputs),
                                std::move(attrs), backward_phase ? backward : forward);
    return graph.ops()[static_cast<size_t>(id)];
  }
  const Tensor& info(TensorId id) const { return graph.tensor(id); }
};

std::vector<TensorData> run(const Graph& graph, const Op& op, const std::vector<TensorData>& inputs,
                            const DeviceContext& device = {}) {
  std::vector<const TensorData*> in;
  for (const TensorData& data : inputs) {
    in.push_back(&data);
  }
  std::vector<TensorData> out;
  for (const TensorId id : op.outputs) {
    out.push_back(TensorData::zeros(graph.tensor(id)));
  }
  std::vector<TensorData*> out_pointers;
  for (TensorData& data : out) {
    out_pointers.push_back(&data);
  }
  run_kernel(graph, op, in, out_pointers, device);
  return out;
}

TensorData random_data(const Tensor& tensor, std::mt19937& rng, float low = -1, float high = 1) {
  TensorData data = TensorData::zeros(tensor);
  std::uniform_real_distribution<float> uniform(low, high);
  for (float& value : data.values) {
    value = uniform(rng);
  }
  return data;
}

TensorData random_ints(const Tensor& tensor, std::mt19937& rng, int high) {
  TensorData data = TensorData::zeros(tensor);
  std::uniform_int_distribution<int> uniform(0, high - 1);
  for (float& value : data.values) {
    value = static_cast<float>(uniform(rng));
  }
  return data;
}

// Elements [begin, begin + count) of `axis`.
TensorData slice(const TensorData& data, size_t axis, int64_t begin, int64_t count) {
  std::vector<int64_t> shape = data.shape;
  shape[axis] = count;
  TensorData result = TensorData::zeros(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t flat = 0; flat < result.size(); ++flat) {
    std::vector<int64_t> source = index;
    source[axis] += begin;
    result.values[static_cast<size_t>(flat)] = data.at(source);
    for (size_t d = shape.size(); d > 0; --d) {
      if (++index[d - 1] < shape[d - 1]) {
        break;
      }
      index[d - 1] = 0;
    }
  }
  return result;
}

// max |a - b| / max(max |b|, floor).
double max_relative_error(const std::vector<float>& a, const std::vector<double>& b,
                          double floor = 1e-6) {
  EXPECT_EQ(a.size(), b.size());
  double error = 0;
  double scale = floor;
  for (size_t index = 0; index < std::min(a.size(), b.size()); ++index) {
    error = std::max(error, std::abs(static_cast<double>(a[index]) - b[index]));
    scale = std::max(scale, std::abs(b[index]));
  }
  return error / scale;
}

std::vector<double> as_double(const TensorData& data) {
  return {data.values.begin(), data.values.end()};
}

void expect_close(const TensorData& actual, const std::vector<double>& expected,
                  double tolerance = 1e-5) {
  EXPECT_EQ(actual.size(), static_cast<int64_t>(expected.size()));
  EXPECT_LT(max_relative_error(actual.values, expected), tolerance);
}

void expect_close(const TensorData& actual, const TensorData& expected, double tolerance = 1e-5) {
  EXPECT_EQ(actual.shape, expected.shape);
  expect_close(actual, as_double(expected), tolerance);
}

// --- finite differences ---------------------------------------------------------------------

// Largest finite-difference error seen per check name (printed at the end of the run).
std::map<std::string, double>& fd_errors() {
  static std::map<std::string, double> errors;
  return errors;
}

class FdReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [name, error] : fd_errors()) {
      std::printf("[fd] %-34s max error %.2e\n", name.c_str(), error);
    }
  }
};
const auto* const kFdReport = ::testing::AddGlobalTestEnvironment(new FdReport);

// Checks `analytic` = d/d inputs[which] of L = sum(weights * forward(inputs)) by central
// differences (double accumulation; each step is the float-rounded one actually taken). Only
// elements with perturbed(index) are checked.
void expect_fd(const std::string& name, const Graph& graph, const Op& forward,
               std::vector<TensorData> inputs, const std::vector<TensorData>& weights, size_t which,
               const TensorData& analytic, const DeviceContext& device = {}, double step = 1e-2,
               const std::function<bool(int64_t)>& perturbed = nullptr) {
  auto loss = [&](const std::vector<TensorData>& values) {
    const std::vector<TensorData> outputs = run(graph, forward, values, device);
    double total = 0;
    for (size_t out = 0; out < outputs.size(); ++out) {
      for (size_t index = 0; index < outputs[out].values.size(); ++index) {
        total += static_cast<double>(outputs[out].values[index]) * weights[out].values[index];
      }
    }
    return total;
  };
  ASSERT_EQ(analytic.shape, inputs[which].shape) << name;
  std::vector<float> checked;
  std::vector<double> numeric;
  for (int64_t index = 0; index < inputs[which].size(); ++index) {
    if (perturbed && !perturbed(index)) {
      continue;
    }
    float& value = inputs[which].values[static_cast<size_t>(index)];
    const float original = value;
    const auto plus = static_cast<float>(original + step);
    const auto minus = static_cast<float>(original - step);
    value = plus;
    const double up = loss(inputs);
    value = minus;
    const double down = loss(inputs);
    value = original;
    numeric.push_back((up - down) / (static_cast<double>(plus) - static_cast<double>(minus)));
    checked.push_back(analytic.values[static_cast<size_t>(index)]);
  }
  const double error = max_relative_error(checked, numeric);
  double& worst = fd_errors()[name];
  worst = std::max(worst, error);
  EXPECT_LT(error, kFdTolerance) << name;
}

std::vector<TensorData> random_weights(const Graph& graph, const Op& op, std::mt19937& rng) {
  std::vector<TensorData> weights;
  for (const TensorId id : op.outputs) {
    weights.push_back(random_data(graph.tensor(id), rng));
  }
  return weights;
}

float to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits = (bits + 0x7fffu + lsb) & 0xffff0000u;
  return std::bit_cast<float>(bits);
}

// --- einsum -----------------------------------------------------------------------------------

// Explicit loops over every named index.
std::vector<double> naive_einsum(const Tensor& a, const TensorData& a_values, const Tensor& b,
                                 const TensorData& b_values, const Tensor& c, bool bf16) {
  std::vector<std::string> names;
  std::map<std::string, int64_t> sizes;
  for (const Tensor* tensor : {&a, &b, &c}) {
    for (const Dim& d : tensor->dims) {
      if (!sizes.contains(d.name)) {
        names.push_back(d.name);
        sizes[d.name] = d.size;
      }
    }
  }
  std::vector<double> result(static_cast<size_t>(TensorData::zeros(c).size()), 0.0);
  std::map<std::string, int64_t> index;
  for (const std::string& name : names) {
    index[name] = 0;
  }
  auto pick = [&](const Tensor& tensor) {
    std::vector<int64_t> position;
    for (const Dim& d : tensor.dims) {
      position.push_back(index[d.name]);
    }
    return position;
  };
  auto round = [&](float value) { return bf16 ? to_bf16(value) : value; };
  for (;;) {
    const double product = static_cast<double>(round(a_values.at(pick(a)))) *
                           static_cast<double>(round(b_values.at(pick(b))));
    result[static_cast<size_t>(TensorData::zeros(c).offset(pick(c)))] += product;
    size_t d = names.size();
    for (;;) {
      if (d == 0) {
        return result;
      }
      --d;
      if (++index[names[d]] < sizes[names[d]]) {
        break;
      }
      index[names[d]] = 0;
    }
  }
}

// What autodiff contracts for the gradient einsum producing `out` from a and b.
std::vector<std::string> contracted_for(const Tensor& a, const Tensor& b, const Tensor& out) {
  std::vector<std::string> result;
  for (const Tensor* tensor : {&a, &b}) {
    for (const Dim& d : tensor->dims) {
      if (out.dim_index(d.name) < 0 &&
          std::find(result.begin(), result.end(), d.name) == result.end()) {
        result.push_back(d.name);
      }
    }
  }
  return result;
}

struct EinsumCase {
  const char* name;
  std::vector<Dim> a, b, c;
  std::vector<std::string> contracted;
};

std::vector<EinsumCase> einsum_cases() {
  return {
      {"projection",
       {dim("batch", 2), dim("length", 3), dim("embed", 4)},
       {dim("embed", 4), dim("mlp", 5)},
       {dim("batch", 2), dim("length", 3), dim("mlp", 5)},
       {"embed"}},
      {"permuted_batch",
       {dim("k", 3), dim("experts", 2), dim("m", 4)},
       {dim("n", 5), dim("k", 3), dim("experts", 2)},
       {dim("m", 4), dim("experts", 2), dim("n", 5)},
       {"k"}},
      {"two_contracted",
       {dim("batch", 2), dim("length", 3), dim("heads", 2), dim("head_dim", 3)},
       {dim("heads", 2), dim("head_dim", 3), dim("embed", 4)},
       {dim("batch", 2), dim("length", 3), dim("embed", 4)},
       {"heads", "head_dim"}},
      {"weight_grad",
       {dim("batch", 2), dim("length", 3), dim("mlp", 4)},
       {dim("batch", 2), dim("length", 3), dim("embed", 5)},
       {dim("embed", 5), dim("mlp", 4)},
       {"batch", "length"}},
  };
}

TEST(KernelEinsum, MatchesExplicitLoops) {
  std::mt19937 rng(1);
  std::vector<EinsumCase> cases = einsum_cases();
  // A contracted dim present in only one operand is summed out of it first.
  cases.push_back({"one_sided_contraction",
                   {dim("x", 3), dim("k", 4)},
                   {dim("k", 4), dim("n", 2)},
                   {dim("n", 2)},
                   {"x", "k"}});
  for (const EinsumCase& test : cases) {
    for (const bool bf16 : {false, true}) {
      Case c;
      const TensorId a = c.tensor("a", test.a);
      const TensorId b = c.tensor("b", test.b);
      const TensorId out = c.tensor("c", test.c);
      OpAttrs attrs;
      attrs.contracted = test.contracted;
      const Op& op = c.op(OpKind::kEinsum, {a, b}, {out}, attrs);
      const TensorData a_values = random_data(c.info(a), rng);
      const TensorData b_values = random_data(c.info(b), rng);
      DeviceContext device;
      device.bf16_matmul_inputs = bf16;
      const TensorData result = run(c.graph, op, {a_values, b_values}, device)[0];
      SCOPED_TRACE(std::string(test.name) + (bf16 ? " bf16" : " fp32"));
      expect_close(result,
                   naive_einsum(c.info(a), a_values, c.info(b), b_values, c.info(out), bf16));
      if (bf16) {
        const std::vector<double> exact =
            naive_einsum(c.info(a), a_values, c.info(b), b_values, c.info(out), false);
        EXPECT_GT(max_relative_error(result.values, exact), 1e-5);  // rounding is visible
      }
    }
  }
}

TEST(KernelEinsum, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(2);
  for (const EinsumCase& test : einsum_cases()) {
    Case c;
    const TensorId a = c.tensor("a", test.a);
    const TensorId b = c.tensor("b", test.b);
    const TensorId out = c.tensor("c", test.c);
    OpAttrs attrs;
    attrs.contracted = test.contracted;
    const Op& forward = c.op(OpKind::kEinsum, {a, b}, {out}, attrs);
    const TensorId dc = c.tensor("dc", test.c);
    const TensorId da = c.tensor("da", test.a);
    const TensorId db = c.tensor("db", test.b);
    OpAttrs grad_a;
    grad_a.contracted = contracted_for(c.info(dc), c.info(b), c.info(da));
    OpAttrs grad_b;
    grad_b.contracted = contracted_for(c.info(dc), c.info(a), c.info(db));
    const Op& op_a = c.op(OpKind::kEinsum, {dc, b}, {da}, grad_a, true);
    const Op& op_b = c.op(OpKind::kEinsum, {dc, a}, {db}, grad_b, true);
    const std::vector<TensorData> inputs = {random_data(c.info(a), rng),
                                            random_data(c.info(b), rng)};
    const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
    const TensorData analytic_a = run(c.graph, op_a, {weights[0], inputs[1]})[0];
    const TensorData analytic_b = run(c.graph, op_b, {weights[0], inputs[0]})[0];
    expect_fd("einsum dA", c.graph, forward, inputs, weights, 0, analytic_a);
    expect_fd("einsum dB", c.graph, forward, inputs, weights, 1, analytic_b);
  }
}

// --- elementwise ------------------------------------------------------------------------------

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

std::vector<Dim> activation_dims() {
  return {dim("batch", 2), dim("length", 3), dim("embed", 4)};
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

// --- norms ------------------------------------------------------------------------------------

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

// --- rope -------------------------------------------------------------------------------------

constexpr double kRopeTimescale = 10000;

std::vector<Dim> rope_dims(int64_t length) {
  return {dim("batch", 2), dim("length", length), dim("heads", 2), dim("head_dim", 8)};
}

TEST(KernelRope, ForwardMatchesFormulaAndBackwardInverts) {
  std::mt19937 rng(8);
  Case c;
  const TensorId x = c.tensor("x", rope_dims(6));
  const TensorId y = c.tensor("y", rope_dims(6));
  const TensorId back = c.tensor("back", rope_dims(6));
  OpAttrs attrs;
  attrs.rope_max_timescale = kRopeTimescale;
  const Op& forward = c.op(OpKind::kRope, {x}, {y}, attrs);
  const Op& backward = c.op(OpKind::kRope, {y}, {back}, attrs, true);
  const TensorData input = random_data(c.info(x), rng);
  const TensorData result = run(c.graph, forward, {input})[0];
  std::vector<double> expected(input.values.size());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t l = 0; l < 6; ++l) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < 4; ++i) {
          const double timescale = std::pow(kRopeTimescale, 2.0 * static_cast<double>(i) / 8.0);
          const double angle = static_cast<double>(l) / timescale;
          const double first = input.at({b, l, h, i});
          const double second = input.at({b, l, h, i + 4});
          expected[static_cast<size_t>(input.offset({b, l, h, i}))] =
              first * std::cos(angle) - second * std::sin(angle);
          expected[static_cast<size_t>(input.offset({b, l, h, i + 4}))] =
              second * std::cos(angle) + first * std::sin(angle);
        }
      }
    }
  }
  expect_close(result, expected);
  expect_close(run(c.graph, backward, {result})[0], input);  // rotating back recovers x
}

TEST(KernelRope, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(9);
  Case c;
  const TensorId x = c.tensor("x", rope_dims(5));
  const TensorId y = c.tensor("y", rope_dims(5));
  const TensorId dy = c.tensor("dy", rope_dims(5));
  const TensorId dx = c.tensor("dx", rope_dims(5));
  OpAttrs attrs;
  attrs.rope_max_timescale = kRopeTimescale;
  const Op& forward = c.op(OpKind::kRope, {x}, {y}, attrs);
  const Op& backward = c.op(OpKind::kRope, {dy}, {dx}, attrs, true);
  const std::vector<TensorData> inputs = {random_data(c.info(x), rng)};
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  expect_fd("rope backward", c.graph, forward, inputs, weights, 0,
            run(c.graph, backward, {weights[0]})[0]);
}

TEST(KernelRope, SplitLengthUsesGlobalPositions) {
  std::mt19937 rng(10);
  Case c;
  const TensorId x = c.tensor("x", rope_dims(6));
  const TensorId y = c.tensor("y", rope_dims(6));
  std::vector<Dim> local_dims = rope_dims(6);
  local_dims[1] = split("length", 3, 6, "context");
  const TensorId local_x = c.tensor("local_x", local_dims);
  const TensorId local_y = c.tensor("local_y", local_dims);
  OpAttrs attrs;
  attrs.rope_max_timescale = kRopeTimescale;
  const Op& whole = c.op(OpKind::kRope, {x}, {y}, attrs);
  const Op& local = c.op(OpKind::kRope, {local_x}, {local_y}, attrs);
  const TensorData input = random_data(c.info(x), rng);
  const TensorData expected = run(c.graph, whole, {input})[0];
  for (int device = 0; device < 2; ++device) {
    expect_close(
        run(c.graph, local, {slice(input, 1, device * 3, 3)}, device_on("context", device, 2))[0],
        slice(expected, 1, device * 3, 3));
  }
}

// --- attention --------------------------------------------------------------------------------

struct AttentionCase {
  const char* name;
  int64_t heads = 2;
  int64_t kv_heads = 2;
  AttentionMask mask = AttentionMask::kCausal;
  int64_t window = 0;
  bool mla = false;
  int64_t key_dim = 4;    // D_k (MLA: the nope part)
  int64_t rope_dim = 0;   // MLA: R
  int64_t value_dim = 4;  // D_v
  double soft_cap = 0;    // attn_logits_soft_cap: scaled logits s -> cap tanh(s / cap)
};

std::vector<AttentionCase> attention_cases() {
  return {
      {"gqa_causal", 4, 2, AttentionMask::kCausal, 0, false, 4, 0, 4},
      {"sliding_window", 2, 1, AttentionMask::kSlidingWindow, 2, false, 4, 0, 3},
      {"chunked", 2, 2, AttentionMask::kChunked, 2, false, 4, 0, 4},
      {"no_mask", 2, 2, AttentionMask::kNone, 0, false, 3, 0, 4},
      {"mla_causal", 2, 2, AttentionMask::kCausal, 0, true, 3, 2, 3},
      // A cap of 0.5 against scaled logits up to ~2: tanh far from linear.
      {"gqa_soft_cap", 4, 2, AttentionMask::kCausal, 0, false, 4, 0, 4, 0.5},
  };
}

// Tensors of an attention case; `query_length` may be a split dim.
struct AttentionGraph {
  Case c;
  TensorId q, k, v, k_rope = -1, out;
  std::vector<TensorId> inputs() const {
    std::vector<TensorId> ids = {q, k, v};
    if (k_rope >= 0) {
      ids.push_back(k_rope);
    }
    return ids;
  }
};

void add_attention_tensors(AttentionGraph& g, const AttentionCase& test, const Dim& query_length,
                           int64_t length, const std::string& prefix) {
  const int64_t qk = test.key_dim + test.rope_dim;
  const std::string kv_heads = test.mla ? "heads" : "kv_heads";
  const std::string qk_name = test.mla ? "qk_head_dim" : "head_dim";
  const std::string k_name = test.mla ? "qk_nope" : "head_dim";
  const std::string v_name = test.mla || test.value_dim != test.key_dim ? "v_head_dim" : "head_dim";
  Case& c = g.c;
  g.q = c.tensor(prefix + "q",
                 {dim("batch", 2), query_length, dim("heads", test.heads), dim(qk_name, qk)});
  g.k = c.tensor(prefix + "k", {dim("batch", 2), dim("length", length),
                                dim(kv_heads, test.kv_heads), dim(k_name, test.key_dim)});
  g.v = c.tensor(prefix + "v", {dim("batch", 2), dim("length", length),
                                dim(kv_heads, test.kv_heads), dim(v_name, test.value_dim)});
  if (test.mla) {
    g.k_rope = c.tensor(prefix + "k_rope",
                        {dim("batch", 2), dim("length", length), dim("qk_rope", test.rope_dim)});
  }
  g.out = c.tensor(prefix + "out", {dim("batch", 2), query_length, dim("heads", test.heads),
                                    dim(v_name, test.value_dim)});
}

// Scaled as a runtime-scaling family would (1/sqrt(D_qk)): a scale other than 1 exercises the
// scale in the forward and in every gradient.
double attention_scale(const AttentionCase& test) {
  return 1 / std::sqrt(static_cast<double>(test.key_dim + test.rope_dim));
}

OpAttrs attention_attrs(const AttentionCase& test) {
  OpAttrs attrs;
  attrs.mask = test.mask;
  attrs.window = test.window;
  attrs.attention_scale = attention_scale(test);
  attrs.logit_soft_cap = test.soft_cap;
  return attrs;
}

// Explicit softmax attention over whole tensors.
std::vector<double> reference_attention(const AttentionCase& test,
                                        const std::vector<TensorData>& in, int64_t length) {
  const TensorData& q = in[0];
  const TensorData& k = in[1];
  const TensorData& v = in[2];
  const int64_t group = test.heads / test.kv_heads;
  const double scale = attention_scale(test);
  std::vector<double> out(static_cast<size_t>(2 * length * test.heads * test.value_dim), 0.0);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < test.heads; ++h) {
      const int64_t kv = h / group;
      for (int64_t i = 0; i < length; ++i) {
        std::vector<double> scores(static_cast<size_t>(length), -kInfinity);
        double max = -kInfinity;
        for (int64_t j = 0; j < length; ++j) {
          const bool in_window =
              test.mask == AttentionMask::kCausal ||
              (test.mask == AttentionMask::kSlidingWindow && i - j < test.window) ||
              (test.mask == AttentionMask::kChunked && j / test.window == i / test.window);
          const bool allowed = test.mask == AttentionMask::kNone || (j <= i && in_window);
          if (!allowed) {
            continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < test.key_dim; ++d) {
            dot += double{q.at({b, i, h, d})} * k.at({b, j, kv, d});
          }
          for (int64_t r = 0; r < test.rope_dim; ++r) {
            dot += double{q.at({b, i, h, test.key_dim + r})} * in[3].at({b, j, r});
          }
          double logit = dot * scale;
          if (test.soft_cap > 0) {
            logit = test.soft_cap * std::tanh(logit / test.soft_cap);
          }
          scores[static_cast<size_t>(j)] = logit;
          max = std::max(max, logit);
        }
        double sum = 0;
        for (double& score : scores) {
          score = std::exp(score - max);
          sum += score;
        }
        for (int64_t j = 0; j < length; ++j) {
          for (int64_t d = 0; d < test.value_dim; ++d) {
            out[static_cast<size_t>(((b * length + i) * test.heads + h) * test.value_dim + d)] +=
                scores[static_cast<size_t>(j)] / sum * v.at({b, j, kv, d});
          }
        }
      }
    }
  }
  return out;
}

std::vector<TensorData> random_inputs(const Case& c, const std::vector<TensorId>& ids,
                                      std::mt19937& rng) {
  std::vector<TensorData> values;
  for (const TensorId id : ids) {
    values.push_back(random_data(c.info(id), rng));
  }
  return values;
}

TEST(KernelAttention, ForwardMatchesExplicitSoftmax) {
  std::mt19937 rng(11);
  const int64_t length = 6;
  for (const AttentionCase& test : attention_cases()) {
    SCOPED_TRACE(test.name);
    AttentionGraph g;
    add_attention_tensors(g, test, dim("length", length), length, "");
    const Op& op = g.c.op(OpKind::kAttention, g.inputs(), {g.out}, attention_attrs(test));
    const std::vector<TensorData> inputs = random_inputs(g.c, g.inputs(), rng);
    expect_close(run(g.c.graph, op, inputs)[0], reference_attention(test, inputs, length));
  }
}

// Queries split over "context" (3 of 6 per device, keys whole): each device's rows match the
// whole output, and its dk/dv partial sums add up to the whole gradient.
TEST(KernelAttention, SplitQueryLengthMatchesWhole) {
  std::mt19937 rng(12);
  const int64_t length = 6;
  for (const AttentionCase& test : attention_cases()) {
    SCOPED_TRACE(test.name);
    AttentionGraph whole;
    add_attention_tensors(whole, test, dim("length", length), length, "");
    AttentionGraph local;
    add_attention_tensors(local, test, split("length", 3, length, "context"), length, "");
    const Op& whole_op =
        whole.c.op(OpKind::kAttention, whole.inputs(), {whole.out}, attention_attrs(test));
    const Op& local_op =
        local.c.op(OpKind::kAttention, local.inputs(), {local.out}, attention_attrs(test));
    auto grad_op = [&](AttentionGraph& g) -> const Op& {
      std::vector<TensorId> in = {g.c.tensor("dout", g.c.info(g.out).dims)};
      std::vector<TensorId> out;
      for (const TensorId id : g.inputs()) {
        in.push_back(id);
        out.push_back(g.c.tensor(g.c.info(id).name + "/grad", g.c.info(id).dims));
      }
      in.push_back(g.out);
      return g.c.op(OpKind::kAttentionGrad, in, out, attention_attrs(test), true);
    };
    const Op& whole_grad = grad_op(whole);
    const Op& local_grad = grad_op(local);
    const std::vector<TensorData> inputs = random_inputs(whole.c, whole.inputs(), rng);
    const TensorData out = run(whole.c.graph, whole_op, inputs)[0];
    const TensorData dout = random_data(whole.c.info(whole.out), rng);
    std::vector<TensorData> grad_inputs = {dout};
    grad_inputs.insert(grad_inputs.end(), inputs.begin(), inputs.end());
    grad_inputs.push_back(out);
    const std::vector<TensorData> grads = run(whole.c.graph, whole_grad, grad_inputs);
    std::vector<TensorData> key_sums;
    for (size_t index = 1; index < grads.size(); ++index) {
      key_sums.push_back(TensorData::zeros(grads[index].shape));
    }
    for (int device = 0; device < 2; ++device) {
      const DeviceContext context = device_on("context", device, 2);
      std::vector<TensorData> local_inputs = inputs;
      local_inputs[0] = slice(inputs[0], 1, device * 3, 3);
      const TensorData local_out = run(local.c.graph, local_op, local_inputs, context)[0];
      expect_close(local_out, slice(out, 1, device * 3, 3));
      std::vector<TensorData> local_grad_inputs = {slice(dout, 1, device * 3, 3)};
      local_grad_inputs.insert(local_grad_inputs.end(), local_inputs.begin(), local_inputs.end());
      local_grad_inputs.push_back(local_out);
      const std::vector<TensorData> local_grads =
          run(local.c.graph, local_grad, local_grad_inputs, context);
      expect_close(local_grads[0], slice(grads[0], 1, device * 3, 3));
      for (size_t index = 1; index < local_grads.size(); ++index) {
        for (size_t e = 0; e < key_sums[index - 1].values.size(); ++e) {
          key_sums[index - 1].values[e] += local_grads[index].values[e];
        }
      }
    }
    for (size_t index = 1; index < grads.size(); ++index) {
      expect_close(key_sums[index - 1], grads[index]);
    }
  }
}

TEST(KernelAttention, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(13);
  const int64_t length = 5;
  for (const AttentionCase& test : attention_cases()) {
    AttentionGraph g;
    add_attention_tensors(g, test, dim("length", length), length, "");
    const Op& forward = g.c.op(OpKind::kAttention, g.inputs(), {g.out}, attention_attrs(test));
    const TensorId dout = g.c.tensor("dout", g.c.info(g.out).dims);
    std::vector<TensorId> grad_in = {dout};
    std::vector<TensorId> grad_out;
    for (const TensorId id : g.inputs()) {
      grad_in.push_back(id);
      grad_out.push_back(g.c.tensor(g.c.info(id).name + "/grad", g.c.info(id).dims));
    }
    grad_in.push_back(g.out);
    const Op& grad = g.c.op(OpKind::kAttentionGrad, grad_in, grad_out, attention_attrs(test), true);
    const std::vector<TensorData> inputs = random_inputs(g.c, g.inputs(), rng);
    const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
    std::vector<TensorData> grad_values = {weights[0]};
    grad_values.insert(grad_values.end(), inputs.begin(), inputs.end());
    grad_values.push_back(run(g.c.graph, forward, inputs)[0]);
    const std::vector<TensorData> analytic = run(g.c.graph, grad, grad_values);
    const std::vector<std::string> names = {"dq", "dk", "dv", "dk_rope"};
    for (size_t index = 0; index < analytic.size(); ++index) {
      expect_fd(std::string("attention ") + (test.mla ? "mla " : "") + names[index], g.c.graph,
                forward, inputs, weights, index, analytic[index]);
    }
  }
}

// --- embedding --------------------------------------------------------------------------------

std::vector<Dim> token_dims() {
  return {dim("batch", 2), dim("length", 3)};
}

TEST(KernelEmbedding, LookupReadsRowsAndVocabShardsSumToWhole) {
  std::mt19937 rng(14);
  Case c;
  const TensorId tokens = c.tensor("tokens", token_dims(), TensorKind::kInput);
  const TensorId table = c.tensor("table", {dim("vocab", 8), dim("embed", 4)});
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId local_table =
      c.tensor("local_table", {split("vocab", 4, 8, "tensor"), dim("embed", 4)});
  const Op& whole = c.op(OpKind::kEmbeddingLookup, {tokens, table}, {x});
  const TensorId local_x = c.tensor("local_x", activation_dims());
  const Op& local = c.op(OpKind::kEmbeddingLookup, {tokens, local_table}, {local_x});
  const TensorData token_values = random_ints(c.info(tokens), rng, 8);
  const TensorData table_values = random_data(c.info(table), rng);
  const TensorData result = run(c.graph, whole, {token_values, table_values})[0];
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t l = 0; l < 3; ++l) {
      const auto row = static_cast<int64_t>(token_values.at({b, l}));
      for (int64_t e = 0; e < 4; ++e) {
        EXPECT_EQ(result.at({b, l, e}), table_values.at({row, e}));
      }
    }
  }
  TensorData sum = TensorData::zeros(c.info(x));
  for (int device = 0; device < 2; ++device) {
    const TensorData part =
        run(c.graph, local, {token_values, slice(table_values, 0, device * 4, 4)},
            device_on("tensor", device, 2))[0];
    for (size_t index = 0; index < sum.values.size(); ++index) {
      sum.values[index] += part.values[index];
    }
  }
  expect_close(sum, result);
}

TEST(KernelEmbedding, GradientMatchesFiniteDifferencesAndShards) {
  std::mt19937 rng(15);
  Case c;
  const TensorId tokens = c.tensor("tokens", token_dims(), TensorKind::kInput);
  const TensorId table = c.tensor("table", {dim("vocab", 8), dim("embed", 4)});
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId dx = c.tensor("dx", activation_dims());
  const TensorId dtable = c.tensor("dtable", {dim("vocab", 8), dim("embed", 4)});
  const TensorId local_dtable =
      c.tensor("local_dtable", {split("vocab", 4, 8, "tensor"), dim("embed", 4)});
  const Op& forward = c.op(OpKind::kEmbeddingLookup, {tokens, table}, {x});
  const Op& grad = c.op(OpKind::kEmbeddingGrad, {dx, tokens}, {dtable}, {}, true);
  const Op& local_grad = c.op(OpKind::kEmbeddingGrad, {dx, tokens}, {local_dtable}, {}, true);
  TensorData token_values = random_ints(c.info(tokens), rng, 8);
  token_values.values[0] = token_values.values[1];  // a repeated token accumulates
  const std::vector<TensorData> inputs = {token_values, random_data(c.info(table), rng)};
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  const TensorData analytic = run(c.graph, grad, {weights[0], token_values})[0];
  expect_fd("embedding dtable", c.graph, forward, inputs, weights, 1, analytic);
  for (int device = 0; device < 2; ++device) {
    expect_close(
        run(c.graph, local_grad, {weights[0], token_values}, device_on("tensor", device, 2))[0],
        slice(analytic, 0, device * 4, 4));
  }
}

// --- cross-entropy ----------------------------------------------------------------------------

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

// --- MoE --------------------------------------------------------------------------------------

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

TEST(KernelMoe, RouterGradientMatchesFiniteDifferences) {
  std::mt19937 rng(20);
  Case c;
  const std::vector<Dim> logit_dims = {dim("batch", 2), dim("length", 3), dim("experts", 4)};
  const TensorId logits = c.tensor("logits", logit_dims);
  const TensorId routing = c.tensor("routing", routing_dims());
  const TensorId d_routing = c.tensor("d_routing", routing_dims());
  const TensorId d_logits = c.tensor("d_logits", logit_dims);
  OpAttrs attrs;
  attrs.top_k = kTopK;
  const Op& forward = c.op(OpKind::kMoeRouter, {logits}, {routing}, attrs);
  const Op& grad = c.op(OpKind::kRouterGrad, {d_routing, logits}, {d_logits}, attrs, true);
  const std::vector<TensorData> inputs = {separated_logits(c.info(logits), rng)};
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  expect_fd("router d_logits", c.graph, forward, inputs, weights, 0,
            run(c.graph, grad, {weights[0], inputs[0]})[0]);
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

// --- optimizer, slices, errors ----------------------------------------------------------------

TEST(KernelAdam, OneStepMatchesFormula) {
  std::mt19937 rng(23);
  Case c;
  const std::vector<Dim> dims = {dim("embed", 3), dim("mlp", 4)};
  std::vector<TensorId> in;
  std::vector<TensorId> out;
  for (const char* name : {"param", "grad", "mu", "nu"}) {
    in.push_back(c.tensor(name, dims));
  }
  for (const char* name : {"param'", "mu'", "nu'"}) {
    out.push_back(c.tensor(name, dims));
  }
  const Op& op = c.op(OpKind::kAdamUpdate, in, out);
  std::vector<TensorData> values = random_inputs(c, in, rng);
  for (float& value : values[3].values) {
    value = std::abs(value);  // nu >= 0
  }
  DeviceContext device;
  device.optimizer.learning_rate = 0.01;
  device.optimizer.step = 3;
  device.optimizer.b1 = 0.9;
  device.optimizer.b2 = 0.95;
  device.optimizer.eps = 1e-8;
  device.optimizer.eps_root = 1e-10;
  device.optimizer.weight_decay = 0.1;
  device.optimizer.gradient_scale = 0.5;
  const std::vector<TensorData> result = run(c.graph, op, values, device);
  std::vector<double> param;
  std::vector<double> mu;
  std::vector<double> nu;
  for (size_t i = 0; i < values[0].values.size(); ++i) {
    const double g = values[1].values[i] * 0.5;
    const double m = 0.9 * values[2].values[i] + 0.1 * g;
    const double v = 0.95 * values[3].values[i] + 0.05 * g * g;
    const double mhat = m / (1 - std::pow(0.9, 3));
    const double vhat = v / (1 - std::pow(0.95, 3));
    param.push_back(values[0].values[i] -
                    0.01 * (mhat / (std::sqrt(vhat + 1e-10) + 1e-8) + 0.1 * values[0].values[i]));
    mu.push_back(m);
    nu.push_back(v);
  }
  expect_close(result[0], param, 1e-6);
  expect_close(result[1], mu, 1e-6);
  expect_close(result[2], nu, 1e-6);
}

TEST(KernelSlice, KeepsThisDevicesPartAndPadsPastTheEnd) {
  std::mt19937 rng(24);
  Case c;
  const TensorId x = c.tensor("x", {dim("rows", 2), dim("embed", 5)});
  const TensorId y = c.tensor("y", {dim("rows", 2), split("embed", 3, 5, "tensor")});
  const Op& op = c.op(OpKind::kDynamicSlice, {x}, {y});
  const TensorData input = random_data(c.info(x), rng);
  const TensorData first = run(c.graph, op, {input}, device_on("tensor", 0, 2))[0];
  expect_close(first, slice(input, 1, 0, 3));
  const TensorData second = run(c.graph, op, {input}, device_on("tensor", 1, 2))[0];
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(second.at({r, 0}), input.at({r, 3}));
    EXPECT_EQ(second.at({r, 1}), input.at({r, 4}));
    EXPECT_EQ(second.at({r, 2}), 0.0f);  // padding
  }
}

// kHostOffload and kHostLoad (remat policy "offload") move a tensor to host memory and back: in
// the functional engine a copy, bit for bit, of every element.
TEST(KernelHostTransfer, OffloadAndLoadCopyEveryValue) {
  std::mt19937 rng(25);
  Case c;
  const std::vector<Dim> dims = {dim("batch", 2), dim("length", 3), dim("embed", 4)};
  const TensorId x = c.tensor("x", dims);
  const TensorId on_host = c.tensor("on_host", dims);
  const TensorId back = c.tensor("back", dims);
  const Op& offload = c.op(OpKind::kHostOffload, {x}, {on_host});
  const Op& load = c.op(OpKind::kHostLoad, {on_host}, {back});
  const TensorData input = random_data(c.info(x), rng);
  const TensorData stored = run(c.graph, offload, {input})[0];
  const TensorData loaded = run(c.graph, load, {stored})[0];
  EXPECT_EQ(stored.shape, input.shape);
  EXPECT_EQ(stored.values, input.values);
  EXPECT_EQ(loaded.values, input.values);
}

// kReduceSum over the dims its output lacks, whatever their order: x[b, l, h] summed over b and
// l gives y[h] = sum_{b,l} x[b, l, h]; values chosen so each sum is known by hand.
TEST(ReduceSumKernel, SumsTheDimsTheOutputLacks) {
  Case c;
  const TensorId x = c.tensor("x", {dim("batch", 2), dim("length", 3), dim("heads", 2)});
  const TensorId y = c.tensor("y", {dim("heads", 2)});
  OpAttrs attrs;
  attrs.contracted = {"batch", "length"};
  const Op& op = c.op(OpKind::kReduceSum, {x}, {y}, attrs);
  TensorData input = TensorData::zeros(c.info(x));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t l = 0; l < 3; ++l) {
      input.at({b, l, 0}) = static_cast<float>(1 + l);         // 2 x (1 + 2 + 3) = 12
      input.at({b, l, 1}) = static_cast<float>(10 * (b + 1));  // 3 x (10 + 20) = 90
    }
  }
  const std::vector<TensorData> out = run(c.graph, op, {input});
  EXPECT_EQ(out[0].at({0}), 12.0f);
  EXPECT_EQ(out[0].at({1}), 90.0f);
}

TEST(KernelErrors, CollectivesAndShapeMismatchesThrow) {
  Case c;
  const TensorId a = c.tensor("a", {dim("m", 2), dim("k", 3)});
  const TensorId b = c.tensor("b", {dim("k", 4), dim("n", 2)});
  const TensorId out = c.tensor("out", {dim("m", 2), dim("n", 2)});
  const TensorId b_ok = c.tensor("b_ok", {dim("k", 3), dim("n", 2)});
  for (const OpKind kind : {OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kAllReduce,
                            OpKind::kAllToAll, OpKind::kCollectivePermute}) {
    const Op& op = c.op(kind, {a}, {c.tensor("collective_out", c.info(a).dims)});
    EXPECT_THROW(run(c.graph, op, {TensorData::zeros(c.info(a))}), std::logic_error);
  }
  OpAttrs attrs;
  attrs.contracted = {"k"};
  const Op& mismatched = c.op(OpKind::kEinsum, {a, b}, {out}, attrs);
  EXPECT_THROW(
      run(c.graph, mismatched, {TensorData::zeros(c.info(a)), TensorData::zeros(c.info(b))}),
      std::logic_error);
  const Op& good =
      c.op(OpKind::kEinsum, {a, b_ok}, {c.tensor("good_out", c.info(out).dims)}, attrs);
  // Data whose shape does not match the tensor's local dims.
  EXPECT_THROW(
      run(c.graph, good,
          {TensorData::zeros(std::vector<int64_t>{2, 4}), TensorData::zeros(c.info(b_ok))}),
      std::logic_error);
  EXPECT_NO_THROW(
      run(c.graph, good, {TensorData::zeros(c.info(a)), TensorData::zeros(c.info(b_ok))}));
}

// Every op kind the tests above run through run_kernel, with the tests that run it. List a kind
// only with a test case that really executes it (forward against a reference, a finite-difference
// check of a VJP, or a split-vs-whole comparison).
struct CoveredKind {
  OpKind kind;
  const char* tests;
};
constexpr CoveredKind kCoveredOpKinds[] = {
    {OpKind::kEinsum, "KernelEinsum.*, KernelMoe.GroupedMatmul*"},
    {OpKind::kElementwise, "KernelElementwise.*"},
    {OpKind::kReduceSum, "ReduceSumKernel.SumsTheDimsTheOutputLacks"},
    {OpKind::kRmsNorm, "KernelNorm.*"},
    {OpKind::kLayerNorm, "KernelNorm.*"},
    {OpKind::kNormGrad, "KernelNorm.GradientsMatchFiniteDifferences, KernelNorm.Split*"},
    {OpKind::kNormStatistics, "KernelNorm.SplitReducedDimWithStatisticsMatchesWhole"},
    {OpKind::kRope, "KernelRope.*"},
    {OpKind::kAttention, "KernelAttention.*"},
    {OpKind::kAttentionGrad,
     "KernelAttention.SplitQueryLengthMatchesWhole, KernelAttention.Gradients*"},
    {OpKind::kEmbeddingLookup, "KernelEmbedding.*"},
    {OpKind::kEmbeddingGrad, "KernelEmbedding.GradientMatchesFiniteDifferencesAndShards"},
    {OpKind::kCrossEntropy, "KernelCrossEntropy.*"},
    {OpKind::kCrossEntropyStatistics, "KernelCrossEntropy.VocabShardsWithStatisticsMatchWhole"},
    {OpKind::kCrossEntropyGrad, "KernelCrossEntropy.*"},
    {OpKind::kMoeRouter, "KernelMoe.Router*"},
    {OpKind::kRouterGrad, "KernelMoe.RouterGradient*, KernelMoe.VjpsMatchFiniteDifferences"},
    {OpKind::kMoeDispatch, "KernelMoe.DispatchAndCombineFollowSlots, KernelMoe.Dropless*"},
    {OpKind::kMoeCombine, "KernelMoe.DispatchAndCombineFollowSlots, KernelMoe.Dropless*"},
    {OpKind::kAdamUpdate, "KernelAdam.OneStepMatchesFormula"},
    {OpKind::kDynamicSlice, "KernelSlice.KeepsThisDevicesPartAndPadsPastTheEnd"},
    {OpKind::kHostOffload, "KernelHostTransfer.OffloadAndLoadCopyEveryValue"},
    {OpKind::kHostLoad, "KernelHostTransfer.OffloadAndLoadCopyEveryValue"},
};

// A kernel without a test case fails here: every kind of run_kernel's table must be listed in
// kCoveredOpKinds (and so have a test above). Every op kind of the IR (op_kind_name names them
// all, "?" past the last) is a kernel or a collective, so a new kind cannot skip the table either.
TEST(KernelCoverage, EveryKernelOpKindHasATestCase) {
  const std::vector<OpKind> kernel_kinds = kernels::kernel_op_kinds();
  for (const OpKind kind : kernel_kinds) {
    const bool covered = std::any_of(std::begin(kCoveredOpKinds), std::end(kCoveredOpKinds),
                                     [&](const CoveredKind& entry) { return entry.kind == kind; });
    EXPECT_TRUE(covered) << op_kind_name(kind)
                         << " has a kernel but no test case in kernels_test.cpp (write one and "
                            "list it in kCoveredOpKinds)";
  }
  int kinds = 0;
  for (auto kind = OpKind{}; std::string(op_kind_name(kind)) != "?";
       kind = static_cast<OpKind>(static_cast<int>(kind) + 1), ++kinds) {
    const bool has_kernel =
        std::find(kernel_kinds.begin(), kernel_kinds.end(), kind) != kernel_kinds.end();
    EXPECT_NE(has_kernel, is_collective(kind))
        << op_kind_name(kind) << ": every op kind is either a collective or has a kernel";
  }
  EXPECT_EQ(static_cast<size_t>(kinds), kernel_kinds.size() + 5);  // the 5 collectives
}

}  // namespace
}  // namespace tpusim
