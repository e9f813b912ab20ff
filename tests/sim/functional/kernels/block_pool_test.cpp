// tests/sim/functional/kernels/block_pool_test.cpp: the block pooling kernels of DeepSeek-V4's
// compressors (sim/functional/kernels/block_pool.cpp): a block worked by hand, an explicit
// softmax over random blocks, the VJP by finite differences, and blocks split over devices; CSA's
// overlapping windows (MaxText's csa_overlap_pooling) worked by hand, against the shifted
// concatenation written out here, and by finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

// kv, gate [batch 2, blocks, block_pos 3, feature 2], bias [block_pos, feature] -> pooled
// [batch, blocks, feature]; `blocks_dim` may be split.
struct PoolGraph {
  Case c;
  TensorId kv, gate, bias, pooled;
  std::vector<TensorId> inputs() const { return {kv, gate, bias}; }
};

constexpr int64_t kPositions = 3;
constexpr int64_t kFeatures = 2;

void add_pool_tensors(PoolGraph& g, const Dim& blocks_dim) {
  const std::vector<Dim> dims = {dim("batch", 2), blocks_dim, dim("block_pos", kPositions),
                                 dim("feature", kFeatures)};
  g.kv = g.c.tensor("kv", dims);
  g.gate = g.c.tensor("gate", dims);
  g.bias = g.c.tensor("bias", {dim("block_pos", kPositions), dim("feature", kFeatures)});
  g.pooled = g.c.tensor("pooled", {dim("batch", 2), blocks_dim, dim("feature", kFeatures)});
}

OpAttrs pool_attrs() {
  OpAttrs attrs;
  attrs.contracted = {"block_pos"};
  return attrs;
}

const Op& grad_op(PoolGraph& g) {
  const TensorId dy = g.c.tensor("dy", g.c.info(g.pooled).dims);
  std::vector<TensorId> outputs;
  for (const TensorId id : g.inputs()) {
    outputs.push_back(g.c.tensor(g.c.info(id).name + "/grad", g.c.info(id).dims));
  }
  return g.c.op(OpKind::kBlockPoolGrad, {dy, g.kv, g.gate, g.bias}, outputs, pool_attrs(), true);
}

// One block of 4 tokens, one feature: gates 0, 0, ln 2, 0 weigh the tokens 1/5, 1/5, 2/5, 1/5,
// so kv 1, 2, 3, 4 pools to (1 + 2 + 6 + 4) / 5 = 2.6; a bias of ln 2 on the first position
// (weights 2/6, 1/6, 2/6, 1/6) gives (2 + 2 + 6 + 4) / 6 = 7/3.
TEST(KernelBlockPool, OneBlockWorkedByHand) {
  for (const double first_bias : {0.0, std::log(2.0)}) {
    Case c;
    const std::vector<Dim> dims = {dim("blocks", 1), dim("block_pos", 4), dim("feature", 1)};
    const TensorId kv = c.tensor("kv", dims);
    const TensorId gate = c.tensor("gate", dims);
    const TensorId bias = c.tensor("bias", {dim("block_pos", 4), dim("feature", 1)});
    const TensorId pooled = c.tensor("pooled", {dim("blocks", 1), dim("feature", 1)});
    const Op& op = c.op(OpKind::kBlockPool, {kv, gate, bias}, {pooled}, pool_attrs());
    TensorData kv_data = TensorData::zeros(c.info(kv));
    kv_data.values = {1, 2, 3, 4};
    TensorData gate_data = TensorData::zeros(c.info(gate));
    gate_data.values = {0, 0, static_cast<float>(std::log(2.0)), 0};
    TensorData bias_data = TensorData::zeros(c.info(bias));
    bias_data.values[0] = static_cast<float>(first_bias);
    const double expected = first_bias == 0.0 ? 2.6 : 7.0 / 3.0;
    const std::vector<TensorData> out = run(c.graph, op, {kv_data, gate_data, bias_data});
    EXPECT_NEAR(out[0].values[0], expected, 1e-6);
  }
}

// Random blocks against an explicit softmax written here.
TEST(KernelBlockPool, ForwardMatchesExplicitSoftmax) {
  std::mt19937 rng(21);
  PoolGraph g;
  add_pool_tensors(g, dim("blocks", 2));
  const Op& op = g.c.op(OpKind::kBlockPool, g.inputs(), {g.pooled}, pool_attrs());
  const std::vector<TensorData> in = random_inputs(g.c, g.inputs(), rng);
  std::vector<double> expected;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t block = 0; block < 2; ++block) {
      for (int64_t f = 0; f < kFeatures; ++f) {
        double norm = 0;
        double sum = 0;
        for (int64_t t = 0; t < kPositions; ++t) {
          const double weight =
              std::exp(double{in[1].at({b, block, t, f})} + double{in[2].at({t, f})});
          norm += weight;
          sum += weight * in[0].at({b, block, t, f});
        }
        expected.push_back(sum / norm);
      }
    }
  }
  expect_close(run(g.c.graph, op, in)[0], expected);
}

