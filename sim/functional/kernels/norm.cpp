// sim/functional/kernels/norm.cpp: RMSNorm and LayerNorm over one dim, the partial statistics
// that let that dim be split across devices, and their exact VJP.
//
// Example: RMSNorm of x[batch, length, embed] with embed split over "tensor"
//   kNormStatistics(x, scale) -> stats[batch, length, 1] (local sum x^2; the engine all-reduces)
//   kRmsNorm(x, scale, stats) -> y = x * rsqrt(sum x^2 / N + eps) * scale, N the global size
//
// Norms. The reduced dim r is attrs.contracted[0] (the last dim of x when attrs.contracted is
// empty); a row is one index of x's other dims; N is r's size: its LOCAL size without statistics
// (r is whole), its GLOBAL size with a statistics input (r is split and the statistics are the
// all-reduced sums). scale (and bias) are 1-D over r, the same slice as x. g = dy * scale.
//
// kRmsNorm(x, scale[, stats]) -> y = x * rsqrt(mean(x^2) + eps) * scale, eps = attrs.epsilon.
//   Scale-free (x[, stats]), DeepSeek-V4's unweighted RMSNorm: y = x * rsqrt(mean(x^2) + eps);
//   its gradient kNormGrad(dy, x[, stats]) -> dx alone, and its statistics read (x) or (dy, x);
//   g = dy then.
// kLayerNorm(x, scale, bias[, stats]) -> y = (x - mu) * rsqrt(var + eps) * scale + bias, with
//   the biased variance var = mean(x^2) - mu^2 (computed two-pass when local).
// kNormStatistics: per-row sums over the LOCAL part of r (the engine all-reduces them), in the
//   statistics tensor [x's dims without r..., values] (values = its LAST dim). Which norm it
//   serves follows from its inputs and value count:
//     RMS forward   (x, scale)           1 value : [sum x^2]
//     Layer forward (x, scale, bias)     2 values: [sum x, sum x^2]
//     RMS grad      (dy, x, scale)       2 values: [sum x^2, sum g x]
//     Layer grad    (dy, x, scale, bias) 4 values: [sum x, sum x^2, sum g, sum g x]
//   (Layer forward and RMS grad both have 3 inputs and 2 values: the grad form's second input has
//   x's dims, a scale has only r; when x is 1-D itself, op.phase == kBackward decides.)
// kNormGrad(dy, x, scale[, bias][, stats]) -> dx, dscale[, dbias]: exact VJP of the forward norm
//   (LayerNorm when there are 3 outputs). With rstd = rsqrt(ms + eps) (RMS, ms = mean x^2):
//     RMS:   dx = rstd g - x rstd^3 mean(g x);            dscale = sum_rows dy x rstd
//   With xhat = (x - mu) rstd, rstd = rsqrt(var + eps) (Layer):
//     Layer: dx = rstd (g - mean(g) - xhat mean(g xhat)), where
//            mean(g xhat) = (sum g x - mu sum g) rstd / N; dscale = sum_rows dy xhat;
//            dbias = sum_rows dy.
//   The means use the statistics input (the sums above, global) when given. dscale/dbias sum
//   over this device's rows only (partial sums the engine reduces).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {
namespace {

enum class NormForm { kRms, kLayer, kRmsGrad, kLayerGrad };

size_t norm_values(NormForm form) {
  switch (form) {
    case NormForm::kRms:
      return 1;
    case NormForm::kLayer:
    case NormForm::kRmsGrad:
      return 2;
    case NormForm::kLayerGrad:
      return 4;
  }
  return 0;
}

bool norm_is_grad(NormForm form) {
  return form == NormForm::kRmsGrad || form == NormForm::kLayerGrad;
}
bool norm_is_layer(NormForm form) {
  return form == NormForm::kLayer || form == NormForm::kLayerGrad;
}

// Per-row moments a norm (or its gradient) needs.
struct RowMoments {
  double mu = 0;       // Layer: mean of x
  double rstd = 0;     // rsqrt(var + eps) (Layer) or rsqrt(mean x^2 + eps) (RMS)
  double mean_g = 0;   // Layer grad: mean of g
  double mean_gx = 0;  // RMS grad: mean of g x; Layer grad: mean of g xhat
};

class NormKernel {
 public:
  NormKernel(const Ctx& ctx, NormForm form, bool statistics_op, bool scaled = true)
      : ctx_(ctx), form_(form), scaled_(scaled) {
    const bool grad = norm_is_grad(form);
    const size_t base = grad ? 1 : 0;  // index of x
    x_index_ = base;
    scale_index_ = base + 1;
    const size_t forward_inputs = base + (norm_is_layer(form) ? 3 : scaled ? 2 : 1);
    if (statistics_op) {
      ctx.expect_counts(forward_inputs, forward_inputs, 1, 1);
    } else {
      ctx.expect_counts(forward_inputs, forward_inputs + 1, 1, 3);
      has_stats_ = ctx.num_inputs() == forward_inputs + 1;
    }
    const Tensor& x = ctx.in_tensor(x_index_);
    if (x.dims.empty()) {
      ctx.fail("normalizes a scalar");
    }
    reduced_ = ctx.op().attrs.contracted.empty() ? x.dims.back().name.str()
                                                 : ctx.op().attrs.contracted.front();
    const Dim& reduced = ctx.dim(x, reduced_);
    n_local_ = reduced.size;
    rows_ = space_without(x, {reduced_});
    Space all = rows_;
    all.add(reduced_, n_local_);
    x_strides_ = ctx.strides_in(x, rows_, true, false);
    x_step_ = ctx.stride(x, reduced_);
    if (grad) {
      dy_strides_ = ctx.strides_in(ctx.in_tensor(0), rows_, true, false);
      dy_step_ = ctx.stride(ctx.in_tensor(0), reduced_);
      ctx.strides_in(ctx.in_tensor(0), all, true, true);
    }
    ctx.strides_in(x, all, true, true);
    Space scale_space;
    scale_space.add(reduced_, n_local_);
    for (size_t index = scale_index_; index < forward_inputs; ++index) {
      ctx.strides_in(ctx.in_tensor(index), scale_space, true, true);  // scale, bias: [r]
    }
    if (has_stats_) {
      const Tensor& stats = ctx.in_tensor(forward_inputs);
      check_stats_tensor(stats);
      stats_strides_ = ctx.strides_in(stats, rows_, true, false);
      n_global_ = reduced.whole_size();
    } else {
      n_global_ = n_local_;
    }
  }

