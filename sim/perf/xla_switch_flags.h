// sim/perf/xla_switch_flags.h: the libtpu / XLA flags behind tpusim's two modeled compiler
// switches, in both directions.
//
// sparse_core_collective_offload (all-gather, reduce-scatter and all-reduce on the SparseCores)
// and collective_matmul (XLA's async collective fusion, which decomposes tensor-parallel
// collectives into the matmuls they feed) are not MaxText keys: a real run sets them with
// LIBTPU_INIT_ARGS. The flag names are the ones MaxText's published recipes export (the Ironwood
// run_recipe.sh files for the offload, the Trillium and v5p recipes for the fusion).
// sim/cli/xla_flags.h reads a recipe's flags into the switches; `libtpu_flags_for` writes the
// flags a run needs to get the switches tpusim assumed, for explore's MaxText command line.
//
// Example:
//   libtpu_flags_for(/*sparse_core_offload=*/true, /*collective_matmul=*/false, chip_v7x);
//   // {"--xla_tpu_enable_sparse_core_collective_offload_all_gather=true", ...three kinds...,
//   //  "--xla_tpu_enable_async_collective_fusion=false"}
#pragma once

#include <string>
#include <vector>

namespace tpusim {

struct ChipSpec;

// One flag per offloaded collective kind; any of them set true turns tpusim's offload on.
const std::vector<std::string>& sparse_core_offload_flag_names();

// The flag that turns the fusion on or off, then the companions the recipes set with it.
inline constexpr const char* kAsyncCollectiveFusionFlag = "xla_tpu_enable_async_collective_fusion";
const std::vector<std::string>& async_collective_fusion_companion_flags();

// The flags ("--name=value") that give a run these switch values on `chip`. The offload flags are
// written only for a chip with SparseCores; the fusion flags on every TPU (tpusim assumes the
// fusion on by default because recipes set it, not because libtpu does). None for a GPU.
std::vector<std::string> libtpu_flags_for(bool sparse_core_offload, bool collective_matmul,
                                          const ChipSpec& chip);

}  // namespace tpusim