TEST(KernelBlockPool, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(22);
  PoolGraph g;
  add_pool_tensors(g, dim("blocks", 2));
  const Op& forward = g.c.op(OpKind::kBlockPool, g.inputs(), {g.pooled}, pool_attrs());
  const Op& grad = grad_op(g);
  // Gates up to +-3: weights far from uniform.
  std::vector<TensorData> inputs = random_inputs(g.c, g.inputs(), rng);
  for (float& value : inputs[1].values) {
    value *= 3;
  }
  const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
  std::vector<TensorData> grad_values = {weights[0]};
  grad_values.insert(grad_values.end(), inputs.begin(), inputs.end());
  const std::vector<TensorData> analytic = run(g.c.graph, grad, grad_values);
  const std::vector<std::string> names = {"dkv", "dgate", "dbias"};
  for (size_t index = 0; index < analytic.size(); ++index) {
    expect_fd("block pool " + names[index], g.c.graph, forward, inputs, weights, index,
              analytic[index]);
  }
}

// Blocks split over "context" (1 of 2 per device): each device's pooled blocks and dkv, dgate
// match the whole ones, and its dbias partial sums add up to the whole gradient.
TEST(KernelBlockPool, SplitBlocksMatchWhole) {
  std::mt19937 rng(23);
  PoolGraph whole;
  add_pool_tensors(whole, dim("blocks", 2));
  PoolGraph local;
  add_pool_tensors(local, split("blocks", 1, 2, "context"));
  const Op& whole_op = whole.c.op(OpKind::kBlockPool, whole.inputs(), {whole.pooled}, pool_attrs());
  const Op& local_op = local.c.op(OpKind::kBlockPool, local.inputs(), {local.pooled}, pool_attrs());
  const Op& whole_grad = grad_op(whole);
  const Op& local_grad = grad_op(local);
  const std::vector<TensorData> in = random_inputs(whole.c, whole.inputs(), rng);
  const TensorData dy = random_data(whole.c.info(whole.pooled), rng);
  const TensorData out = run(whole.c.graph, whole_op, in)[0];
  const std::vector<TensorData> grads = run(whole.c.graph, whole_grad, {dy, in[0], in[1], in[2]});
  TensorData dbias_sum = TensorData::zeros(grads[2].shape);
  for (int device = 0; device < 2; ++device) {
    const DeviceContext context = device_on("context", device, 2);
    const TensorData kv = slice(in[0], 1, device, 1);
    const TensorData gate = slice(in[1], 1, device, 1);
    expect_close(run(local.c.graph, local_op, {kv, gate, in[2]}, context)[0],
                 slice(out, 1, device, 1));
    const std::vector<TensorData> local_grads =
        run(local.c.graph, local_grad, {slice(dy, 1, device, 1), kv, gate, in[2]}, context);
    expect_close(local_grads[0], slice(grads[0], 1, device, 1));
    expect_close(local_grads[1], slice(grads[1], 1, device, 1));
    for (size_t e = 0; e < dbias_sum.values.size(); ++e) {
      dbias_sum.values[e] += local_grads[2].values[e];
    }
  }
  expect_close(dbias_sum, grads[2]);
}

// CSA's overlapping windows: kv, gate [batch 2, blocks 3, positions 2, 2h = 4], bias
// [positions, 2h] -> pooled [batch, blocks, h = 2]; the same tensors as a plain pool's.
using OverlapGraph = PoolGraph;

constexpr int64_t kOverlapBlocks = 3;
constexpr int64_t kOverlapPositions = 2;
constexpr int64_t kHalf = 2;

OpAttrs overlap_attrs() {
  OpAttrs attrs = pool_attrs();
  attrs.overlapping_windows = true;
  return attrs;
}

void add_overlap_tensors(OverlapGraph& g) {
  const std::vector<Dim> dims = {dim("batch", 2), dim("blocks", kOverlapBlocks),
                                 dim("block_pos", kOverlapPositions), dim("feature", 2 * kHalf)};
  g.kv = g.c.tensor("kv", dims);
  g.gate = g.c.tensor("gate", dims);
  g.bias = g.c.tensor("bias", {dim("block_pos", kOverlapPositions), dim("feature", 2 * kHalf)});
  g.pooled = g.c.tensor(
      "pooled", {dim("batch", 2), dim("blocks", kOverlapBlocks), dim("half_feature", kHalf)});
}

