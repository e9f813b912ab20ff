// tests/sim/functional/kernels/rope_test.cpp: the rope kernels
// (sim/functional/kernels/rope.cpp). Rotary position embedding: forward, its inverse as backward,
// and global positions when the length is split. The method and the helpers: kernel_test_support.h.
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

// rope_position_stride (DeepSeek-V4's compressed blocks rotate at their first token, block c at
// c r): index l of a stride-4 rope turns as position 4 l of a stride-1 one, here index 1 of 2 as
// position 4 of 6 (split over context too: the second device's index 0 is global index 1).
TEST(KernelRope, PositionStrideRotatesIndexByStrideTimesIndex) {
  std::mt19937 rng(11);
  Case c;
  const TensorId x = c.tensor("x", rope_dims(6));
  const TensorId y = c.tensor("y", rope_dims(6));
  std::vector<Dim> block_dims = rope_dims(1);
  block_dims[1] = split("length", 1, 2, "context");
  const TensorId blocks = c.tensor("blocks", block_dims);
  const TensorId rotated = c.tensor("rotated", block_dims);
  OpAttrs attrs;
  attrs.rope_max_timescale = kRopeTimescale;
  const Op& plain = c.op(OpKind::kRope, {x}, {y}, attrs);
  OpAttrs strided = attrs;
  strided.rope_position_stride = 4;
  const Op& block_rope = c.op(OpKind::kRope, {blocks}, {rotated}, strided);
  const TensorData input = random_data(c.info(x), rng);
  const TensorData expected = slice(run(c.graph, plain, {input})[0], 1, 4, 1);
  const TensorData block = slice(input, 1, 4, 1);
  expect_close(run(c.graph, block_rope, {block}, device_on("context", 1, 2))[0], expected);
}

// reverse_rotation (DeepSeek-V4 undoes the values' rotation on the attention output): the
// rotation by -angle, so it undoes the forward rotation, and its VJP is the forward rotation.
TEST(KernelRope, ReverseRotationUndoesTheForwardOne) {
  std::mt19937 rng(31);
  Case c;
  const TensorId x = c.tensor("x", rope_dims(6));
  const TensorId y = c.tensor("y", rope_dims(6));
  const TensorId back = c.tensor("back", rope_dims(6));
  OpAttrs attrs;
  attrs.rope_max_timescale = kRopeTimescale;
  OpAttrs reverse = attrs;
  reverse.reverse_rotation = true;
  const Op& forward = c.op(OpKind::kRope, {x}, {y}, attrs);
  const Op& undo = c.op(OpKind::kRope, {y}, {back}, reverse);
  const TensorData input = random_data(c.info(x), rng);
  const TensorData rotated = run(c.graph, forward, {input})[0];
  expect_close(run(c.graph, undo, {rotated})[0], input);
  // Position 0 has angle 0 (nothing moves); position 1's first pair turns by -1 radian.
  const TensorData reversed = run(c.graph, undo, {input})[0];
  EXPECT_NEAR(reversed.at({0, 0, 0, 0}), input.at({0, 0, 0, 0}), 1e-6);
  EXPECT_NEAR(reversed.at({0, 1, 0, 0}),
              input.at({0, 1, 0, 0}) * std::cos(1.0) + input.at({0, 1, 0, 4}) * std::sin(1.0),
              1e-6);
}

TEST(KernelRope, ReverseRotationBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(32);
  Case c;
  const TensorId x = c.tensor("x", rope_dims(5));
  const TensorId y = c.tensor("y", rope_dims(5));
  const TensorId dy = c.tensor("dy", rope_dims(5));
  const TensorId dx = c.tensor("dx", rope_dims(5));
  OpAttrs attrs;
  attrs.rope_max_timescale = kRopeTimescale;
  attrs.reverse_rotation = true;
  const Op& forward = c.op(OpKind::kRope, {x}, {y}, attrs);
  const Op& backward = c.op(OpKind::kRope, {dy}, {dx}, attrs, true);
  const std::vector<TensorData> inputs = {random_data(c.info(x), rng)};
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  expect_fd("reversed rope backward", c.graph, forward, inputs, weights, 0,
            run(c.graph, backward, {weights[0]})[0]);
}

}  // namespace
}  // namespace tpusim::kernel_test