  // kNormStatistics: the local sums.
  void statistics() const {
    const Tensor& out = ctx_.out_tensor(0);
    check_stats_tensor(out);
    const std::vector<int64_t> out_strides = ctx_.strides_in(out, rows_, true, false);
    const int64_t value_stride = strides_of(out).back();
    float* values = ctx_.out(0);
    for_each_rows(out_strides, [&](int64_t x_at, int64_t dy_at, int64_t, int64_t stats_at) {
      const std::array<double, 4> sums = local_sums(x_at, dy_at);
      for (size_t value = 0; value < norm_values(form_); ++value) {
        values[stats_at + static_cast<int64_t>(value) * value_stride] =
            static_cast<float>(sums[value]);
      }
    });
  }

  // kRmsNorm / kLayerNorm.
  void forward() const {
    if (ctx_.num_outputs() != 1) {
      ctx_.fail("a norm has one output");
    }
    const Tensor& y_tensor = ctx_.out_tensor(0);
    const std::vector<int64_t> y_strides = ctx_.strides_in(y_tensor, rows_, true, false);
    const int64_t y_step = ctx_.stride(y_tensor, reduced_);
    Space all = rows_;
    all.add(reduced_, n_local_);
    ctx_.strides_in(y_tensor, all, true, true);
    const float* x = ctx_.in(x_index_);
    const float* scale = scaled_ ? ctx_.in(scale_index_) : nullptr;
    const float* bias = norm_is_layer(form_) ? ctx_.in(scale_index_ + 1) : nullptr;
    float* y = ctx_.out(0);
    for_each_rows(y_strides, [&](int64_t x_at, int64_t, int64_t stats_at, int64_t y_at) {
      const RowMoments row = moments(x_at, 0, stats_at);
      for (int64_t index = 0; index < n_local_; ++index) {
        const double value = x[x_at + index * x_step_];
        const double normalized = bias ? (value - row.mu) * row.rstd : value * row.rstd;
        y[y_at + index * y_step] =
            static_cast<float>(normalized * scale_at(scale, index) + (bias ? bias[index] : 0.0));
      }
    });
  }

