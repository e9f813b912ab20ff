// sim/functional/kernels/block_pool.cpp: kBlockPool, the softmax-gated pooling of DeepSeek-V4's
// compressors (MaxText's DeepseekV4HCACompressor: blocks of r tokens, each feature a softmax over
// the block's positions of gate + position bias weighting kv), and kBlockPoolGrad, its exact VJP.
//
// kBlockPool(kv, gate, bias) -> pooled: kv and gate have the same dims; attrs.contracted names
//   the one dim pooled over (a block's positions, P); bias has a subset of their dims (the
//   positions and the features: MaxText's position_bias [r, width]) and is broadcast by name.
//   For every other index n (batch, block, feature): w_t = softmax over t of (gate[n, t] +
//   bias[t, n's feature]), pooled[n] = sum_t w_t kv[n, t]. Softmax in double with the max
//   subtracted. pooled has kv's dims without the pooled one.
// kBlockPoolGrad(dy, kv, gate, bias) -> dkv, dgate, dbias: w recomputed; dkv[n, t] = dy[n] w_t,
//   dgate[n, t] = dy[n] w_t (kv[n, t] - pooled[n]), dbias = dgate summed over the dims bias
//   lacks (this device's part: a partial sum the engine completes over the devices that split
//   them).
//
// attrs.overlapping_windows (CSA, MaxText's csa_overlap_pooling): kv and gate are [batch, blocks,
//   positions, 2h] in that order, bias [positions, 2h], pooled [batch, blocks, h]; the blocks and
//   the 2h features whole on the device. Block c's feature f pools 2r entries: the r positions of
//   block c - 1 at feature f (none for block 0: MaxText's prior of zeros with gate -inf, weight
//   0) and its own r positions at feature h + f, each with gate + bias[t, feature]. Every stored
//   entry feeds one pooled entry (block c - 1's first half feeds block c; the last block's first
//   half none, gradient 0), so the VJP writes each once and dbias is again dgate's sum.
//
// Example (HCA, r = 4, one feature): gates 0, 0, ln 2, 0 (bias 0) give w = 1/5, 1/5, 2/5, 1/5;
//   kv 1, 2, 3, 4 pool to (1 + 2 + 6 + 4) / 5 = 2.6.
// Example (CSA, r = 1, h = 1, gates 0): kv [[1, 2], [3, 4]] (two blocks of [first, second]) pool
//   block 0 to 2 (its second half alone) and block 1 to (1 + 4) / 2 = 2.5.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"
#include "sim/functional/kernels/softmax.h"

namespace tpusim::kernels {
namespace {

// The walk both kernels share: every pooled entry n (the space of kv's dims but the pooled
// one) with the offsets of kv/gate, of bias and of the pooled output at its first position.
struct PoolWalk {
  Space space;
  int64_t positions = 0;
  int64_t kv_step = 0;                          // kv's (and gate's) stride along the pooled dim
  int64_t bias_step = 0;                        // bias's stride along it
  std::array<std::vector<int64_t>, 3> strides;  // kv, bias, pooled
};

PoolWalk pool_walk(const Ctx& ctx, const Tensor& kv, const Tensor& gate, const Tensor& bias,
                   const Tensor& pooled) {
  const OpAttrs& attrs = ctx.op().attrs;
  if (attrs.contracted.size() != 1) {
    ctx.fail("block pooling needs attrs.contracted = {the pooled dim}");
  }
  const std::string& pooled_name = attrs.contracted[0];
  if (kv.dims.size() != gate.dims.size()) {
    ctx.fail("kv and gate must have the same dims");
  }
  PoolWalk walk;
  walk.positions = ctx.dim(kv, pooled_name).size;
  walk.kv_step = ctx.stride(kv, pooled_name);
  walk.bias_step = bias.dim_index(pooled_name) < 0 ? 0 : ctx.stride(bias, pooled_name);
  for (const Dim& dim : kv.dims) {
    if (dim.name != pooled_name) {
      walk.space.add(dim.name, dim.size);
    }
    if (gate.dim_index(dim.name) < 0 || ctx.dim(gate, dim.name).size != dim.size) {
      ctx.fail("kv and gate must have the same dims");
    }
  }
  if (strides_of(gate) != strides_of(kv)) {
    ctx.fail("kv and gate must have their dims in the same order");
  }
  walk.strides = {ctx.strides_in(kv, walk.space, true, false),
                  ctx.strides_in(bias, walk.space, false, false),
                  ctx.strides_in(pooled, walk.space, true, true)};
  return walk;
}

// The softmax weights of one entry (at kv offset `at_kv`, bias offset `at_bias`) into `weights`.
void pool_weights(const float* gate, const float* bias, const PoolWalk& walk, int64_t at_kv,
                  int64_t at_bias, std::vector<double>& weights) {
  for (int64_t t = 0; t < walk.positions; ++t) {
    weights[static_cast<size_t>(t)] =
        double{gate[at_kv + t * walk.kv_step]} + bias[at_bias + t * walk.bias_step];
  }
  softmax_in_place(weights);
}

// The pooled value of one entry: the weights' sum of its positions' kv (from kv offset `at_kv`).
double pooled_value(const float* kv, const PoolWalk& walk, int64_t at_kv,
                    const std::vector<double>& weights) {
  double sum = 0;
  for (int64_t t = 0; t < walk.positions; ++t) {
    sum += weights[static_cast<size_t>(t)] * kv[at_kv + t * walk.kv_step];
  }
  return sum;
}

// MaxText's csa_overlap_pooling over [batch, blocks, positions, 2h] (attrs.overlapping_windows).
// For pooled entry (b, c, f) its 2r entries' kv/gate offsets and bias offsets, in MaxText's
// order (block c - 1's first half, then block c's second half; block 0 has the second alone).
class OverlapWalk {
 public:
  OverlapWalk(const Ctx& ctx, const Tensor& kv, const Tensor& gate, const Tensor& bias,
              const Tensor& pooled) {
    const OpAttrs& attrs = ctx.op().attrs;
    if (kv.dims.size() != 4 || attrs.contracted.size() != 1 ||
        kv.dims[2].name != attrs.contracted[0] || strides_of(gate) != strides_of(kv) ||
        gate.dims.size() != 4 || bias.dims.size() != 2 || pooled.dims.size() != 3) {
      ctx.fail(
          "overlapping windows need kv, gate [batch, blocks, positions, 2h], bias "
          "[positions, 2h] and pooled [batch, blocks, h]");
    }
    batch_ = kv.dims[0].size;
    blocks_ = kv.dims[1].size;
    positions_ = kv.dims[2].size;
    width_ = kv.dims[3].size / 2;
    if (kv.dims[1].whole_size() != blocks_ || kv.dims[3].whole_size() != 2 * width_ ||
        kv.dims[3].size % 2 != 0 || bias.dims[0].size != positions_ ||
        bias.dims[1].size != 2 * width_ || pooled.dims[0].size != batch_ ||
        pooled.dims[1].size != blocks_ || pooled.dims[2].size != width_) {
      ctx.fail("overlapping windows need every block and both feature halves on the device");
    }
  }

