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
// Example (HCA, r = 4, one feature): gates 0, 0, ln 2, 0 (bias 0) give w = 1/5, 1/5, 2/5, 1/5;
//   kv 1, 2, 3, 4 pool to (1 + 2 + 6 + 4) / 5 = 2.6.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

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
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < walk.positions; ++t) {
    weights[static_cast<size_t>(t)] =
        double{gate[at_kv + t * walk.kv_step]} + bias[at_bias + t * walk.bias_step];
    max = std::max(max, weights[static_cast<size_t>(t)]);
  }
  double sum = 0;
  for (double& weight : weights) {
    weight = std::exp(weight - max);
    sum += weight;
  }
  for (double& weight : weights) {
    weight /= sum;
  }
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

}  // namespace

void run_block_pool(const Ctx& ctx) {
  ctx.expect_counts(3, 3, 1, 1);
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
