// tests/sim/perf/tokamax_gmm_tiling_test.cpp: the tiles tokamax's ragged_dot picks for itself.
// Expected tilings are tokamax 0.0.10's tuned tables (_src/ops/ragged_dot/pallas_mosaic_tpu.py).
#include "sim/perf/tokamax_gmm_tiling.h"

#include <gtest/gtest.h>

namespace tpusim {
namespace {

// gpt-oss-120b on a 4x8x8 v7x slice: 10 x 8192 tokens x top-4 = 327680 rows, 128 experts of
// 2880 x 2880 per device. Its three kernels have entries of their own.
TEST(TokamaxGmmTiling, TunedShapesTakeTheirTableEntry) {
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmm, 327680, 2880, 2880, 128),
            (TokamaxTiling{512, 2944, 1536}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmmTransposeRhs, 327680, 2880, 2880, 128),
            (TokamaxTiling{512, 2944, 1536}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kTgmm, 327680, 2880, 2880, 128),
            (TokamaxTiling{512, 2944, 768}));
  // DeepSeek-V3's wi (7168 x 2048) and wo (2048 x 7168) at 8 x 4096 tokens x top-8 per device.
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmm, 262144, 7168, 2048, 256),
            (TokamaxTiling{256, 7168, 512}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmm, 262144, 2048, 7168, 256),
            (TokamaxTiling{128, 2048, 3584}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmmTransposeRhs, 262144, 7168, 2048, 256),
            (TokamaxTiling{256, 2048, 1792}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kTgmm, 262144, 2048, 7168, 256),
            (TokamaxTiling{256, 2048, 1024}));
}

// tokamax's tables list (131072, 7168, 2048, 256) twice; Python keeps the later value.
TEST(TokamaxGmmTiling, ARepeatedKeyKeepsItsLaterValue) {
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmm, 131072, 7168, 2048, 256),
            (TokamaxTiling{512, 3584, 1024}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmmTransposeRhs, 131072, 7168, 2048, 256),
            (TokamaxTiling{512, 2048, 1792}));
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kTgmm, 131072, 7168, 2048, 256),
            (TokamaxTiling{256, 1792, 1024}));
}

// Any other shape (here gpt-oss's with one row fewer, or with 64 experts) gets tokamax's
// Config() default, 128 x 128 x 128.
TEST(TokamaxGmmTiling, OtherShapesGetTheDefault128Tiles) {
  const TokamaxTiling fallback{128, 128, 128};
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmm, 327679, 2880, 2880, 128), fallback);
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kGmm, 327680, 2880, 2880, 64), fallback);
  EXPECT_EQ(tokamax_heuristic_tiling(TokamaxKernel::kTgmm, 65536, 2048, 7168, 256), fallback);
}

}  // namespace
}  // namespace tpusim
