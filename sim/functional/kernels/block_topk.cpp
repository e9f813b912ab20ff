// sim/functional/kernels/block_topk.cpp: kBlockTopK, the block selection of DeepSeek-V4's CSA
// indexer (MaxText's DeepseekV4Indexer: jax.lax.top_k over each query's index scores with the
// blocks not yet complete at -inf, picks of such blocks replaced by -1; the attention then masks
// every block that is not picked).
//
// kBlockTopK(scores) -> selection: scores [batch, length, blocks] (dims by name: "batch",
//   "length", and one other, the blocks, which must be whole on the device); selection has the
//   same dims, 1 where the query keeps the block and 0 elsewhere. Query position p is the GLOBAL
//   index along "length" (device offset + local index); block c is complete for it iff
//   c < (p + 1) / r, r = attrs.compress_ratio. The query keeps the k = attrs.block_topk complete
//   blocks of highest score (all of them when fewer are complete); equal scores keep the lower
//   block index first, as jax.lax.top_k does. No VJP: the indices end the gradient's path.
//
// Example: r = 4, k = 2, scores 0.5, 3, 3, 1 for blocks 0-3: query 7 (blocks 0, 1 complete)
//   keeps 0 and 1; query 15 (all four) keeps 1 and 2 (the tie at 3 in index order); query 2
//   (none complete) keeps none.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {

void run_block_topk(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& scores = ctx.in_tensor(0);
  const Tensor& selection = ctx.out_tensor(0);
  const OpAttrs& attrs = ctx.op().attrs;
  if (attrs.compress_ratio <= 0 || attrs.block_topk <= 0) {
    ctx.fail("block top-k needs attrs.compress_ratio and attrs.block_topk > 0");
  }
  if (scores.dims.size() != 3 || strides_of(selection) != strides_of(scores) ||
      selection.dims.size() != 3) {
    ctx.fail("scores and selection must be [batch, length, blocks] alike");
  }
  const Dim* blocks_dim = nullptr;
  for (const Dim& dim : scores.dims) {
    if (dim.name != "batch" && dim.name != "length") {
      blocks_dim = &dim;
    }
  }
  if (blocks_dim == nullptr || blocks_dim->whole_size() != blocks_dim->size) {
    ctx.fail("the blocks dim must be whole on the device");
  }
  const int64_t batch = ctx.dim(scores, "batch").size;
  const Dim& length_dim = ctx.dim(scores, "length");
  const int64_t batch_stride = ctx.stride(scores, "batch");
  const int64_t length_stride = ctx.stride(scores, "length");
  const int64_t block_stride = ctx.stride(scores, blocks_dim->name);
  const int64_t first_position = ctx.device().offset(length_dim);
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  std::vector<int64_t> order;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < length_dim.size; ++i) {
      const int64_t complete =
          std::min(blocks_dim->size, (first_position + i + 1) / attrs.compress_ratio);
      const int64_t keep = std::min(attrs.block_topk, complete);
      const int64_t row = b * batch_stride + i * length_stride;
      order.resize(static_cast<size_t>(complete));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t left, int64_t right) {
        return in[row + left * block_stride] > in[row + right * block_stride];
      });
      for (int64_t pick = 0; pick < keep; ++pick) {
        out[row + order[static_cast<size_t>(pick)] * block_stride] = 1.0f;
      }
    }
  }
}

}  // namespace tpusim::kernels
