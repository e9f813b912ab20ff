// sim/functional/kernels/layout.cpp: the ops that move values without arithmetic: kDynamicSlice
// (a device keeps its part of a replicated dim) and the copies of host offload and load.
//
// Example: x[embed=8] replicated, y[embed=4 of 8] split over two devices: the device at
// coordinate 1 gets y = x[4:8].
//
// kDynamicSlice(x) -> y (same dim names): y keeps the part of x it covers; per dim (by name) the
//   local start in x is device.offset(y dim) - device.offset(x dim) (must be >= 0). Positions
//   past x's local size (padding of an uneven split) are 0.
// kHostOffload, kHostLoad: copy (same dims).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {

void run_dynamic_slice(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& x = ctx.in_tensor(0);
  const Tensor& y = ctx.out_tensor(0);
  if (x.dims.size() != y.dims.size()) {
    ctx.fail("a slice keeps the dims of its input");
  }
  const std::vector<int64_t> x_strides = strides_of(x);
  // Per y dim: x offset of each y index, or -1 when past x.
  std::vector<std::vector<int64_t>> x_at(y.dims.size());
  for (size_t index = 0; index < y.dims.size(); ++index) {
    const Dim& y_dim = y.dims[index];
    const int x_index = x.dim_index(y_dim.name);
    if (x_index < 0) {
      ctx.fail("slice input lacks dim '" + y_dim.name + "'");
    }
    const Dim& x_dim = x.dims[static_cast<size_t>(x_index)];
    const int64_t start = ctx.device().offset(y_dim) - ctx.device().offset(x_dim);
    if (start < 0) {
      ctx.fail("slice of dim '" + y_dim.name + "' starts outside its input");
    }
    for (int64_t position = 0; position < y_dim.size; ++position) {
      const int64_t source = start + position;
      x_at[index].push_back(source < x_dim.size ? source * x_strides[static_cast<size_t>(x_index)]
                                                : -1);
    }
  }
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  const int64_t count = space_without(y, {}).count();
  std::vector<int64_t> index(y.dims.size(), 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t source = 0;
    bool inside = true;
    for (size_t dim = 0; dim < index.size(); ++dim) {
      const int64_t at = x_at[dim][static_cast<size_t>(index[dim])];
      inside = inside && at >= 0;
      source += at;
    }
    out[flat] = inside ? in[source] : 0.0f;
    for (size_t dim = index.size(); dim > 0; --dim) {
      if (++index[dim - 1] < y.dims[dim - 1].size) {
        break;
      }
      index[dim - 1] = 0;
    }
  }
}

void run_copy(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& x = ctx.in_tensor(0);
  const Tensor& y = ctx.out_tensor(0);
  Space space = space_without(y, {});
  const std::array<std::vector<int64_t>, 2> strides = {ctx.strides_in(x, space, true, true),
                                                       strides_of(y)};
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  for_each_index(space.sizes, strides,
                 [&](const std::array<int64_t, 2>& at) { out[at[1]] = in[at[0]]; });
}

}  // namespace tpusim::kernels
