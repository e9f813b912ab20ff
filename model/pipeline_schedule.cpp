#include "model/pipeline_schedule.h"

#include <cstdio>

#include "common/error.h"
#include "model/config.h"
#include "model/model_dims.h"

namespace tpusim {
namespace {

// A pipeline parallelism key as a stage count: UserError unless a positive number.
int64_t stage_count_from_config(const Config& config, const std::string& key) {
  const int64_t value = config.get_int(key);
  if (value == -1) {
    throw UserError(key + "=-1: give the number of pipeline stages explicitly");
  }
  if (value < 1) {
    throw UserError(key + "=" + std::to_string(value) + " must be a positive number of stages");
  }
  return value;
}

}  // namespace

double PipelineSchedule::bubble_fraction() const {
  return static_cast<double>((stages - 1) * forwarding_delay) / static_cast<double>(iterations());
}

std::string PipelineSchedule::describe() const {
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, "%.1f%%", 100.0 * bubble_fraction());
  return std::to_string(stages) + " stages x " + std::to_string(layers_per_stage) +
         (layers_per_stage == 1 ? " layer" : " layers") + ", " + std::to_string(repeats) +
         (repeats == 1 ? " repeat, " : " repeats, ") + std::to_string(microbatches) +
         " microbatches: " + std::to_string(iterations()) + " iterations, bubble " + bubble;
}

PipelineSchedule PipelineSchedule::from_config(const Config& config, int64_t batch) {
  PipelineSchedule schedule;
  schedule.stages = stage_count_from_config(config, "ici_pipeline_parallelism") *
                    stage_count_from_config(config, "dcn_pipeline_parallelism");
  if (!schedule.active()) {
    return schedule;
  }
  const int64_t decoder_layers = ModelDims::from_config(config).num_layers;
  const int64_t pipelined = config.get_int("pipeline_parallel_layers");
  if (pipelined != -1 && pipelined != decoder_layers) {
    // MaxText then runs the remaining layers outside the pipeline; tpusim does not model that.
    throw UserError("pipeline_parallel_layers=" + std::to_string(pipelined) + ": only -1 (all " +
                    std::to_string(decoder_layers) + " decoder layers in the pipeline) is modeled");
  }
  schedule.layers = decoder_layers;
  schedule.layers_per_stage = config.get_int("num_layers_per_pipeline_stage");
  if (schedule.layers_per_stage < 1) {
    throw UserError("num_layers_per_pipeline_stage=" + std::to_string(schedule.layers_per_stage) +
                    " must be positive");
  }
  const int64_t per_repeat = schedule.stages * schedule.layers_per_stage;
  const int64_t repeats = config.get_int("num_pipeline_repeats");
  if (repeats == -1) {
    if (schedule.layers % per_repeat != 0) {
      throw UserError("num_layers_per_pipeline_stage=" + std::to_string(schedule.layers_per_stage) +
                      ": " + std::to_string(schedule.stages) + " stages x " +
                      std::to_string(schedule.layers_per_stage) +
                      (schedule.layers_per_stage == 1 ? " layer" : " layers") +
                      " per stage must divide the " + std::to_string(schedule.layers) +
                      " pipelined layers");
    }
    schedule.repeats = schedule.layers / per_repeat;
  } else {
    if (repeats < 1 || repeats * per_repeat != schedule.layers) {
      throw UserError("num_pipeline_repeats=" + std::to_string(repeats) + ": " +
                      std::to_string(schedule.stages) + " stages x " +
                      std::to_string(schedule.layers_per_stage) + " layers per stage x " +
                      std::to_string(repeats) + " repeats must equal the " +
                      std::to_string(schedule.layers) + " pipelined layers");
    }
    schedule.repeats = repeats;
  }
  const bool delay = config.get_bool("pipeline_delay_activation_forwarding");
  schedule.forwarding_delay = delay ? 2 : 1;
  const int64_t microbatches = config.get_int("num_pipeline_microbatches");
  if (microbatches == -1) {
    schedule.microbatches = schedule.stages * schedule.forwarding_delay;
  } else if (microbatches < 1 || microbatches % schedule.stages != 0) {
    throw UserError("num_pipeline_microbatches=" + std::to_string(microbatches) +
                    ": must be a positive multiple of the " + std::to_string(schedule.stages) +
                    " pipeline stages");
  } else {
    schedule.microbatches = microbatches;
  }
  if (batch % schedule.microbatches != 0) {
    throw UserError("num_pipeline_microbatches=" + std::to_string(schedule.microbatches) +
                    ": must divide the " + std::to_string(batch) +
                    " sequences of a step's batch (per_device_batch_size x devices)");
  }
  return schedule;
}

}  // namespace tpusim
