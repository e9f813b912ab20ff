// The estimate of a pipelined step, checked against the schedule's arithmetic worked out by hand.
//
// With the microbatch fixed, a schedule of T iterations of k layers costs
//   step = X + (T k) tau + T pi
// X: the embedding, head, optimizer and gradient reductions (the same for every k); tau: one
// layer's forward and backward on one microbatch; pi: one iteration's stage hand-overs (forward
// and backward). Three schedules of llama3.1-70b on 4 stages (k = 1, 2, 4) give X, tau and pi; a
// fourth (k = 5) must follow, and each schedule's bubble must be its (S - 1) idle iterations:
// (S - 1) (k tau + pi).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <Eigen/Dense>

#include "model/config.h"
#include "sim/estimate/estimate.h"

namespace tpusim {
namespace {

Estimate estimate_with(const std::vector<std::string>& extra) {
  // The command: llama3.1-70b on 4 v5e-256 slices, pipelined over DCN.
  std::vector<std::string> overrides = {
      "model_name=llama3.1-70b",    "compile_topology=v5e-256", "compile_topology_num_slices=4",
      "dcn_pipeline_parallelism=4", "ici_fsdp_parallelism=-1",  "num_pipeline_microbatches=8"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return estimate_config(Config::load("", overrides));
}

TEST(PipelineEstimate, BubbleIsTheIdleIterationsOfTheLoop) {
  struct Run {
    int64_t k;
    int64_t iterations;  // 8 x 80 / (4 k) + 3, by hand
    double step = 0;
    double bubble = 0;
  };
  std::vector<Run> runs = {{1, 163}, {2, 83}, {4, 43}, {5, 35}};
  for (Run& run : runs) {
    const Estimate estimate =
        estimate_with({"num_layers_per_pipeline_stage=" + std::to_string(run.k)});
    ASSERT_EQ(estimate.json["pipeline"]["iterations"].get<int64_t>(), run.iterations);
    run.step = estimate.step_seconds;
    run.bubble = estimate.json["breakdown"]["pipeline_bubble"].get<double>();
  }
  Eigen::Matrix3d system;
  Eigen::Vector3d steps;
  for (int row = 0; row < 3; ++row) {
    const auto t = static_cast<double>(runs[static_cast<size_t>(row)].iterations);
    const auto k = static_cast<double>(runs[static_cast<size_t>(row)].k);
    system.row(row) << 1.0, t * k, t;
    steps(row) = runs[static_cast<size_t>(row)].step;
  }
  const Eigen::Vector3d solved = system.fullPivLu().solve(steps);
  const double fixed = solved(0);
  const double layer = solved(1);
  const double hand_over = solved(2);
  EXPECT_GT(fixed, 0);
  EXPECT_GT(layer, 0);
  EXPECT_GT(hand_over, 0);  // the stages' hand-overs cross DCN and wait
  for (const Run& run : runs) {
    SCOPED_TRACE("k=" + std::to_string(run.k));
    const auto t = static_cast<double>(run.iterations);
    const auto k = static_cast<double>(run.k);
    EXPECT_NEAR(run.step / (fixed + t * k * layer + t * hand_over), 1.0, 0.005);
    EXPECT_NEAR(run.bubble / (3.0 * (k * layer + hand_over)), 1.0, 0.01);
  }
}

// MaxText's default (one layer per stage, circular) against one pass over 20 layers per stage:
// the same useful work; the bubble is 3 of 163 iterations against 3 of 11.
TEST(PipelineEstimate, CircularShrinksTheBubble) {
  const Estimate circular = estimate_with({});
  const Estimate one_pass = estimate_with({"num_layers_per_pipeline_stage=20"});
  const double circular_bubble = circular.json["breakdown"]["pipeline_bubble"].get<double>();
  const double one_pass_bubble = one_pass.json["breakdown"]["pipeline_bubble"].get<double>();
  EXPECT_DOUBLE_EQ(circular.json["pipeline"]["bubble_fraction"].get<double>(), 3.0 / 163.0);
  EXPECT_DOUBLE_EQ(one_pass.json["pipeline"]["bubble_fraction"].get<double>(), 3.0 / 11.0);
  EXPECT_LT(circular_bubble, one_pass_bubble / 5);
  EXPECT_LT(circular.step_seconds, one_pass.step_seconds);
  // The model FLOPs (MaxText's count, without the bubble) are the same.
  EXPECT_DOUBLE_EQ(circular.json["model_tflop_per_device_step"].get<double>(),
                   one_pass.json["model_tflop_per_device_step"].get<double>());
}

// Delayed forwarding reads a hand-over an iteration later, so the transfers hide behind the next
// iteration's layers, for (S - 1) more iterations.
TEST(PipelineEstimate, DelayedForwardingHidesTheHandOvers) {
  const Estimate plain = estimate_with({});
  const Estimate delayed = estimate_with({"pipeline_delay_activation_forwarding=true"});
  EXPECT_EQ(delayed.json["pipeline"]["iterations"].get<int64_t>(), 8 * 20 + 2 * 3);
  EXPECT_GT(plain.json["breakdown"].value("exposed_dcn_stage", 0.0), 0.0);
  EXPECT_EQ(delayed.json["breakdown"].value("exposed_dcn_stage", 0.0), 0.0);
}

}  // namespace
}  // namespace tpusim

namespace tpusim {
namespace {

// A stage holds its quarter of the 80 layers: against data parallelism over the same 4 slices
// (fsdp over each slice in both), the layer weights per device shrink 4x, the embedding and
// output head (sharded over fsdp only, by hand below) stay.
TEST(PipelineEstimate, AStageHoldsItsShareOfTheLayers) {
  const auto weights = [](const std::string& slices_axis) {
    return estimate_config(
               Config::load("", {"model_name=llama3.1-70b", "compile_topology=v5e-256",
                                 "compile_topology_num_slices=4", slices_axis,
                                 "ici_fsdp_parallelism=-1", "per_device_batch_size=2",
                                 "max_target_length=2048", "num_pipeline_microbatches=8"}))
        .memory.at_peak.weights;
  };
  const double pipelined = weights("dcn_pipeline_parallelism=4");
  const double data_parallel = weights("dcn_data_parallelism=4");
  // Token embedding and unembedding, 128256 x 8192 fp32 each over 256 fsdp shards, and the
  // final norm's 8192 fp32 scale (replicated).
  const double outside = 2.0 * 128256 * 8192 * 4 / 256 + 8192 * 4;
  EXPECT_NEAR(pipelined / (outside + (data_parallel - outside) / 4), 1.0, 1e-9);
}

}  // namespace
}  // namespace tpusim

namespace tpusim {
namespace {

// pipeline_fsdp_ag_once: the stage's 20 layers stay gathered through the loop. By hand, a
// llama3.1-70b layer gathers 8192 x (8192 + 1024 + 1024 + 8192) attention and 3 x 8192 x 28672
// MLP weights (the norms are not sharded over fsdp), in bf16, and sums their bf16 gradients
// gathered, and the two norm scales' fp32 gradients until their all-reduce: 20 x (855,638,016 x
// (2 + 2) + 2 x 8192 x 4) bytes more at the peak; the gathers and reductions run once per held
// layer (20 of the loop's 163 iterations).
TEST(PipelineEstimate, WeightsGatheredOnceStayInHbm) {
  const auto run = [](const std::string& once) {
    return estimate_config(Config::load(
        "", {"model_name=llama3.1-70b", "compile_topology=v5e-256", "compile_topology_num_slices=4",
             "dcn_pipeline_parallelism=4", "ici_fsdp_parallelism=-1", "per_device_batch_size=2",
             "max_target_length=2048", "num_pipeline_microbatches=8", once}));
  };
  const Estimate every = run("pipeline_fsdp_ag_once=false");
  const Estimate once = run("pipeline_fsdp_ag_once=true");
  const double per_layer = 8192.0 * (8192 + 1024 + 1024 + 8192) + 3.0 * 8192 * 28672;
  EXPECT_DOUBLE_EQ(per_layer, 855638016.0);
  EXPECT_NEAR(once.memory.peak_bytes - every.memory.peak_bytes, 20 * (per_layer * 4 + 2 * 8192 * 4),
              1.0);
  int shared = 0;
  for (const Op& op : once.program.program.graph.ops()) {
    if (op.attrs.iteration_share != 1) {
      ++shared;
      EXPECT_DOUBLE_EQ(op.attrs.iteration_share, 20.0 / 163.0) << op.name;
    }
  }
  EXPECT_GT(shared, 0);
}

}  // namespace
}  // namespace tpusim
