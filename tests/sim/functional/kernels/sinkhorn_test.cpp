// tests/sim/functional/kernels/sinkhorn_test.cpp: the Sinkhorn kernels
// (sim/functional/kernels/sinkhorn.cpp) of DeepSeek-V4's mHC residual matrix: the forward pass
// against a naive loop written here from MaxText's mhc.py `sinkhorn`, the doubly stochastic
// result, and the VJP against finite differences. The method and the helpers:
// kernel_test_support.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

// MaxText mhc.py sinkhorn: eps and the floor of the iterations' sums.
constexpr double kEpsilon = 1e-6;
constexpr double kSumFloor = 1e-12;

std::vector<Dim> matrix_dims(int64_t n) {
  return {dim("batch", 2), dim("length", 3), dim("streams", n), dim("streams_out", n)};
}

OpAttrs sinkhorn_attrs(int64_t iterations) {
  OpAttrs attrs;
  attrs.epsilon = kEpsilon;
  attrs.sinkhorn_iterations = iterations;
  return attrs;
}

// mhc.py's steps on one n x n matrix m[i][j] (i the row, dim -2; j the column, dim -1).
std::vector<std::vector<double>> naive_sinkhorn(std::vector<std::vector<double>> m,
                                                int64_t iterations) {
  const size_t n = m.size();
  for (auto& row : m) {
    double largest = row[0];
    for (const double value : row) {
      largest = std::max(largest, value);
    }
    double total = 0;
    for (double& value : row) {
      value = std::exp(value - largest);
      total += value;
    }
    for (double& value : row) {
      value = value / total + kEpsilon;
    }
  }
  auto divide_columns = [&](double added, double floor) {
    for (size_t j = 0; j < n; ++j) {
      double total = 0;
      for (size_t i = 0; i < n; ++i) {
        total += m[i][j];
      }
      total = std::max(total + added, floor);
      for (size_t i = 0; i < n; ++i) {
        m[i][j] /= total;
      }
    }
  };
  divide_columns(kEpsilon, 0);
  for (int64_t iteration = 0; iteration < iterations; ++iteration) {
    for (auto& row : m) {
      double total = 0;
      for (const double value : row) {
        total += value;
      }
      total = std::max(total, kSumFloor);
      for (double& value : row) {
        value /= total;
      }
    }
    divide_columns(0, kSumFloor);
  }
  return m;
}

TEST(KernelSinkhorn, ForwardMatchesMaxTextsStepsAndIsDoublyStochastic) {
  std::mt19937 rng(21);
  constexpr int64_t kStreams = 4;
  for (const int64_t iterations : {int64_t{0}, int64_t{1}, int64_t{20}}) {
    Case c;
    const TensorId logits = c.tensor("logits", matrix_dims(kStreams));
    const TensorId out = c.tensor("res", matrix_dims(kStreams));
    const Op& op = c.op(OpKind::kSinkhorn, {logits}, {out}, sinkhorn_attrs(iterations));
    // Logits of a few units, as x W_res scaled: matrices far from uniform.
    const TensorData input = random_data(c.info(logits), rng, -3, 3);
    const TensorData result = run(c.graph, op, {input})[0];
    std::vector<double> expected(input.values.size());
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t l = 0; l < 3; ++l) {
        std::vector<std::vector<double>> m(kStreams, std::vector<double>(kStreams));
        for (int64_t i = 0; i < kStreams; ++i) {
          for (int64_t j = 0; j < kStreams; ++j) {
            m[static_cast<size_t>(i)][static_cast<size_t>(j)] = input.at({b, l, i, j});
          }
        }
        m = naive_sinkhorn(m, iterations);
        for (int64_t i = 0; i < kStreams; ++i) {
          for (int64_t j = 0; j < kStreams; ++j) {
            expected[static_cast<size_t>(input.offset({b, l, i, j}))] =
                m[static_cast<size_t>(i)][static_cast<size_t>(j)];
          }
        }
      }
    }
    expect_close(result, expected);
    // After the column pass every column sums to about 1 (1 - eps / (its sum + eps) before the
    // iterations, which is 1e-5 off for a column of sum 0.1); after 20 iterations the rows too.
    double worst_row = 0;
    double worst_column = 0;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t l = 0; l < 3; ++l) {
        for (int64_t k = 0; k < kStreams; ++k) {
          double row = 0;
          double column = 0;
          for (int64_t other = 0; other < kStreams; ++other) {
            row += result.at({b, l, k, other});
            column += result.at({b, l, other, k});
          }
          worst_row = std::max(worst_row, std::abs(row - 1));
          worst_column = std::max(worst_column, std::abs(column - 1));
        }
      }
    }
    EXPECT_LT(worst_column, 1e-4) << iterations << " iterations";
    if (iterations == 20) {
      EXPECT_LT(worst_row, 1e-4);
    } else {
      EXPECT_GT(worst_row, 1e-3) << "the rows of these logits are not balanced before iterating";
    }
  }
}

TEST(KernelSinkhorn, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(22);
  for (const int64_t streams : {int64_t{2}, int64_t{4}}) {
    for (const int64_t iterations : {int64_t{0}, int64_t{3}, int64_t{20}}) {
      Case c;
      const TensorId logits = c.tensor("logits", matrix_dims(streams));
      const TensorId out = c.tensor("res", matrix_dims(streams));
      const TensorId dy = c.tensor("dy", matrix_dims(streams));
      const TensorId dlogits = c.tensor("dlogits", matrix_dims(streams));
      const OpAttrs attrs = sinkhorn_attrs(iterations);
      const Op& forward = c.op(OpKind::kSinkhorn, {logits}, {out}, attrs);
      const Op& grad = c.op(OpKind::kSinkhornGrad, {dy, logits}, {dlogits}, attrs, true);
      const std::vector<TensorData> inputs = {random_data(c.info(logits), rng, -2, 2)};
      const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
      const TensorData analytic = run(c.graph, grad, {weights[0], inputs[0]})[0];
      expect_fd("sinkhorn " + std::to_string(streams) + "x" + std::to_string(streams) + ", " +
                    std::to_string(iterations) + " iterations",
                c.graph, forward, inputs, weights, 0, analytic, {}, 3e-3);
    }
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
