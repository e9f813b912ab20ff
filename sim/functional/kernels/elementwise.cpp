// sim/functional/kernels/elementwise.cpp: kElementwise, the pointwise ops of the model
// (activations, residual adds, gating products, casts) and their gradients, broadcasting inputs
// along the output dims they lack.
//
// Example: a SwiGLU gate, then its VJP through the SiLU
//   kElementwise{kSilu}(h[batch, length, mlp]) -> s;  kElementwise{kMul}(s, up) -> gated
//   kElementwise{kSiluGrad}(ds, h) -> dh = ds * s (1 + h (1 - s)), s = sigmoid(h)
//
// kElementwise by attrs.function, over the output's dims; an input lacking some of the output's
//   dims broadcasts along them (matched by name; an input may not have dims the output lacks).
//   kAdd(a, b) = a + b, kAdd(a) = a (a broadcast copy: mHC's streams, the VJP of a sum over
//   dims); kMul(a, b) = a * b;
//   kSilu(x) = x * sigmoid(x); kGelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   (the tanh approximation, flax nn.gelu's default); kRelu(x) = max(x, 0);
//   kSigmoid(x) = 1 / (1 + exp(-x)); kScale and kCast copy their FIRST input (kScale is the
//   identity; its VJP op is kScale(dy, x) = dy, and kCast's VJP is kCast(dy)). kReshape copies
//   its one input's elements in row-major order into the output's dims (same count; its VJP is
//   kReshape(dy)).
//   Gradients take (dy, x) and give dy * f'(x): kSiluGrad f' = s (1 + x (1 - s)) with
//   s = sigmoid(x); kGeluGrad f' = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
//   with t = tanh(...) as above; kReluGrad f' = [x > 0]; kSigmoidGrad f' = s (1 - s).
// With attrs.activation_limit L > 0 (the clipped SwiGLU of deepseek's routed experts, MaxText
//   moe.py apply_ffn_activation): kSilu(x) = silu(min(x, L)), kSiluGrad(dy, x) = dy silu'(x)
//   [x < L]; kMul(a, b) = a clip(b, -L, L), and the up projection's gradient kMul(dy, a, b) =
//   dy a [|b| < L] (three inputs, the only three-input elementwise op).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {
namespace {

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
}

double gelu_derivative(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * x * x);
}

double apply_elementwise(ElementwiseFn fn, double a, double b) {
  switch (fn) {
    case ElementwiseFn::kAdd:
      return a + b;
    case ElementwiseFn::kMul:
      return a * b;
    case ElementwiseFn::kSilu:
      return a * sigmoid(a);
    case ElementwiseFn::kGelu:
      return gelu(a);
    case ElementwiseFn::kRelu:
      return a > 0 ? a : 0.0;
    case ElementwiseFn::kSigmoid:
      return sigmoid(a);
    case ElementwiseFn::kScale:
    case ElementwiseFn::kCast:
    case ElementwiseFn::kReshape:
      return a;
    case ElementwiseFn::kSiluGrad: {
      const double s = sigmoid(b);
      return a * s * (1.0 + b * (1.0 - s));
    }
    case ElementwiseFn::kGeluGrad:
      return a * gelu_derivative(b);
    case ElementwiseFn::kReluGrad:
      return b > 0 ? a : 0.0;
    case ElementwiseFn::kSigmoidGrad: {
      const double s = sigmoid(b);
      return a * s * (1.0 - s);
    }
  }
  return 0.0;
}

// apply_elementwise with the clip of attrs.activation_limit (limit > 0; see the header).
double apply_clipped(ElementwiseFn fn, double a, double b, double limit) {
  switch (fn) {
    case ElementwiseFn::kSilu:
      return apply_elementwise(fn, std::min(a, limit), b);
    case ElementwiseFn::kSiluGrad:
      return b < limit ? apply_elementwise(fn, a, b) : 0.0;
    case ElementwiseFn::kMul:
      return a * std::clamp(b, -limit, limit);
    default:
      return apply_elementwise(fn, a, b);
  }
}

// kMul(dy, a, b) = dy a [|b| < L]: the gradient of a clipped product's second input.
void run_clipped_product_grad(const Ctx& ctx, double limit) {
  ctx.expect_counts(3, 3, 1, 1);
  const Tensor& out_tensor = ctx.out_tensor(0);
  Space space;
  for (const Dim& dim : out_tensor.dims) {
    space.add(dim.name, dim.size);
  }
  const std::array<std::vector<int64_t>, 4> all = {
      strides_of(out_tensor), ctx.strides_in(ctx.in_tensor(0), space, false, true),
      ctx.strides_in(ctx.in_tensor(1), space, false, true),
      ctx.strides_in(ctx.in_tensor(2), space, false, true)};
  const float* dy = ctx.in(0);
  const float* a = ctx.in(1);
  const float* b = ctx.in(2);
  float* out = ctx.out(0);
  for_each_index(space.sizes, all, [&](const std::array<int64_t, 4>& at) {
    const double inside = std::abs(static_cast<double>(b[at[3]])) < limit ? 1.0 : 0.0;
    out[at[0]] = static_cast<float>(static_cast<double>(dy[at[1]]) * a[at[2]] * inside);
  });
}

}  // namespace

