// sim/functional/kernels/optimizer.cpp: kAdamUpdate, one AdamW step of a parameter shard (optax's
// adamw: bias-corrected moments, decoupled weight decay).
//
// Example: at step 1 with b1 = 0.9, b2 = 0.999 and zero moments, mu' = 0.1 g, nu' = 0.001 g^2,
// so mhat = g, nhat = g^2 and param' = param - lr (g / (|g| + eps) + weight_decay param).
//
// kAdamUpdate(param, grad, mu, nu) -> param', mu', nu' (all the same dims): optax AdamW with
//   device.optimizer: g = grad * gradient_scale; mu' = b1 mu + (1 - b1) g;
//   nu' = b2 nu + (1 - b2) g^2; mhat = mu' / (1 - b1^step); nhat = nu' / (1 - b2^step);
//   param' = param - lr * (mhat / (sqrt(nhat + eps_root) + eps) + weight_decay * param).
//   Computed in double per element.
// kAdamUpdate(bias, grad, mu, nu, load[experts]) -> bias', mu', nu': a router bias with MaxText's
//   routed_bias_update_rate r (device.optimizer.bias_update_rate; train.py adds moe.py's
//   calculate_load_balance_updates after the optimizer step): load[e] = the step's choices of
//   expert e over the whole batch, and after AdamW bias'[e] += r sign(sum(load) / E - load[e])
//   (sum(load) / E = T k / E, the balanced load; sign(0) = 0). Example: loads (3, 1, 2, 2) at
//   r = 0.001 move the bias by (-0.001, +0.001, 0, 0).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {

namespace {

// r sign(sum(load) / E - load[e]) per expert: the bias's step toward its balanced load.
std::vector<double> balance_steps(const Ctx& ctx) {
  const Tensor& load = ctx.in_tensor(4);
  if (load.dims.size() != 1 || load.dims[0].size != load.dims[0].whole_size()) {
    ctx.fail("a router bias's loads must be a whole [experts]");
  }
  const auto experts = static_cast<size_t>(load.dims[0].size);
  const float* counts = ctx.in(4);
  double total = 0;
  for (size_t e = 0; e < experts; ++e) {
    total += counts[e];
  }
  const double balanced = total / static_cast<double>(experts);
  const double rate = ctx.device().optimizer.bias_update_rate;
  std::vector<double> steps(experts);
  for (size_t e = 0; e < experts; ++e) {
    const double gap = balanced - counts[e];
    steps[e] = gap > 0 ? rate : (gap < 0 ? -rate : 0.0);
  }
  return steps;
}

}  // namespace

void run_adam_update(const Ctx& ctx) {
  ctx.expect_counts(4, 5, 3, 3);
  const Tensor& param = ctx.in_tensor(0);
  const Space space = space_without(param, {});
  for (size_t index = 0; index < ctx.num_inputs(); ++index) {
    if (!same_dims(ctx.in_tensor(index), param) ||
        (index < 3 && !same_dims(ctx.out_tensor(index), param))) {
      ctx.fail("AdamW tensors must all have the parameter's dims");
    }
  }
  // A router bias's step toward its balanced load, added after AdamW (empty: none).
  const std::vector<double> balance =
      ctx.num_inputs() == 5 ? balance_steps(ctx) : std::vector<double>{};
  const DeviceContext::Optimizer& opt = ctx.device().optimizer;
  const double step = static_cast<double>(opt.step);
  const double correction1 = 1.0 - std::pow(opt.b1, step);
  const double correction2 = 1.0 - std::pow(opt.b2, step);
  const float* p = ctx.in(0);
  const float* grad = ctx.in(1);
  const float* mu = ctx.in(2);
  const float* nu = ctx.in(3);
  float* p_out = ctx.out_unfilled(0);  // every element is written below
  float* mu_out = ctx.out_unfilled(1);
  float* nu_out = ctx.out_unfilled(2);
  const int64_t count = space.count();
  // Elementwise: pieces of a fixed size on the kernel threads.
  constexpr int64_t kPiece = 1 << 15;
  const int64_t pieces = (count + kPiece - 1) / kPiece;
  if (ctx.device().fast_kernels) {
    // functional_precision=fast: the same formula in fp32, the bias corrections as factors.
    const auto b1 = static_cast<float>(opt.b1);
    const auto b2 = static_cast<float>(opt.b2);
    const auto scale = static_cast<float>(opt.gradient_scale);
    const auto inverse1 = static_cast<float>(1.0 / correction1);
    const auto inverse2 = static_cast<float>(1.0 / correction2);
    const auto eps = static_cast<float>(opt.eps);
    const auto eps_root = static_cast<float>(opt.eps_root);
    const auto decay = static_cast<float>(opt.weight_decay);
    const auto rate = static_cast<float>(opt.learning_rate);
    parallel_for(ctx.device().threads, pieces, [&](int64_t piece) {
      const int64_t end = std::min(count, (piece + 1) * kPiece);
      for (int64_t index = piece * kPiece; index < end; ++index) {
        const float g = grad[index] * scale;
        const float m = b1 * mu[index] + (1.0f - b1) * g;
        const float v = b2 * nu[index] + (1.0f - b2) * g * g;
        const float update =
            m * inverse1 / (std::sqrt(v * inverse2 + eps_root) + eps) + decay * p[index];
        p_out[index] = p[index] - rate * update;
        if (!balance.empty()) {
          p_out[index] += static_cast<float>(balance[static_cast<size_t>(index)]);
        }
        mu_out[index] = m;
        nu_out[index] = v;
      }
    });
    return;
  }
  parallel_for(ctx.device().threads, pieces, [&](int64_t piece) {
    const int64_t end = std::min(count, (piece + 1) * kPiece);
    for (int64_t index = piece * kPiece; index < end; ++index) {
      const double g = grad[index] * opt.gradient_scale;
      const double m = opt.b1 * mu[index] + (1.0 - opt.b1) * g;
      const double v = opt.b2 * nu[index] + (1.0 - opt.b2) * g * g;
      const double mhat = m / correction1;
      const double vhat = v / correction2;
      const double update =
          mhat / (std::sqrt(vhat + opt.eps_root) + opt.eps) + opt.weight_decay * p[index];
      const double balance_step = balance.empty() ? 0.0 : balance[static_cast<size_t>(index)];
      p_out[index] = static_cast<float>(p[index] - opt.learning_rate * update + balance_step);
      mu_out[index] = static_cast<float>(m);
      nu_out[index] = static_cast<float>(v);
    }
  });
}

}  // namespace tpusim::kernels
