// sim/explore/explore_settings.h: what one schedule's search reads from its config besides the
// search space (search_space.h) and the perf options, read once by from_config.
//
// Example:
//   const ExploreSettings settings = ExploreSettings::from_config(config);
//   settings.max_target_length;  // 8192: tokens per sequence, for tokens/s
#pragma once

#include <cstdint>

#include "model/config.h"

namespace tpusim {

struct ExploreSettings {
  int64_t max_target_length = 0;
  int64_t num_experts = 0;  // > 1: the schedule bound is left to the per-program bounds
  double hbm_headroom_fraction = 0;

  static ExploreSettings from_config(const Config& config);
};

}  // namespace tpusim
