// model/pipeline_schedule.h: MaxText's SPMD pipeline, as numbers a step program is built from.
//
// With a stage mesh axis of S > 1 (ici_pipeline_parallelism x dcn_pipeline_parallelism), MaxText
// (layers/pipeline.py, pyconfig set_and_validate_pipeline_config) splits the decoder layers over S
// stages and runs a loop every device executes in lockstep: in each iteration every stage runs
// num_layers_per_pipeline_stage (k) layers on one microbatch (global batch / M sequences), then
// hands its output to the next stage (a collective permute over `stage`). Layers are laid out
// circularly: stage s holds layers r*S*k + s*k + j for repeats r < R and j < k, so a microbatch
// passes the S stages R times. Stage s works on microbatch (t - s) mod M of repeat (t - s) div M
// in iteration t; the first S - 1 iterations of stage S-1 and the last of stage 0 have nothing to
// work on but still compute (SPMD): that is the bubble. Iterations = M R + (S - 1) d, with d = 2
// when pipeline_delay_activation_forwarding delays each hand-over by an iteration, else 1.
//
// Defaults as MaxText derives them: pipeline_parallel_layers -1 = all decoder layers,
// num_pipeline_repeats -1 = layers / (S k), num_pipeline_microbatches -1 = S (2 S with the delay).
// Constraints (each a UserError naming the key): S k R = layers, M a multiple of S, the microbatch
// of the step divisible by M.
//
// Example (llama3.1-70b, 80 layers, dcn_pipeline_parallelism=4, num_pipeline_microbatches=8):
//   PipelineSchedule p = PipelineSchedule::from_config(config, /*batch=*/256);
//   p.stages == 4; p.layers_per_stage == 1; p.repeats == 20; p.iterations() == 8 * 20 + 3;
//   p.bubble_fraction() == 3.0 / 163
#pragma once

#include <cstdint>
#include <string>

namespace tpusim {

class Config;

struct PipelineSchedule {
  int64_t stages = 1;            // S: the stage mesh axis
  int64_t layers = 0;            // pipeline_parallel_layers: decoder layers in the pipeline
  int64_t layers_per_stage = 1;  // k: num_layers_per_pipeline_stage, run per iteration
  int64_t repeats = 1;           // R: num_pipeline_repeats (circular passes over the stages)
  int64_t microbatches = 1;      // M: num_pipeline_microbatches
  int64_t forwarding_delay = 1;  // d: 2 with pipeline_delay_activation_forwarding

  bool active() const { return stages > 1; }
  // Loop iterations every device runs: M R + (S - 1) d.
  int64_t iterations() const { return microbatches * repeats + (stages - 1) * forwarding_delay; }
  // Layers a device holds (its stage's share): R k.
  int64_t layers_held() const { return repeats * layers_per_stage; }
  // Of the iterations, the ones a stage computes on nothing.
  double bubble_fraction() const;
  // "4 stages x 1 layer, 20 repeats, 8 microbatches: 163 iterations, bubble 1.8%"
  std::string describe() const;

  // From the config's pipeline keys; `batch` is the sequences of one step's microbatch (the
  // graph's batch). Inactive (stages == 1) when the stage axis is 1. Throws UserError naming the
  // key on a violated constraint.
  static PipelineSchedule from_config(const Config& config, int64_t batch);
};

}  // namespace tpusim
