// sim/perf/tokamax_gmm_tiling.h: the tiles tokamax's Mosaic TPU ragged_dot picks for itself.
//
// MaxText's unquantized tokamax path (use_tokamax_gmm=true, no quantization, use_gmm_v2=false)
// calls tokamax.ragged_dot(..., implementation="mosaic") without a tiling: the wi_tile_* and
// wo_tile_* keys never reach the kernel. tokamax then takes its tuned lookup table when the call's
// (m, k, n, groups) is one of its entries and (128, 128, 128) otherwise (tokamax 0.0.10,
// _src/ops/ragged_dot/pallas_mosaic_tpu.py, _get_heuristics_config; docs/reference/hardware.md
// §5.15). Each of the three kernels has its own table and its own key:
//   kGmm             forward, lhs [m, k] x rhs [groups, k, n]: key (m, k, n)
//   kGmmTransposeRhs input gradient, grad [m, n] x rhs [groups, k, n]^T: key (m, k, n), where k
//                    is the output width and n the contraction
//   kTgmm            weight gradient, lhs [m, k]^T x grad [m, n] per group: key (m, k, n)
// The tiling is always (tile_m rows, tile over the contraction, tile over the output columns) for
// kGmm and kGmmTransposeRhs, and (tile_m rows, tile over k, tile over n) for kTgmm.
//
// Example:
//   TokamaxTiling tiling = tokamax_heuristic_tiling(TokamaxKernel::kGmm, 327680, 2880, 2880, 128);
//   tiling.tile_m;  // 512 (gpt-oss-120b's forward shape on a 4x8x8 v7x slice)
#pragma once

#include <cstdint>

namespace tpusim {

enum class TokamaxKernel { kGmm, kGmmTransposeRhs, kTgmm };

struct TokamaxTiling {
  int64_t tile_m = 128;
  int64_t tile_k = 128;
  int64_t tile_n = 128;
  bool operator==(const TokamaxTiling&) const = default;
};

// The unquantized tiling tokamax's heuristics config returns for one call of `kernel` with key
// (m, k, n) and `groups` experts: a tuned table entry, else tokamax's default (128, 128, 128).
TokamaxTiling tokamax_heuristic_tiling(TokamaxKernel kernel, int64_t m, int64_t k, int64_t n,
                                       int64_t groups);

}  // namespace tpusim
