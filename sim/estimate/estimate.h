// sim/estimate/estimate.h: everything `tpusim estimate` reports for one config, in one place
// (the CLI, `validate` and `explore` all call it).
//
// Example:
//   Estimate estimate = estimate_config(Config::load("", {"model_name=llama3.1-8b",
//                                                         "compile_topology=v6e-8"}));
//   estimate.step_seconds; estimate.mfu; estimate.to_json();
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "sharding/step_program.h"
#include "sim/accounting/program_flops.h"
#include "sim/memory/memory_model.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {

class Config;

struct Estimate {
  StepProgram program;
  ProgramFlops flops;
  MemoryEstimate memory;
  StepTiming timing;
  PerfOptions perf;  // what timed it (the per-op details of the page re-cost ops under it)
  double model_tflop_per_device_step = 0;  // MaxText convention
  double step_seconds = 0;
  double mfu = 0;                   // model FLOP/s per device / mfu_peak_bf16_tflops_per_device
  double hardware_utilization = 0;  // executed matmul FLOP/s per device / bf16 peak per device
  double tflops_per_device = 0;
  double tflops_per_chip = 0;
  double tokens_per_s = 0;
  double tokens_per_s_per_chip = 0;
  nlohmann::json json;  // the full report (estimate --json)
};

// `mechanisms`: those switched on (all unless `--without`), for the partitioner, the memory
// model and the perf options.
Estimate estimate_config(const Config& config, const MechanismSet& mechanisms = MechanismSet());

// Chrome trace-event JSON (Perfetto) of the whole step (every layer iteration:
// sim/estimate/whole_step.h): the device as a named process, one named track per lane
// (sim/estimate/trace_lanes.h), each op with its region and what bounds it (or its collective
// kind) as args, a compute op also its FLOPs, HBM bytes, shapes, achieved rates and whether it is
// recomputed (sim/estimate/op_details.h), and a flow arrow from each collective or transfer to the
// op that waited for it; HBM in use by kind as a counter track at each memory checkpoint.
std::string chrome_trace(const Estimate& estimate);

}  // namespace tpusim
