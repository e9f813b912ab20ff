// tests/sim/functional/kernels/layout_test.cpp: the layout kernels
// (sim/functional/kernels/layout.cpp). Dynamic slices (a device's part, padded past the end) and
// host offload/load copies.
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

}  // namespace
}  // namespace tpusim::kernel_test
