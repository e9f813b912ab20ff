// sim/explore/pipeline_schedules.h: the pipeline schedules `tpusim explore` searches, one search
// each (sim/explore/explorer.h), and the summary of each that compares them.
//
// On a multislice slice with no stage axis pinned: every stage count over DCN that divides the
// slices (1 = no pipeline), each with MaxText's circular layout (num_layers_per_pipeline_stage=1)
// and one pass (layers / stages per stage), and num_pipeline_microbatches of 1, 2 and 4 x the
// stages; a key the user pinned keeps its value. Models whose decoder layers are of several kinds
// get no pipeline schedules (not modeled: model/builder/forward_builder.cpp).
//
// Example (llama2-7b on 4 x v5e-16):
//   std::vector<std::string> keys;
//   pipeline_schedule_choices(config, keys);  // 13: no pipeline, 2 and 4 stages x 2 x 3
//   Config scheduled = with_schedule(config, choice);  // the stage keys set as if given
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "sim/explore/explorer.h"

namespace tpusim {

struct ScheduleChoice {
  int64_t stages = 1;
  int64_t microbatches = -1;     // num_pipeline_microbatches
  int64_t layers_per_stage = 1;  // num_layers_per_pipeline_stage
};

// The schedules to search, stages 1 first; `keys` gets the keys this searches.
std::vector<ScheduleChoice> pipeline_schedule_choices(const Config& config,
                                                      std::vector<std::string>& keys);

// `config` with the schedule's keys set as if given on the command line (pinned for the search).
Config with_schedule(const Config& config, const ScheduleChoice& choice);

// The schedule's loop iterations over those that carry a microbatch, M R + (S - 1) d over M R:
// how much longer its decoder layers compute than without the bubble (1 for no pipeline). A
// schedule whose layers do not split into its stages (MaxText refuses it) gives 1.
double schedule_stretch(const Config& config, const ScheduleChoice& choice);

// The best candidate of one schedule's search and what it loses time to.
PipelineOption summarize_schedule(const ScheduleChoice& choice, const Config& config,
                                  const ExploreResult& result);

}  // namespace tpusim
