#include "sharding/step_program.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "model/batch_plan.h"
#include "model/config.h"
#include "sharding/divisibility.h"

namespace tpusim {

Slice slice_from_config(const Config& config) {
  const std::string topology = config.get_string("compile_topology");
  if (topology.empty()) {
    throw UserError("compile_topology: no slice given (e.g. compile_topology=v5p-128)",
                    "compile_topology");
  }
  const int64_t num_slices = config.get_int("compile_topology_num_slices");
  if (num_slices == 0 || num_slices < -1) {
    throw UserError("compile_topology_num_slices: " + std::to_string(num_slices) +
                        " must be -1 (one slice) or a positive count",
                    "compile_topology_num_slices");
  }
  // MaxText's num_slices, when set, overrides the slice count at run time (max_utils.py
  // get_num_slices); tpusim reads compile_topology_num_slices, so the two must agree (num_slices=2
  // alone estimated one slice, without a word).
  const int64_t runtime_slices = config.get_int("num_slices");
  if (runtime_slices == 0 || runtime_slices < -1) {
    throw UserError("num_slices: " + std::to_string(runtime_slices) +
                        " must be -1 (compile_topology_num_slices decides) or a positive count",
                    "num_slices");
  }
  if (runtime_slices != -1 && runtime_slices != std::max<int64_t>(1, num_slices)) {
    throw UserError("num_slices: " + std::to_string(runtime_slices) +
                        " but compile_topology_num_slices is " + std::to_string(num_slices) +
                        ": tpusim takes the slice count from compile_topology_num_slices; set it "
                        "to " +
                        std::to_string(runtime_slices) + " (or num_slices=-1)",
                    "num_slices");
  }
  Slice slice = parse_slice(topology, static_cast<int>(std::max<int64_t>(1, num_slices)));
  // MaxText's `hardware` must agree with the slice: a GPU node runs hardware=gpu (or
  // gpu_multiprocess), a TPU slice hardware=tpu; cpu is accepted with either.
  const std::string hardware = config.get_string("hardware");
  const bool gpu_hardware = hardware == "gpu" || hardware == "gpu_multiprocess";
  if (slice.chip->is_gpu() && hardware == "tpu") {
    throw UserError("hardware: 'tpu' but compile_topology '" + topology + "' is a GPU node (" +
                    slice.chip->display_name + "); set hardware=gpu");
  }
  if (!slice.chip->is_gpu() && gpu_hardware) {
    throw UserError("hardware: '" + hardware + "' but compile_topology '" + topology +
                    "' is a TPU slice; give a GPU node (e.g. compile_topology=a3) or hardware=tpu");
  }
  return slice;
}

namespace {

// What the program takes from the config besides the slice, the mesh and the model: the batch
// and the memory settings.
struct ProgramSettings {
  double per_device_batch_size = 0;
  int64_t gradient_accumulation_steps = 1;
  bool attention_scores_in_hbm = false;  // attention=dot_product
  double hbm_headroom_fraction = 0;
};

ProgramSettings program_settings_from_config(const Config& config) {
  ProgramSettings settings;
  settings.per_device_batch_size = config.get_float("per_device_batch_size");
  settings.gradient_accumulation_steps = config.get_int("gradient_accumulation_steps");
  settings.attention_scores_in_hbm = config.get_string("attention") == "dot_product";
  settings.hbm_headroom_fraction = config.get_float("hbm_headroom_fraction");
  return settings;
}

}  // namespace

StepProgram build_step_program(const Config& config, const MechanismSet& mechanisms,
                               LayerOrder order) {
  StepProgram result;
  result.slice = slice_from_config(config);
  result.mesh =
      place_mesh(resolve_mesh(config, result.slice), result.slice, placement_from_config(config));
  const ProgramSettings settings = program_settings_from_config(config);
  const double per_device = settings.per_device_batch_size;
  const BatchPlan batch =
      plan_batch(per_device, result.slice.total_devices(), settings.gradient_accumulation_steps);
  if (batch.microbatch < 1) {
    throw UserError("per_device_batch_size: " + std::to_string(per_device) + " x " +
                        std::to_string(result.slice.total_devices()) +
                        " devices is less than one sequence per step",
                    "per_device_batch_size");
  }
  result.microbatch = batch.microbatch;
  result.accumulation_steps = batch.accumulation_steps;
  result.global_batch = batch.global_batch;
  result.attention_scores_in_hbm = settings.attention_scores_in_hbm;
  result.hbm_headroom_fraction = settings.hbm_headroom_fraction;
  result.step =
      std::make_shared<const TrainingStep>(build_training_step(config, result.microbatch, order));
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  // What explore prunes as axis_does_not_divide, estimate and train refuse (the same check).
  Divisibility(*result.step, rules).require_divides(result.mesh.shape, batch, per_device);
  result.program = partition(*result.step, rules, result.mesh, mechanisms);
  return result;
}

}  // namespace tpusim
