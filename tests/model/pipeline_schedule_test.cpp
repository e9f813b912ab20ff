// MaxText's pipeline arithmetic, derived here by hand from its rules (pyconfig
// set_and_validate_pipeline_config, layers/pipeline.py): iterations = M R + (S - 1) d, bubble =
// (S - 1) d / iterations, and each violated constraint a UserError naming its key.
#include "model/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {
namespace {

PipelineSchedule schedule_of(std::vector<std::string> overrides, int64_t batch = 256) {
  overrides.insert(overrides.begin(), "model_name=llama3.1-70b");  // 80 decoder layers
  return PipelineSchedule::from_config(Config::load("", overrides), batch);
}

std::string error_of(std::vector<std::string> overrides, int64_t batch = 256) {
  try {
    schedule_of(std::move(overrides), batch);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(PipelineSchedule, OneStageIsNoPipeline) {
  const PipelineSchedule none = schedule_of({});
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.stages, 1);
}

TEST(PipelineSchedule, CircularByDefault) {
  // MaxText's default num_layers_per_pipeline_stage is 1: 80 layers on 4 stages pass them 20
  // times (circular), 8 microbatches: 8 x 20 + 3 iterations, of which 3 are the bubble.
  const PipelineSchedule circular =
      schedule_of({"dcn_pipeline_parallelism=4", "num_pipeline_microbatches=8"});
  EXPECT_TRUE(circular.active());
  EXPECT_EQ(circular.stages, 4);
  EXPECT_EQ(circular.layers, 80);
  EXPECT_EQ(circular.layers_per_stage, 1);
  EXPECT_EQ(circular.repeats, 20);
  EXPECT_EQ(circular.microbatches, 8);
  EXPECT_EQ(circular.iterations(), 163);
  EXPECT_EQ(circular.layers_held(), 20);
  EXPECT_DOUBLE_EQ(circular.bubble_fraction(), 3.0 / 163.0);
  EXPECT_EQ(circular.describe(),
            "4 stages x 1 layer, 20 repeats, 8 microbatches: 163 iterations, bubble 1.8%");
}

TEST(PipelineSchedule, OnePassGPipe) {
  // 20 layers per stage: one pass (R = 1), the GPipe bubble (S - 1) / (M + S - 1) = 3 / 11.
  const PipelineSchedule gpipe =
      schedule_of({"ici_pipeline_parallelism=2", "dcn_pipeline_parallelism=2",
                   "num_pipeline_microbatches=8", "num_layers_per_pipeline_stage=20"});
  EXPECT_EQ(gpipe.stages, 4);
  EXPECT_EQ(gpipe.repeats, 1);
  EXPECT_EQ(gpipe.iterations(), 11);
  EXPECT_EQ(gpipe.layers_held(), 20);
  EXPECT_DOUBLE_EQ(gpipe.bubble_fraction(), 3.0 / 11.0);
}

TEST(PipelineSchedule, DefaultsAndDelayedForwarding) {
  // num_pipeline_microbatches -1 = the stage count; with delayed forwarding 2 S, and every
  // hand-over takes two iterations: M R + 2 (S - 1).
  EXPECT_EQ(schedule_of({"dcn_pipeline_parallelism=4"}).microbatches, 4);
  const PipelineSchedule delayed =
      schedule_of({"dcn_pipeline_parallelism=4", "pipeline_delay_activation_forwarding=true"});
  EXPECT_EQ(delayed.microbatches, 8);
  EXPECT_EQ(delayed.forwarding_delay, 2);
  EXPECT_EQ(delayed.iterations(), 8 * 20 + 2 * 3);
  EXPECT_DOUBLE_EQ(delayed.bubble_fraction(), 6.0 / 166.0);
  // Repeats given explicitly must agree with the layers.
  EXPECT_EQ(schedule_of({"dcn_pipeline_parallelism=4", "num_pipeline_repeats=10",
                         "num_layers_per_pipeline_stage=2"})
                .iterations(),
            4 * 10 + 3);
}

TEST(PipelineSchedule, ConstraintsNameTheirKey) {
  EXPECT_NE(error_of({"dcn_pipeline_parallelism=4", "num_pipeline_microbatches=6"})
                .find("num_pipeline_microbatches=6: must be a positive multiple of the 4"),
            std::string::npos);
  EXPECT_NE(error_of({"dcn_pipeline_parallelism=4", "num_layers_per_pipeline_stage=3"})
                .find("num_layers_per_pipeline_stage=3"),
            std::string::npos);
  EXPECT_NE(error_of({"dcn_pipeline_parallelism=4", "num_pipeline_repeats=3"})
                .find("num_pipeline_repeats=3"),
            std::string::npos);
  EXPECT_NE(error_of({"dcn_pipeline_parallelism=4", "num_pipeline_microbatches=8"}, 12)
                .find("num_pipeline_microbatches=8: must divide the 12 sequences"),
            std::string::npos);
  EXPECT_NE(error_of({"ici_pipeline_parallelism=-1"}).find("ici_pipeline_parallelism=-1"),
            std::string::npos);
  EXPECT_NE(error_of({"dcn_pipeline_parallelism=4", "pipeline_parallel_layers=40"})
                .find("pipeline_parallel_layers=40"),
            std::string::npos);
  EXPECT_EQ(error_of({"dcn_pipeline_parallelism=4", "pipeline_parallel_layers=80"}), "");
}

}  // namespace
}  // namespace tpusim
