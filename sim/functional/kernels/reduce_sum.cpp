// sim/functional/kernels/reduce_sum.cpp: kReduceSum, the sum of a tensor over the dims its output
// lacks (bias and scale gradients).
//
// kReduceSum(x) -> y: y sums x over the dims y lacks (attrs.contracted names them), in x's
// row-major order with a double accumulator.
//
// Example: a bias gradient, dbias = sum of dy over the tokens
//   kReduceSum(dy[batch, length, embed]) -> dbias[embed], attrs.contracted = {batch, length}
#include <array>
#include <cstdint>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {

void run_reduce_sum(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& in_tensor = ctx.in_tensor(0);
  const Tensor& out_tensor = ctx.out_tensor(0);
  Space space;
  for (const Dim& dim : in_tensor.dims) {
    space.add(dim.name, dim.size);
  }
  const std::array<std::vector<int64_t>, 2> all = {strides_of(in_tensor),
                                                   ctx.strides_in(out_tensor, space, false, true)};
  std::vector<double> sums(static_cast<size_t>(out_tensor.num_elements()), 0.0);
  const float* in = ctx.in(0);
  for_each_index(space.sizes, all, [&](const std::array<int64_t, 2>& at) {
    sums[static_cast<size_t>(at[1])] += in[at[0]];
  });
  float* out = ctx.out(0);
  for (size_t index = 0; index < sums.size(); ++index) {
    out[index] = static_cast<float>(sums[index]);
  }
}

}  // namespace tpusim::kernels
