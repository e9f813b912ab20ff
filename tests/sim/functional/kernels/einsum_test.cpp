// tests/sim/functional/kernels/einsum_test.cpp: the einsum kernels
// (sim/functional/kernels/einsum.cpp). Einsum over named dims: against explicit loops, and its
// gradient einsums against finite differences. The method and the helpers: kernel_test_support.h.
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

}  // namespace
}  // namespace tpusim::kernel_test