// Two blocks of one token, h = 1, gates 0: block 0 pools its second half alone (kv 2), block 1
// block 0's first half (1) and its own second (4) equally: 2.5. A gate of ln 3 on block 0's first
// half weighs it 3:1 in block 1: (3 + 4) / 4 = 1.75.
TEST(KernelBlockPool, OverlappingWindowsWorkedByHand) {
  for (const double first_gate : {0.0, std::log(3.0)}) {
    Case c;
    const std::vector<Dim> dims = {dim("batch", 1), dim("blocks", 2), dim("block_pos", 1),
                                   dim("feature", 2)};
    const TensorId kv = c.tensor("kv", dims);
    const TensorId gate = c.tensor("gate", dims);
    const TensorId bias = c.tensor("bias", {dim("block_pos", 1), dim("feature", 2)});
    const TensorId pooled = c.tensor("pooled", {dim("batch", 1), dim("blocks", 2), dim("h", 1)});
    const Op& op = c.op(OpKind::kBlockPool, {kv, gate, bias}, {pooled}, overlap_attrs());
    TensorData kv_data = TensorData::zeros(c.info(kv));
    kv_data.values = {1, 2, 3, 4};
    TensorData gate_data = TensorData::zeros(c.info(gate));
    gate_data.values[0] = static_cast<float>(first_gate);
    const std::vector<TensorData> out =
        run(c.graph, op, {kv_data, gate_data, TensorData::zeros(c.info(bias))});
    EXPECT_NEAR(out[0].values[0], 2.0, 1e-6);
    EXPECT_NEAR(out[0].values[1], first_gate == 0.0 ? 2.5 : 1.75, 1e-6);
  }
}

// Random blocks against csa_overlap_pooling's steps written out here: the first halves shifted
// one block on (zeros with gate -inf before block 0), concatenated with the second halves along
// the positions, a softmax over the 2r entries.
TEST(KernelBlockPool, OverlappingWindowsMatchShiftedConcatenation) {
  std::mt19937 rng(24);
  OverlapGraph g;
  add_overlap_tensors(g);
  const Op& op = g.c.op(OpKind::kBlockPool, g.inputs(), {g.pooled}, overlap_attrs());
  const std::vector<TensorData> in = random_inputs(g.c, g.inputs(), rng);
  std::vector<double> expected;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t block = 0; block < kOverlapBlocks; ++block) {
      for (int64_t f = 0; f < kHalf; ++f) {
        std::vector<double> entry_kv;
        std::vector<double> entry_gate;
        for (int64_t t = 0; t < kOverlapPositions; ++t) {  // the prior / shifted first half
          entry_kv.push_back(block == 0 ? 0.0 : double{in[0].at({b, block - 1, t, f})});
          entry_gate.push_back(block == 0 ? -kInfinity
                                          : double{in[1].at({b, block - 1, t, f})} +
                                                double{in[2].at({t, f})});
        }
        for (int64_t t = 0; t < kOverlapPositions; ++t) {  // the block's own second half
          entry_kv.push_back(in[0].at({b, block, t, kHalf + f}));
          entry_gate.push_back(double{in[1].at({b, block, t, kHalf + f})} +
                               double{in[2].at({t, kHalf + f})});
        }
        double norm = 0;
        double sum = 0;
        for (size_t e = 0; e < entry_kv.size(); ++e) {
          const double weight = std::exp(entry_gate[e]);
          norm += weight;
          sum += weight * entry_kv[e];
        }
        expected.push_back(sum / norm);
      }
    }
  }
  expect_close(run(g.c.graph, op, in)[0], expected);
}

TEST(KernelBlockPool, OverlappingWindowsGradientsMatchFiniteDifferences) {
  std::mt19937 rng(25);
  OverlapGraph g;
  add_overlap_tensors(g);
  const Op& forward = g.c.op(OpKind::kBlockPool, g.inputs(), {g.pooled}, overlap_attrs());
  const TensorId dy = g.c.tensor("dy", g.c.info(g.pooled).dims);
  std::vector<TensorId> outputs;
  for (const TensorId id : g.inputs()) {
    outputs.push_back(g.c.tensor(g.c.info(id).name + "/grad", g.c.info(id).dims));
  }
  const Op& grad =
      g.c.op(OpKind::kBlockPoolGrad, {dy, g.kv, g.gate, g.bias}, outputs, overlap_attrs(), true);
  std::vector<TensorData> inputs = random_inputs(g.c, g.inputs(), rng);
  for (float& value : inputs[1].values) {
    value *= 3;
  }
  const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
  std::vector<TensorData> grad_values = {weights[0]};
  grad_values.insert(grad_values.end(), inputs.begin(), inputs.end());
  const std::vector<TensorData> analytic = run(g.c.graph, grad, grad_values);
  // The last block's first half feeds no pooled entry: its gradient is exactly 0.
  for (int64_t t = 0; t < kOverlapPositions; ++t) {
    EXPECT_EQ(analytic[0].at({1, kOverlapBlocks - 1, t, 0}), 0.0f);
  }
  const std::vector<std::string> names = {"dkv", "dgate", "dbias"};
  for (size_t index = 0; index < analytic.size(); ++index) {
    expect_fd("overlapping block pool " + names[index], g.c.graph, forward, inputs, weights, index,
              analytic[index]);
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
