// sim/functional/kernels/rope.cpp: kRope, the rotary position embedding of queries and keys
// (MaxText's RotaryEmbedding), and its VJP, the inverse rotation.
//
// Example: q[batch, length, heads, head_dim] with length split over "sequence": each device
// rotates its positions by their GLOBAL index, so the shards equal the whole.
//   kRope(q) -> q_rotated;  kRope{phase kBackward}(dq_rotated) -> dq
//
// kRope(x) -> y, rotary embedding on x's LAST dim d (must be whole and even), pairs split in
//   halves as MaxText's RotaryEmbedding: first = x[..., :d/2], second = x[..., d/2:];
//   timescale_i = attrs.rope_max_timescale^(2i/d) (min timescale 1), angle = position /
//   timescale_i, with position the GLOBAL index along the dim named "length"
//   (device.offset + local index) times attrs.rope_position_stride (1 but for DeepSeek-V4's
//   compressed blocks, which rotate at their first token, block c at c r):
//     y_first = first cos - second sin;  y_second = second cos + first sin.
//   attrs.reverse_rotation: the rotation by -angle (DeepSeek-V4's attention output).
//   op.phase == kBackward: the VJP, i.e. the rotation the other way (+angle when reversed).
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {

void run_rope(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& x = ctx.in_tensor(0);
  const Tensor& y = ctx.out_tensor(0);
  if (x.dims.empty()) {
    ctx.fail("rope of a scalar");
  }
  const Dim& last = x.dims.back();
  const int64_t d = last.size;
  if (last.whole_size() != d || d % 2 != 0) {
    ctx.fail("rope's last dim '" + last.name + "' must be whole and even");
  }
  if (y.dims.empty() || y.dims.back().name != last.name) {
    ctx.fail("rope's output must end with '" + last.name + "'");
  }
  const Dim& length = ctx.dim(x, "length");
  const int64_t half = d / 2;
  Space rows = space_without(x, {last.name});
  Space all = rows;
  all.add(last.name, d);
  ctx.strides_in(y, all, true, true);
  std::vector<int64_t> position_strides(rows.names.size(), 0);
  for (size_t index = 0; index < rows.names.size(); ++index) {
    if (rows.names[index] == "length") {
      position_strides[index] = 1;
    }
  }
  const bool backward = ctx.op().phase == Phase::kBackward;
  const double sign = backward != ctx.op().attrs.reverse_rotation ? -1.0 : 1.0;
  const int64_t first_position = ctx.device().offset(length);
  // cos/sin per (local position, i).
  std::vector<double> cosines(static_cast<size_t>(length.size * half));
  std::vector<double> sines(cosines.size());
  for (int64_t position = 0; position < length.size; ++position) {
    for (int64_t i = 0; i < half; ++i) {
      const double timescale = std::pow(ctx.op().attrs.rope_max_timescale,
                                        2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double angle =
          sign *
          static_cast<double>((first_position + position) * ctx.op().attrs.rope_position_stride) /
          timescale;
      cosines[static_cast<size_t>(position * half + i)] = std::cos(angle);
      sines[static_cast<size_t>(position * half + i)] = std::sin(angle);
    }
  }
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  const int64_t x_step = strides_of(x).back();
  const int64_t y_step = strides_of(y).back();
  const std::array<std::vector<int64_t>, 3> strides = {
      ctx.strides_in(x, rows, true, false), ctx.strides_in(y, rows, true, false), position_strides};
  for_each_index(rows.sizes, strides, [&](const std::array<int64_t, 3>& at) {
    const double* cos_row = cosines.data() + at[2] * half;
    const double* sin_row = sines.data() + at[2] * half;
    for (int64_t i = 0; i < half; ++i) {
      const double first = in[at[0] + i * x_step];
      const double second = in[at[0] + (i + half) * x_step];
      out[at[1] + i * y_step] = static_cast<float>(first * cos_row[i] - second * sin_row[i]);
      out[at[1] + (i + half) * y_step] =
          static_cast<float>(second * cos_row[i] + first * sin_row[i]);
    }
  });
}

}  // namespace tpusim::kernels
