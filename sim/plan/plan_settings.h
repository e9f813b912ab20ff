// sim/plan/plan_settings.h: what `tpusim plan` reads from its config, read once by from_config.
//
// Example:
//   const PlanSettings settings = PlanSettings::from_config(config);
//   settings.model_name;  // "llama3.1-70b": the published runs' global batch range
#pragma once

#include <cstdint>
#include <string>

namespace tpusim {

class Config;

struct PlanSettings {
  std::string model_name;
  int64_t max_target_length = 0;
  std::string hardware;  // MaxText's `hardware`: tpu, gpu, gpu_multiprocess, cpu
  double per_device_batch_size = 0;
  int64_t num_experts = 0;

  static PlanSettings from_config(const Config& config);
};

}  // namespace tpusim
