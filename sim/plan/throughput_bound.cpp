#include "sim/plan/throughput_bound.h"

#include <limits>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "sharding/step_program.h"
#include "sim/perf/op_cost.h"
#include "sim/perf/step_simulator.h"
#include "sim/plan/plan_settings.h"

namespace tpusim {

ThroughputBound throughput_upper_bound(const Config& config) {
  const Slice slice = slice_from_config(config);
  const ChipSpec& chip = *slice.chip;
  const PerfOptions perf = perf_options_from_config(config, chip);
  const MaxTextFlops flops = maxtext_training_flops_per_device(config);
  const PlanSettings settings = PlanSettings::from_config(config);
  // MaxText's FLOPs per device over the tokens one device trains per step.
  const double tokens_per_device = settings.per_device_batch_size *
                                   static_cast<double>(flops.gradient_accumulation_steps) *
                                   static_cast<double>(settings.max_target_length);
  ThroughputBound bound;
  bound.flops_per_token = flops.total_tflops() * 1e12 / tokens_per_device;
  bound.flops_per_s_per_chip = peak_flops_per_device(perf.cost, true) *
                               chip.mxu_achievable_fraction * perf.cost.program_efficiency *
                               slice.devices_per_chip;
  bound.tokens_per_s_per_chip = settings.num_experts > 1
                                    ? std::numeric_limits<double>::infinity()
                                    : bound.flops_per_s_per_chip / bound.flops_per_token;
  return bound;
}

}  // namespace tpusim
