// sim/perf/tokamax_gmm_tiling.cpp: tokamax's tuned ragged_dot tiles (see the header).
#include "sim/perf/tokamax_gmm_tiling.h"

#include <array>

namespace tpusim {
namespace {

struct TunedEntry {
  int64_t m;
  int64_t k;
  int64_t n;
  int64_t groups;
  TokamaxTiling tiling;
};

// The unquantized entries (is_quantized=False) of tokamax 0.0.10's GMM_TILING_TUNED_LUT,
// GMM_RHS_TRANSPOSE_TILING_TUNED_LUT and TGMM_TILING_TUNED_LUT, in table order. Where a key
// appears twice (131072, 7168, 2048, 256), Python's dict keeps the later value, as here.
constexpr std::array<TunedEntry, 14> kGmmTable = {{
    {262144, 7168, 2048, 256, {256, 7168, 512}},
    {262144, 2048, 7168, 256, {128, 2048, 3584}},
    {327680, 2880, 2880, 128, {512, 2944, 1536}},
    {393216, 2048, 768, 128, {512, 2048, 768}},
    {393216, 768, 2048, 128, {1024, 768, 2048}},
    {524288, 4096, 1536, 128, {256, 4096, 1536}},
    {524288, 1536, 4096, 128, {512, 1536, 1536}},
    {262144, 4096, 1536, 128, {256, 4096, 1536}},
    {262144, 1536, 4096, 128, {256, 1536, 4096}},
    {131072, 2048, 7168, 256, {128, 2048, 3584}},
    {131072, 4096, 1536, 128, {256, 4096, 1536}},
    {131072, 1536, 4096, 128, {256, 1536, 4096}},
    {131072, 7168, 2048, 256, {512, 3584, 1024}},
    {65536, 7168, 2048, 256, {256, 3584, 1024}},
}};

constexpr std::array<TunedEntry, 14> kGmmTransposeRhsTable = {{
    {262144, 7168, 2048, 256, {256, 2048, 1792}},
    {262144, 2048, 7168, 256, {256, 7168, 512}},
    {327680, 2880, 2880, 128, {512, 2944, 1536}},
    {393216, 2048, 768, 128, {1024, 768, 2048}},
    {393216, 768, 2048, 128, {512, 2048, 768}},
    {524288, 4096, 1536, 128, {1024, 1536, 1024}},
    {524288, 1536, 4096, 128, {1024, 1024, 1536}},
    {262144, 4096, 1536, 128, {512, 1536, 1024}},
    {262144, 1536, 4096, 128, {1024, 1024, 1536}},
    {131072, 2048, 7168, 256, {512, 7168, 512}},
    {131072, 4096, 1536, 128, {512, 1536, 1024}},
    {131072, 1536, 4096, 128, {512, 1024, 1536}},
    {131072, 7168, 2048, 256, {512, 2048, 1792}},
    {65536, 7168, 2048, 256, {512, 2048, 1024}},
}};

constexpr std::array<TunedEntry, 14> kTgmmTable = {{
    {262144, 7168, 2048, 256, {512, 1024, 2048}},
    {262144, 2048, 7168, 256, {256, 2048, 1024}},
    {327680, 2880, 2880, 128, {512, 2944, 768}},
    {393216, 2048, 768, 128, {512, 2048, 768}},
    {393216, 768, 2048, 128, {512, 768, 2048}},
    {524288, 4096, 1536, 128, {512, 4096, 512}},
    {524288, 1536, 4096, 128, {512, 512, 4096}},
    {262144, 4096, 1536, 128, {512, 4096, 512}},
    {262144, 1536, 4096, 128, {512, 512, 4096}},
    {131072, 2048, 7168, 256, {256, 2048, 1024}},
    {131072, 4096, 1536, 128, {512, 1024, 1536}},
    {131072, 1536, 4096, 128, {512, 512, 4096}},
    {131072, 7168, 2048, 256, {256, 1792, 1024}},
    {65536, 7168, 2048, 256, {256, 1024, 2048}},
}};

}  // namespace

TokamaxTiling tokamax_heuristic_tiling(TokamaxKernel kernel, int64_t m, int64_t k, int64_t n,
                                       int64_t groups) {
  const auto& table = kernel == TokamaxKernel::kGmm               ? kGmmTable
                      : kernel == TokamaxKernel::kGmmTransposeRhs ? kGmmTransposeRhsTable
                                                                  : kTgmmTable;
  for (const TunedEntry& entry : table) {
    if (entry.m == m && entry.k == k && entry.n == n && entry.groups == groups) {
      return entry.tiling;
    }
  }
  return TokamaxTiling{};
}

}  // namespace tpusim
