#include "sim/plan/plan_settings.h"

#include "model/config.h"

namespace tpusim {

PlanSettings PlanSettings::from_config(const Config& config) {
  PlanSettings settings;
  settings.model_name = config.get_string("model_name");
  settings.max_target_length = config.get_int("max_target_length");
  settings.hardware = config.get_string("hardware");
  settings.per_device_batch_size = config.get_float("per_device_batch_size");
  settings.num_experts = config.get_int("num_experts");
  return settings;
}

}  // namespace tpusim
