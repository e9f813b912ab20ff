// tests/sim/functional/kernels/reduce_sum_test.cpp: the reduce sum kernels
// (sim/functional/kernels/reduce_sum.cpp). Sums over the dims the output lacks.
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

}  // namespace
}  // namespace tpusim::kernel_test
