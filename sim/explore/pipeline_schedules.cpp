#include "sim/explore/pipeline_schedules.h"

#include <algorithm>

#include "model/builder/layer_plan.h"
#include "model/model_dims.h"
#include "model/pipeline_schedule.h"

namespace tpusim {
namespace {

// Keys the user gave (Config's origin for them), which the search keeps as they are.
constexpr const char* kCommandLineOrigin = "command line";

// The pipeline keys as the config holds them, and which of them the user gave.
struct PipelineKeys {
  int64_t ici_stages = 1;  // ici_pipeline_parallelism
  int64_t dcn_stages = 1;  // dcn_pipeline_parallelism
  int64_t num_slices = 1;  // compile_topology_num_slices
  int64_t microbatches = 0;
  int64_t layers_per_stage = 0;
  bool delay_activation_forwarding = false;
  bool ici_pinned = false;
  bool dcn_pinned = false;
  bool microbatches_pinned = false;
  bool layers_pinned = false;  // num_layers_per_pipeline_stage or num_pipeline_repeats
};

PipelineKeys pipeline_keys_from_config(const Config& config) {
  auto pinned = [&](const char* key) {
    return config.has(key) && config.origin(key) == kCommandLineOrigin;
  };
  PipelineKeys keys;
  keys.ici_pinned = pinned("ici_pipeline_parallelism");
  keys.dcn_pinned = pinned("dcn_pipeline_parallelism");
  keys.ici_stages = config.get_int("ici_pipeline_parallelism");
  keys.dcn_stages = config.get_int("dcn_pipeline_parallelism");
  keys.num_slices = config.get_int("compile_topology_num_slices");
  keys.microbatches = config.get_int("num_pipeline_microbatches");
  keys.layers_per_stage = config.get_int("num_layers_per_pipeline_stage");
  keys.delay_activation_forwarding = config.get_bool("pipeline_delay_activation_forwarding");
  keys.microbatches_pinned = pinned("num_pipeline_microbatches");
  keys.layers_pinned = pinned("num_layers_per_pipeline_stage") || pinned("num_pipeline_repeats");
  return keys;
}

PipelineSchedule schedule_of(const Config& config, const ScheduleChoice& choice) {
  PipelineSchedule schedule;
  schedule.stages = choice.stages;
  schedule.layers_per_stage = choice.layers_per_stage;
  schedule.layers = ModelDims::from_config(config).num_layers;
  // A pinned layers-per-stage of 0 or less is kept for estimate to refuse by name: no repeats.
  const int64_t per_repeat = choice.stages * choice.layers_per_stage;
  schedule.repeats = per_repeat > 0 ? schedule.layers / per_repeat : 0;
  schedule.microbatches = choice.microbatches;
  schedule.forwarding_delay = pipeline_keys_from_config(config).delay_activation_forwarding ? 2 : 1;
  return schedule;
}

}  // namespace

double schedule_stretch(const Config& config, const ScheduleChoice& choice) {
  if (choice.stages <= 1) {
    return 1;
  }
  const PipelineSchedule schedule = schedule_of(config, choice);
  const int64_t working = schedule.microbatches * schedule.repeats;
  return working > 0 ? static_cast<double>(schedule.iterations()) / static_cast<double>(working)
                     : 1;
}

std::vector<ScheduleChoice> pipeline_schedule_choices(const Config& config,
                                                      std::vector<std::string>& keys) {
  const PipelineKeys given = pipeline_keys_from_config(config);
  const bool ici_pinned = given.ici_pinned;
  const bool dcn_pinned = given.dcn_pinned;
  const int64_t ici = given.ici_stages;
  const int64_t dcn = given.dcn_stages;
  const int64_t slices = std::max<int64_t>(1, given.num_slices);
  std::vector<int64_t> stage_counts;
  if (ici_pinned || dcn_pinned || slices == 1 || ici != 1) {
    stage_counts = {std::max<int64_t>(1, ici) * std::max<int64_t>(1, dcn)};
  } else {
    for (int64_t stages = 1; stages <= slices; ++stages) {
      if (slices % stages == 0) {
        stage_counts.push_back(stages);
      }
    }
    keys.emplace_back("dcn_pipeline_parallelism");
  }
  const bool microbatches_pinned = given.microbatches_pinned;
  const bool layers_pinned = given.layers_pinned;
  const int64_t layers = ModelDims::from_config(config).num_layers;
  const bool alike = plan_layers(config).size() == 1;
  std::vector<ScheduleChoice> choices;
  bool searched_schedule = false;
  for (const int64_t stages : stage_counts) {
    if (stages == 1) {
      choices.push_back({1, given.microbatches, given.layers_per_stage});
      continue;
    }
    if (!alike && !(ici_pinned || dcn_pinned)) {
      continue;  // pipelining is modeled for models whose layers are all alike
    }
    std::vector<int64_t> per_stage = {given.layers_per_stage};
    if (!layers_pinned) {
      per_stage = {1};
      if (layers % stages == 0 && layers / stages > 1) {
        per_stage.push_back(layers / stages);
      }
    }
    std::vector<int64_t> microbatches = {given.microbatches};
    if (!microbatches_pinned) {
      microbatches = {stages, 2 * stages, 4 * stages};
    }
    // A stage count the user pinned is searched even when no layers per stage divide the layers:
    // its schedule is then refused with estimate's own message (model/pipeline_schedule.h). Left
    // out, a pinned count that fits nothing left no schedule at all, and explore crashed.
    const bool stages_pinned = ici_pinned || dcn_pinned;
    // A pinned num_layers_per_pipeline_stage of 0 or less fits nothing (and divided by zero here):
    // it is kept, to be refused with estimate's message.
    const auto fits = [&](int64_t per) { return per > 0 && layers % (stages * per) == 0; };
    const bool any_fits = std::any_of(per_stage.begin(), per_stage.end(), fits);
    for (const int64_t layers_per_stage : per_stage) {
      if (!fits(layers_per_stage) && !layers_pinned && !(stages_pinned && !any_fits)) {
        continue;
      }
      for (const int64_t count : microbatches) {
        choices.push_back({stages, count, layers_per_stage});
        searched_schedule = true;
      }
    }
  }
  if (searched_schedule && !microbatches_pinned) {
    keys.emplace_back("num_pipeline_microbatches");
  }
  if (searched_schedule && !layers_pinned) {
    keys.emplace_back("num_layers_per_pipeline_stage");
  }
  return choices;
}

PipelineOption summarize_schedule(const ScheduleChoice& choice, const Config& config,
                                  const ExploreResult& result) {
  PipelineOption option;
  option.stages = choice.stages;
  option.microbatches = choice.stages > 1 ? choice.microbatches : 0;
  option.layers_per_stage = choice.stages > 1 ? choice.layers_per_stage : 0;
  option.schedule = "no pipeline";
  if (choice.stages > 1) {
    option.schedule = schedule_of(config, choice).describe();
  }
  option.candidates = result.candidates_in_space;
  option.evaluated = result.candidates_evaluated;
  option.programs_built = result.programs_built;
  option.elapsed_s = result.elapsed_s;
  if (result.top.empty()) {
    return option;
  }
  const RankedCandidate& best = result.top.front();
  option.found = true;
  option.step_time_s = best.step_time_s;
  option.objective = best.objective;
  option.args = best.args;
  for (const auto& [key, seconds] : best.breakdown) {
    if (key.kind == BreakdownKind::kPipelineBubble) {
      option.bubble_s += seconds;
    } else if (key.exposed_over("stage")) {
      option.stage_transfers_s += seconds;
    } else if (key.kind == BreakdownKind::kExposedGradientReduction) {
      option.gradient_reduction_s += seconds;
    }
  }
  return option;
}

Config with_schedule(const Config& config, const ScheduleChoice& choice) {
  Config scheduled = config;
  if (choice.stages > 1) {
    const int64_t ici = pipeline_keys_from_config(config).ici_stages;
    const bool dcn = ici == 1;
    scheduled.set(dcn ? "dcn_pipeline_parallelism" : "ici_pipeline_parallelism",
                  std::to_string(dcn ? choice.stages : ici), kCommandLineOrigin);
    scheduled.set("num_pipeline_microbatches", std::to_string(choice.microbatches),
                  kCommandLineOrigin);
    scheduled.set("num_layers_per_pipeline_stage", std::to_string(choice.layers_per_stage),
                  kCommandLineOrigin);
  }
  return scheduled;
}

}  // namespace tpusim