void run_elementwise(const Ctx& ctx) {
  // kAdd of one input is a copy, broadcast along the output's dims.
  const ElementwiseFn fn = ctx.op().attrs.function == ElementwiseFn::kAdd && ctx.num_inputs() == 1
                               ? ElementwiseFn::kCast
                               : ctx.op().attrs.function;
  const double limit = ctx.op().attrs.activation_limit;
  if (limit > 0 && fn == ElementwiseFn::kMul && ctx.num_inputs() == 3) {
    run_clipped_product_grad(ctx, limit);
    return;
  }
  if (fn == ElementwiseFn::kReshape) {
    ctx.expect_counts(1, 1, 1, 1);
    const int64_t count = ctx.out_tensor(0).num_elements();
    if (ctx.in_tensor(0).num_elements() != count) {
      throw std::logic_error("reshape '" + ctx.op().name +
                             "': " + std::to_string(ctx.in_tensor(0).num_elements()) +
                             " elements into " + std::to_string(count));
    }
    const float* a = ctx.in(0);
    std::copy(a, a + count, ctx.out_unfilled(0));
    return;
  }
  size_t arity = 1;
  switch (fn) {
    case ElementwiseFn::kAdd:
    case ElementwiseFn::kMul:
    case ElementwiseFn::kSiluGrad:
    case ElementwiseFn::kGeluGrad:
    case ElementwiseFn::kReluGrad:
    case ElementwiseFn::kSigmoidGrad:
      arity = 2;
      ctx.expect_counts(2, 2, 1, 1);
      break;
    case ElementwiseFn::kScale:
    case ElementwiseFn::kCast:
      ctx.expect_counts(1, 2, 1, 1);  // kScale's VJP form passes (dy, x)
      break;
    default:
      ctx.expect_counts(1, 1, 1, 1);
      break;
  }
  const Tensor& out_tensor = ctx.out_tensor(0);
  Space space;
  for (const Dim& dim : out_tensor.dims) {
    space.add(dim.name, dim.size);
  }
  const std::vector<int64_t> a_strides = ctx.strides_in(ctx.in_tensor(0), space, false, true);
  const std::vector<int64_t> b_strides = arity == 2
                                             ? ctx.strides_in(ctx.in_tensor(1), space, false, true)
                                             : std::vector<int64_t>(space.names.size(), 0);
  const float* a = ctx.in(0);
  const float* b = arity == 2 ? ctx.in(1) : ctx.in(0);
  const std::vector<int64_t> out_strides = strides_of(out_tensor);
  if (ctx.device().fast_kernels && limit <= 0 && a_strides == out_strides &&
      (arity == 1 || b_strides == out_strides)) {
    // functional_precision=fast, no broadcasting: one flat loop in fp32.
    float* out = ctx.out_unfilled(0);
    const int64_t count = space.count();
    const auto flat = [&](auto&& f) {
      // Pieces of a fixed size (each element's value does not depend on the split).
      constexpr int64_t kPiece = 1 << 15;
      parallel_for(ctx.device().threads, (count + kPiece - 1) / kPiece, [&](int64_t piece) {
        const int64_t end = std::min(count, (piece + 1) * kPiece);
        for (int64_t index = piece * kPiece; index < end; ++index) {
          out[index] = f(a[index], b[index]);
        }
      });
    };
    const auto sigmoid_f = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
    switch (fn) {
      case ElementwiseFn::kAdd:
        flat([](float x, float y) { return x + y; });
        return;
      case ElementwiseFn::kMul:
        flat([](float x, float y) { return x * y; });
        return;
      case ElementwiseFn::kScale:
      case ElementwiseFn::kCast:
        std::copy(a, a + count, out);
        return;
      case ElementwiseFn::kSilu:
        flat([&](float x, float) { return x * sigmoid_f(x); });
        return;
      case ElementwiseFn::kSiluGrad:
        flat([&](float dy, float x) {
          const float s = sigmoid_f(x);
          return dy * s * (1.0f + x * (1.0f - s));
        });
        return;
      default:
        flat([&](float x, float y) { return static_cast<float>(apply_elementwise(fn, x, y)); });
        return;
    }
  }
  float* out = ctx.out(0);
  const std::array<std::vector<int64_t>, 3> all = {out_strides, a_strides, b_strides};
  if (limit > 0) {
    for_each_index(space.sizes, all, [&](const std::array<int64_t, 3>& at) {
      out[at[0]] = static_cast<float>(apply_clipped(fn, a[at[1]], b[at[2]], limit));
    });
    return;
  }
  for_each_index(space.sizes, all, [&](const std::array<int64_t, 3>& at) {
    out[at[0]] = static_cast<float>(apply_elementwise(fn, a[at[1]], b[at[2]]));
  });
}

}  // namespace tpusim::kernels
