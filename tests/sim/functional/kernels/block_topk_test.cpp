// tests/sim/functional/kernels/block_topk_test.cpp: the CSA indexer's block selection
// (sim/functional/kernels/block_topk.cpp): the kernel's worked example, and queries split over
// devices reading their global positions.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

OpAttrs topk_attrs(int64_t topk) {
  OpAttrs attrs;
  attrs.compress_ratio = 4;
  attrs.block_topk = topk;
  return attrs;
}

// Scores 0.5, 3, 3, 1 over 4 blocks of 4 tokens for every query of 16, k = 2.
std::vector<float> worked_scores() {
  std::vector<float> scores;
  for (int64_t i = 0; i < 16; ++i) {
    scores.insert(scores.end(), {0.5f, 3.0f, 3.0f, 1.0f});
  }
  return scores;
}

// The picks by hand: queries 0-2 see no complete block; 3-7 one or two (blocks 0, 1: both kept
// once complete, k = 2); 8-11 blocks 0-2, keeping 1 and 2 (0.5 is the lowest); 12-15 all four,
// keeping 1 and 2 (the tie at 3 in index order, as jax.lax.top_k, over 1 and 0.5).
std::vector<float> worked_selection() {
  std::vector<float> expected;
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t complete = (i + 1) / 4;
    if (complete == 0) {
      expected.insert(expected.end(), {0, 0, 0, 0});
    } else if (complete == 1) {
      expected.insert(expected.end(), {1, 0, 0, 0});
    } else if (complete == 2) {
      expected.insert(expected.end(), {1, 1, 0, 0});
    } else {
      expected.insert(expected.end(), {0, 1, 1, 0});
    }
  }
  return expected;
}

TEST(KernelBlockTopK, WorkedByHand) {
  Case c;
  const std::vector<Dim> dims = {dim("batch", 1), dim("length", 16), dim("indexer_blocks", 4)};
  const TensorId scores = c.tensor("scores", dims);
  const Op& op = c.op(OpKind::kBlockTopK, {scores}, {c.tensor("selection", dims)}, topk_attrs(2));
  TensorData data = TensorData::zeros(c.info(scores));
  data.values = worked_scores();
  const std::vector<float> out = run(c.graph, op, {data})[0].values;
  EXPECT_EQ(out, worked_selection());
  // k of 1 at the tie keeps block 1 alone (the lower index of the two 3s).
  const Op& one = c.op(OpKind::kBlockTopK, {scores}, {c.tensor("one", dims)}, topk_attrs(1));
  const std::vector<float> single = run(c.graph, one, {data})[0].values;
  EXPECT_EQ(std::vector<float>(single.end() - 4, single.end()), (std::vector<float>{0, 1, 0, 0}));
}

// Queries split over "context" (8 of 16 per device): each device's rows equal the whole's, as
// its queries read their global positions.
TEST(KernelBlockTopK, SplitQueriesReadGlobalPositions) {
  Case c;
  const std::vector<Dim> local_dims = {dim("batch", 1), split("length", 8, 16, "context"),
                                       dim("indexer_blocks", 4)};
  const TensorId local = c.tensor("local", local_dims);
  const Op& op =
      c.op(OpKind::kBlockTopK, {local}, {c.tensor("local_selection", local_dims)}, topk_attrs(2));
  TensorData whole = TensorData::zeros(std::vector<int64_t>{1, 16, 4});
  whole.values = worked_scores();
  const std::vector<float> expected = worked_selection();
  constexpr int64_t kRows = 8;             // queries per device
  constexpr int64_t kEntries = kRows * 4;  // their selection entries
  for (int device = 0; device < 2; ++device) {
    const TensorData out = run(c.graph, op, {slice(whole, 1, device * kRows, kRows)},
                               device_on("context", device, 2))[0];
    EXPECT_EQ(out.values, std::vector<float>(expected.begin() + device * kEntries,
                                             expected.begin() + (device + 1) * kEntries));
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