  int64_t batch() const { return batch_; }
  int64_t blocks() const { return blocks_; }
  int64_t width() const { return width_; }
  int64_t entries() const { return 2 * positions_; }

  // Pooled entry (b, c, f)'s entries: kv/gate offsets and bias offsets (weight 0 entries, block
  // 0's missing first half, are left out: `count` of them are set).
  int64_t gather(int64_t b, int64_t c, int64_t f, std::vector<int64_t>& at_kv,
                 std::vector<int64_t>& at_bias) const {
    const int64_t features = 2 * width_;
    int64_t count = 0;
    const auto add = [&](int64_t block, int64_t feature) {
      for (int64_t t = 0; t < positions_; ++t) {
        at_kv[static_cast<size_t>(count)] =
            ((b * blocks_ + block) * positions_ + t) * features + feature;
        at_bias[static_cast<size_t>(count)] = t * features + feature;
        ++count;
      }
    };
    if (c > 0) {
      add(c - 1, f);
    }
    add(c, width_ + f);
    return count;
  }

 private:
  int64_t batch_ = 0, blocks_ = 0, positions_ = 0, width_ = 0;
};

// The softmax weights over `count` gathered entries into `weights`.
void overlap_weights(const float* gate, const float* bias, const std::vector<int64_t>& at_kv,
                     const std::vector<int64_t>& at_bias, int64_t count,
                     std::vector<double>& weights) {
  for (int64_t e = 0; e < count; ++e) {
    const auto index = static_cast<size_t>(e);
    weights[index] = double{gate[at_kv[index]]} + bias[at_bias[index]];
  }
  softmax_in_place(std::span<double>(weights).first(static_cast<size_t>(count)));
}

// kBlockPool or kBlockPoolGrad with overlapping windows; `gradient` reads dy first.
void run_overlapping(const Ctx& ctx, bool gradient) {
  const size_t first = gradient ? 1 : 0;
  const OverlapWalk walk(ctx, ctx.in_tensor(first), ctx.in_tensor(first + 1),
                         ctx.in_tensor(first + 2), gradient ? ctx.in_tensor(0) : ctx.out_tensor(0));
  const float* kv = ctx.in(first);
  const float* gate = ctx.in(first + 1);
  const float* bias = ctx.in(first + 2);
  float* pooled = gradient ? nullptr : ctx.out(0);
  float* dkv = gradient ? ctx.out(0) : nullptr;
  float* dgate = gradient ? ctx.out(1) : nullptr;
  std::vector<double> dbias(gradient ? static_cast<size_t>(ctx.in_tensor(3).num_elements()) : 0,
                            0.0);
  const auto entries = static_cast<size_t>(walk.entries());
  std::vector<int64_t> at_kv(entries);
  std::vector<int64_t> at_bias(entries);
  std::vector<double> weights(entries);
  for (int64_t b = 0; b < walk.batch(); ++b) {
    for (int64_t c = 0; c < walk.blocks(); ++c) {
      for (int64_t f = 0; f < walk.width(); ++f) {
        const int64_t count = walk.gather(b, c, f, at_kv, at_bias);
        overlap_weights(gate, bias, at_kv, at_bias, count, weights);
        double value = 0;
        for (int64_t e = 0; e < count; ++e) {
          value += weights[static_cast<size_t>(e)] * kv[at_kv[static_cast<size_t>(e)]];
        }
        const int64_t out = (b * walk.blocks() + c) * walk.width() + f;
        if (!gradient) {
          pooled[out] = static_cast<float>(value);
          continue;
        }
        const double upstream = ctx.in(0)[out];
        for (int64_t e = 0; e < count; ++e) {
          const auto index = static_cast<size_t>(e);
          const double gate_grad = upstream * weights[index] * (kv[at_kv[index]] - value);
          dkv[at_kv[index]] = static_cast<float>(upstream * weights[index]);
          dgate[at_kv[index]] = static_cast<float>(gate_grad);
          dbias[static_cast<size_t>(at_bias[index])] += gate_grad;
        }
      }
    }
  }
  if (gradient) {
    float* dbias_out = ctx.out(2);
    for (size_t index = 0; index < dbias.size(); ++index) {
      dbias_out[index] = static_cast<float>(dbias[index]);
    }
  }
}

}  // namespace

void run_block_pool(const Ctx& ctx) {
  ctx.expect_counts(3, 3, 1, 1);
  if (ctx.op().attrs.overlapping_windows) {
    run_overlapping(ctx, false);
    return;
  }
  const PoolWalk walk =
      pool_walk(ctx, ctx.in_tensor(0), ctx.in_tensor(1), ctx.in_tensor(2), ctx.out_tensor(0));
  const float* kv = ctx.in(0);
  const float* gate = ctx.in(1);
  const float* bias = ctx.in(2);
  float* pooled = ctx.out(0);
  std::vector<double> weights(static_cast<size_t>(walk.positions));
  for_each_index(walk.space.sizes, walk.strides, [&](const std::array<int64_t, 3>& at) {
    pool_weights(gate, bias, walk, at[0], at[1], weights);
    pooled[at[2]] = static_cast<float>(pooled_value(kv, walk, at[0], weights));
  });
}

void run_block_pool_grad(const Ctx& ctx) {
  ctx.expect_counts(4, 4, 3, 3);
  if (ctx.op().attrs.overlapping_windows) {
    run_overlapping(ctx, true);
    return;
  }
  // dy has the pooled output's dims.
  const PoolWalk walk =
      pool_walk(ctx, ctx.in_tensor(1), ctx.in_tensor(2), ctx.in_tensor(3), ctx.in_tensor(0));
  const Tensor& bias_tensor = ctx.in_tensor(3);
  if (strides_of(ctx.out_tensor(0)) != strides_of(ctx.in_tensor(1)) ||
      strides_of(ctx.out_tensor(1)) != strides_of(ctx.in_tensor(1)) ||
      ctx.out_tensor(2).num_elements() != bias_tensor.num_elements()) {
    ctx.fail("block pooling gradients are dkv, dgate (kv's shape) and dbias (bias's)");
  }
  const float* dy = ctx.in(0);
  const float* kv = ctx.in(1);
  const float* gate = ctx.in(2);
  const float* bias = ctx.in(3);
  float* dkv = ctx.out(0);
  float* dgate = ctx.out(1);
  std::vector<double> dbias(static_cast<size_t>(bias_tensor.num_elements()), 0.0);
  std::vector<double> weights(static_cast<size_t>(walk.positions));
  for_each_index(walk.space.sizes, walk.strides, [&](const std::array<int64_t, 3>& at) {
    pool_weights(gate, bias, walk, at[0], at[1], weights);
    const double pooled = pooled_value(kv, walk, at[0], weights);
    const double upstream = dy[at[2]];
    for (int64_t t = 0; t < walk.positions; ++t) {
      const int64_t index = at[0] + t * walk.kv_step;
      const double weight = weights[static_cast<size_t>(t)];
      const double gate_grad = upstream * weight * (kv[index] - pooled);
      dkv[index] = static_cast<float>(upstream * weight);
      dgate[index] = static_cast<float>(gate_grad);
      dbias[static_cast<size_t>(at[1] + t * walk.bias_step)] += gate_grad;
    }
  });
  float* dbias_out = ctx.out(2);
  for (size_t index = 0; index < dbias.size(); ++index) {
    dbias_out[index] = static_cast<float>(dbias[index]);
  }
}

}  // namespace tpusim::kernels
