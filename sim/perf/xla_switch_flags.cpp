#include "sim/perf/xla_switch_flags.h"

#include "hw/chip_spec.h"

namespace tpusim {

const std::vector<std::string>& sparse_core_offload_flag_names() {
  static const std::vector<std::string> names = {
      "xla_tpu_enable_sparse_core_collective_offload_all_gather",
      "xla_tpu_enable_sparse_core_collective_offload_reduce_scatter",
      "xla_tpu_enable_sparse_core_collective_offload_all_reduce"};
  return names;
}

const std::vector<std::string>& async_collective_fusion_companion_flags() {
  // As the v6e and v5p recipes of validation/recipes_public.json set them beside the fusion.
  static const std::vector<std::string> flags = {
      "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
      "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
      "--xla_tpu_overlap_compute_collective_tc=true"};
  return flags;
}

std::vector<std::string> libtpu_flags_for(bool sparse_core_offload, bool collective_matmul,
                                          const ChipSpec& chip) {
  std::vector<std::string> flags;
  if (chip.is_gpu()) {
    return flags;  // libtpu flags; XLA:GPU has neither switch under these names
  }
  if (chip.sparsecores_per_chip > 0) {
    for (const std::string& name : sparse_core_offload_flag_names()) {
      flags.push_back("--" + name + (sparse_core_offload ? "=true" : "=false"));
    }
  }
  flags.push_back(std::string("--") + kAsyncCollectiveFusionFlag +
                  (collective_matmul ? "=true" : "=false"));
  if (collective_matmul) {
    const std::vector<std::string>& companions = async_collective_fusion_companion_flags();
    flags.insert(flags.end(), companions.begin(), companions.end());
  }
  return flags;
}

}  // namespace tpusim
