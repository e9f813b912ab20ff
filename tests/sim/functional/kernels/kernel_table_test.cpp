// tests/sim/functional/kernels/kernel_table_test.cpp: the kernel table as a whole
// (sim/functional/kernels.cpp): the errors it raises for ops it must not run and for shapes that
// do not match, and the rule that every op kind with a kernel has a test case in this folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ir/op_kind_traits.h"
#include "sim/functional/kernels/families.h"
#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

TEST(KernelErrors, CollectivesAndShapeMismatchesThrow) {
  Case c;
  const TensorId a = c.tensor("a", {dim("m", 2), dim("k", 3)});
  const TensorId b = c.tensor("b", {dim("k", 4), dim("n", 2)});
  const TensorId out = c.tensor("out", {dim("m", 2), dim("n", 2)});
  const TensorId b_ok = c.tensor("b_ok", {dim("k", 3), dim("n", 2)});
  for (const OpKind kind : {OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kAllReduce,
                            OpKind::kAllToAll, OpKind::kCollectivePermute}) {
    const Op& op = c.op(kind, {a}, {c.tensor("collective_out", c.info(a).dims)});
    EXPECT_THROW(run(c.graph, op, {TensorData::zeros(c.info(a))}), std::logic_error);
  }
  OpAttrs attrs;
  attrs.contracted = {"k"};
  const Op& mismatched = c.op(OpKind::kEinsum, {a, b}, {out}, attrs);
  EXPECT_THROW(
      run(c.graph, mismatched, {TensorData::zeros(c.info(a)), TensorData::zeros(c.info(b))}),
      std::logic_error);
  const Op& good =
      c.op(OpKind::kEinsum, {a, b_ok}, {c.tensor("good_out", c.info(out).dims)}, attrs);
  // Data whose shape does not match the tensor's local dims.
  EXPECT_THROW(
      run(c.graph, good,
          {TensorData::zeros(std::vector<int64_t>{2, 4}), TensorData::zeros(c.info(b_ok))}),
      std::logic_error);
  EXPECT_NO_THROW(
      run(c.graph, good, {TensorData::zeros(c.info(a)), TensorData::zeros(c.info(b_ok))}));
}

// Every op kind the tests above run through run_kernel, with the tests that run it. List a kind
// only with a test case that really executes it (forward against a reference, a finite-difference
// check of a VJP, or a split-vs-whole comparison).
struct CoveredKind {
  OpKind kind;
  const char* tests;
};
constexpr CoveredKind kCoveredOpKinds[] = {
    {OpKind::kEinsum, "KernelEinsum.*, KernelMoe.GroupedMatmul*"},
    {OpKind::kElementwise, "KernelElementwise.*"},
    {OpKind::kReduceSum, "ReduceSumKernel.SumsTheDimsTheOutputLacks"},
    {OpKind::kRmsNorm, "KernelNorm.*"},
    {OpKind::kLayerNorm, "KernelNorm.*"},
    {OpKind::kNormGrad, "KernelNorm.GradientsMatchFiniteDifferences, KernelNorm.Split*"},
    {OpKind::kNormStatistics, "KernelNorm.SplitReducedDimWithStatisticsMatchesWhole"},
    {OpKind::kRope, "KernelRope.*"},
    {OpKind::kAttention, "KernelAttention.*"},
    {OpKind::kAttentionGrad,
     "KernelAttention.SplitQueryLengthMatchesWhole, KernelAttention.Gradients*"},
    {OpKind::kEmbeddingLookup, "KernelEmbedding.*"},
    {OpKind::kEmbeddingGrad, "KernelEmbedding.GradientMatchesFiniteDifferencesAndShards"},
    {OpKind::kCrossEntropy, "KernelCrossEntropy.*"},
    {OpKind::kCrossEntropyStatistics, "KernelCrossEntropy.VocabShardsWithStatisticsMatchWhole"},
    {OpKind::kCrossEntropyGrad, "KernelCrossEntropy.*"},
    {OpKind::kMoeRouter, "KernelMoe.Router*"},
    {OpKind::kRouterGrad, "KernelMoe.RouterGradient*, KernelMoe.VjpsMatchFiniteDifferences"},
    {OpKind::kMoeDispatch, "KernelMoe.DispatchAndCombineFollowSlots, KernelMoe.Dropless*"},
    {OpKind::kMoeCombine, "KernelMoe.DispatchAndCombineFollowSlots, KernelMoe.Dropless*"},
    {OpKind::kAdamUpdate, "KernelAdam.OneStepMatchesFormula"},
    {OpKind::kDynamicSlice, "KernelSlice.KeepsThisDevicesPartAndPadsPastTheEnd"},
    {OpKind::kHostOffload, "KernelHostTransfer.OffloadAndLoadCopyEveryValue"},
    {OpKind::kHostLoad, "KernelHostTransfer.OffloadAndLoadCopyEveryValue"},
    {OpKind::kSinkhorn, "KernelSinkhorn.*"},
    {OpKind::kSinkhornGrad, "KernelSinkhorn.GradientMatchesFiniteDifferences"},
    {OpKind::kBlockPool, "KernelBlockPool.*"},
    {OpKind::kBlockPoolGrad,
     "KernelBlockPool.GradientsMatchFiniteDifferences, KernelBlockPool.SplitBlocksMatchWhole, "
     "KernelBlockPool.OverlappingWindowsGradientsMatchFiniteDifferences"},
    {OpKind::kBlockTopK, "KernelBlockTopK.*"},
};

// A kernel without a test case fails here: every kind of run_kernel's table must be listed in
// kCoveredOpKinds (and so have a test above). The table holds exactly the kinds whose traits row
// (model/ir/op_kind_traits.cpp) says has_kernel, so a new kind cannot skip it either.
TEST(KernelCoverage, EveryKernelOpKindHasATestCase) {
  const std::vector<OpKind> kernel_kinds = kernels::kernel_op_kinds();
  for (const OpKind kind : kernel_kinds) {
    const bool covered = std::any_of(std::begin(kCoveredOpKinds), std::end(kCoveredOpKinds),
                                     [&](const CoveredKind& entry) { return entry.kind == kind; });
    EXPECT_TRUE(covered)
        << op_kind_name(kind)
        << " has a kernel but no test case in tests/sim/functional/kernels/ (write one and "
           "list it in kCoveredOpKinds)";
  }
  size_t with_kernel = 0;
  for (size_t index = 0; index < kOpKindCount; ++index) {
    const auto kind = static_cast<OpKind>(index);
    const bool has_kernel =
        std::find(kernel_kinds.begin(), kernel_kinds.end(), kind) != kernel_kinds.end();
    EXPECT_EQ(has_kernel, op_kind_traits(kind).has_kernel)
        << op_kind_name(kind) << ": the kernel table and the kind's traits row disagree";
    with_kernel += has_kernel ? 1 : 0;
  }
  EXPECT_EQ(with_kernel, kernel_kinds.size()) << "a kind is in the kernel table twice";
}

}  // namespace
}  // namespace tpusim::kernel_test
