#include "model/batch_plan.h"

#include <cmath>

namespace tpusim {

BatchPlan plan_batch(double per_device_batch_size, int64_t devices, int64_t accumulation_steps) {
  constexpr double kSlack = 1e-9;
  const double sequences = per_device_batch_size * static_cast<double>(devices);
  BatchPlan plan;
  plan.microbatch = static_cast<int64_t>(std::floor(sequences + kSlack));
  plan.accumulation_steps = accumulation_steps;
  plan.global_batch = plan.microbatch * accumulation_steps;
  plan.whole = std::abs(sequences - static_cast<double>(plan.microbatch)) <= kSlack;
  plan.loaded_microbatch = per_device_batch_size < 1 ? devices : plan.microbatch;
  return plan;
}

}  // namespace tpusim