  // kNormGrad.
  void backward() const {
    const bool layer = norm_is_layer(form_);
    if (ctx_.num_outputs() != (layer ? 3u : scaled_ ? 2u : 1u)) {
      ctx_.fail("a norm gradient has outputs dx[, dscale[, dbias]]");
    }
    const Tensor& dx_tensor = ctx_.out_tensor(0);
    const std::vector<int64_t> dx_strides = ctx_.strides_in(dx_tensor, rows_, true, false);
    const int64_t dx_step = ctx_.stride(dx_tensor, reduced_);
    Space all = rows_;
    all.add(reduced_, n_local_);
    ctx_.strides_in(dx_tensor, all, true, true);
    Space scale_space;
    scale_space.add(reduced_, n_local_);
    for (size_t index = 1; index < ctx_.num_outputs(); ++index) {
      ctx_.strides_in(ctx_.out_tensor(index), scale_space, true, true);
    }
    const float* dy = ctx_.in(0);
    const float* x = ctx_.in(x_index_);
    const float* scale = scaled_ ? ctx_.in(scale_index_) : nullptr;
    float* dx = ctx_.out(0);
    std::vector<double> dscale(static_cast<size_t>(n_local_), 0.0);
    std::vector<double> dbias(static_cast<size_t>(n_local_), 0.0);
    for_each_rows(dx_strides, [&](int64_t x_at, int64_t dy_at, int64_t stats_at, int64_t dx_at) {
      const RowMoments row = moments(x_at, dy_at, stats_at);
      for (int64_t index = 0; index < n_local_; ++index) {
        const double value = x[x_at + index * x_step_];
        const double d = dy[dy_at + index * dy_step_];
        const double g = d * scale_at(scale, index);
        double grad = 0;
        if (layer) {
          const double xhat = (value - row.mu) * row.rstd;
          grad = row.rstd * (g - row.mean_g - xhat * row.mean_gx);
          dscale[static_cast<size_t>(index)] += d * xhat;
          dbias[static_cast<size_t>(index)] += d;
        } else {
          grad = row.rstd * g - value * row.rstd * row.rstd * row.rstd * row.mean_gx;
          dscale[static_cast<size_t>(index)] += d * value * row.rstd;
        }
        dx[dx_at + index * dx_step] = static_cast<float>(grad);
      }
    });
    if (!scaled_) {
      return;
    }
    float* dscale_out = ctx_.out(1);
    for (int64_t index = 0; index < n_local_; ++index) {
      dscale_out[index] = static_cast<float>(dscale[static_cast<size_t>(index)]);
    }
    if (layer) {
      float* dbias_out = ctx_.out(2);
      for (int64_t index = 0; index < n_local_; ++index) {
        dbias_out[index] = static_cast<float>(dbias[static_cast<size_t>(index)]);
      }
    }
  }

 private:
  // The scale at `index`, 1 for a scale-free norm (no scale input).
  static double scale_at(const float* scale, int64_t index) {
    return scale == nullptr ? 1.0 : static_cast<double>(scale[index]);
  }

  void check_stats_tensor(const Tensor& stats) const {
    if (stats.dims.size() != rows_.names.size() + 1 ||
        stats.dims.back().size != static_cast<int64_t>(norm_values(form_))) {
      ctx_.fail("statistics tensor '" + stats.name + "' must be [rows..., " +
                std::to_string(norm_values(form_)) + "]");
    }
    Space all = rows_;
    all.add(stats.dims.back().name, stats.dims.back().size);
    ctx_.strides_in(stats, all, true, true);
  }

