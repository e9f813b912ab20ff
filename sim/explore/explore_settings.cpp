#include "sim/explore/explore_settings.h"

namespace tpusim {

ExploreSettings ExploreSettings::from_config(const Config& config) {
  ExploreSettings settings;
  settings.max_target_length = config.get_int("max_target_length");
  settings.num_experts = config.get_int("num_experts");
  settings.hbm_headroom_fraction = config.get_float("hbm_headroom_fraction");
  return settings;
}

}  // namespace tpusim