  // body(x offset, dy offset, statistics offset, other offset) per row; `other` follows
  // `other_strides` (dy and statistics offsets are 0 when the op has none).
  template <typename Body>
  void for_each_rows(const std::vector<int64_t>& other_strides, Body&& body) const {
    const std::vector<int64_t> none(rows_.names.size(), 0);
    const std::array<std::vector<int64_t>, 4> all = {
        x_strides_, dy_strides_.empty() ? none : dy_strides_,
        stats_strides_.empty() ? none : stats_strides_, other_strides};
    for_each_index(rows_.sizes, all,
                   [&](const std::array<int64_t, 4>& at) { body(at[0], at[1], at[2], at[3]); });
  }

  std::array<double, 4> local_sums(int64_t x_at, int64_t dy_at) const {
    const float* x = ctx_.in(x_index_);
    const float* scale = scaled_ ? ctx_.in(scale_index_) : nullptr;
    const float* dy = norm_is_grad(form_) ? ctx_.in(0) : nullptr;
    double sum_x = 0;
    double sum_xx = 0;
    double sum_g = 0;
    double sum_gx = 0;
    for (int64_t index = 0; index < n_local_; ++index) {
      const double value = x[x_at + index * x_step_];
      sum_x += value;
      sum_xx += value * value;
      if (dy != nullptr) {
        const double g = static_cast<double>(dy[dy_at + index * dy_step_]) * scale_at(scale, index);
        sum_g += g;
        sum_gx += g * value;
      }
    }
    switch (form_) {
      case NormForm::kRms:
        return {sum_xx, 0, 0, 0};
      case NormForm::kLayer:
        return {sum_x, sum_xx, 0, 0};
      case NormForm::kRmsGrad:
        return {sum_xx, sum_gx, 0, 0};
      case NormForm::kLayerGrad:
        return {sum_x, sum_xx, sum_g, sum_gx};
    }
    return {};
  }

  RowMoments moments(int64_t x_at, int64_t dy_at, int64_t stats_at) const {
    const double n = static_cast<double>(n_global_);
    const double eps = ctx_.op().attrs.epsilon;
    RowMoments row;
    if (!has_stats_ && norm_is_layer(form_)) {
      // Local LayerNorm: two passes for an accurate variance and mean(g xhat).
      const float* x = ctx_.in(x_index_);
      double sum = 0;
      for (int64_t index = 0; index < n_local_; ++index) {
        sum += x[x_at + index * x_step_];
      }
      row.mu = sum / n;
      double var = 0;
      for (int64_t index = 0; index < n_local_; ++index) {
        const double centered = x[x_at + index * x_step_] - row.mu;
        var += centered * centered;
      }
      row.rstd = 1.0 / std::sqrt(var / n + eps);
      if (norm_is_grad(form_)) {
        const float* dy = ctx_.in(0);
        const float* scale = ctx_.in(scale_index_);
        double sum_g = 0;
        double sum_gxhat = 0;
        for (int64_t index = 0; index < n_local_; ++index) {
          const double g = static_cast<double>(dy[dy_at + index * dy_step_]) * scale[index];
          sum_g += g;
          sum_gxhat += g * (x[x_at + index * x_step_] - row.mu) * row.rstd;
        }
        row.mean_g = sum_g / n;
        row.mean_gx = sum_gxhat / n;
      }
      return row;
    }
    const std::array<double, 4> sums = has_stats_ ? stats_row(stats_at) : local_sums(x_at, dy_at);
    switch (form_) {
      case NormForm::kRms:
        row.rstd = 1.0 / std::sqrt(sums[0] / n + eps);
        break;
      case NormForm::kRmsGrad:
        row.rstd = 1.0 / std::sqrt(sums[0] / n + eps);
        row.mean_gx = sums[1] / n;
        break;
      case NormForm::kLayer:
      case NormForm::kLayerGrad: {
        row.mu = sums[0] / n;
        const double var = std::max(sums[1] / n - row.mu * row.mu, 0.0);
        row.rstd = 1.0 / std::sqrt(var + eps);
        row.mean_g = sums[2] / n;
        row.mean_gx = (sums[3] - row.mu * sums[2]) * row.rstd / n;
        break;
      }
    }
    return row;
  }

  // The statistics input's values at row offset stats_at.
  std::array<double, 4> stats_row(int64_t stats_at) const {
    const Tensor& stats = ctx_.in_tensor(ctx_.num_inputs() - 1);
    const int64_t value_stride = strides_of(stats).back();
    const float* values = ctx_.in(ctx_.num_inputs() - 1);
    std::array<double, 4> sums{};
    for (size_t value = 0; value < norm_values(form_); ++value) {
      sums[value] = values[stats_at + static_cast<int64_t>(value) * value_stride];
    }
    return sums;
  }

  const Ctx& ctx_;
  NormForm form_;
  bool scaled_ = true;
  size_t x_index_ = 0;
  size_t scale_index_ = 1;
  bool has_stats_ = false;
  std::string reduced_;
  int64_t n_local_ = 0;
  int64_t n_global_ = 0;
  Space rows_;
  std::vector<int64_t> x_strides_;
  int64_t x_step_ = 0;
  std::vector<int64_t> dy_strides_;
  int64_t dy_step_ = 0;
  std::vector<int64_t> stats_strides_;
};

NormForm statistics_form(const Ctx& ctx) {
  const Tensor& out = ctx.out_tensor(0);
  if (out.dims.empty()) {
    ctx.fail("statistics output has no values dim");
  }
  switch (out.dims.back().size) {
    case 1:
      return NormForm::kRms;
    case 4:
      return NormForm::kLayerGrad;
    case 2: {
      if (ctx.num_inputs() == 2) {
        return NormForm::kRmsGrad;  // scale-free: dy, x
      }
      if (ctx.num_inputs() != 3) {
        ctx.fail("2 statistics values need 2 or 3 inputs");
      }
      const Tensor& first = ctx.in_tensor(0);
      const Tensor& second = ctx.in_tensor(1);
      if (first.dims.size() != second.dims.size()) {
        return NormForm::kLayer;
      }
      if (first.dims.size() > 1) {
        return NormForm::kRmsGrad;
      }
      return ctx.op().phase == Phase::kBackward ? NormForm::kRmsGrad : NormForm::kLayer;
    }
    default:
      ctx.fail("statistics output must hold 1, 2 or 4 values per row");
  }
}

}  // namespace

void run_rms_norm(const Ctx& ctx) {
  // Scale-free: x alone, or x and a statistics input (rows and values: x's rank, where a scale
  // has one dim).
  const bool scaled =
      ctx.num_inputs() == 3 || (ctx.num_inputs() == 2 && ctx.in_tensor(1).dims.size() == 1 &&
                                ctx.in_tensor(0).dims.size() > 1);
  NormKernel(ctx, NormForm::kRms, false, scaled).forward();
}

void run_layer_norm(const Ctx& ctx) {
  NormKernel(ctx, NormForm::kLayer, false).forward();
}

void run_norm_grad(const Ctx& ctx) {
  // LayerNorm's gradient is the one with a third output, dbias; a scale-free RMSNorm's has dx
  // alone.
  const size_t outputs = ctx.op().outputs.size();
  NormKernel(ctx, outputs == 3 ? NormForm::kLayerGrad : NormForm::kRmsGrad, false, outputs != 1)
      .backward();
}

void run_norm_statistics(const Ctx& ctx) {
  ctx.expect_counts(1, 4, 1, 1);
  const NormForm form = statistics_form(ctx);
  // Scale-free RMSNorm: (x) forward, (dy, x) gradient.
  const bool scaled = ctx.num_inputs() > (form == NormForm::kRms ? 1u : 2u) || norm_is_layer(form);
  NormKernel(ctx, form, true, scaled).statistics();
}

}  // namespace tpusim::kernels
