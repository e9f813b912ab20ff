// The per-device program of a pipeline stage (model/pipeline_schedule.h): the decoder layers run
// as a loop of iterations x layers per stage on one microbatch, the device holds its stage's
// layers only, the residual stream (and its gradient) moves to the neighbouring stage every
// layers_per_stage layers, and the useful work equals MaxText's per-device FLOP count.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "model/ir/op_flops.h"
#include "sharding/step_program.h"

namespace tpusim {
namespace {

// llama3.1-70b (80 layers) on 4 v5e-256 slices, stages over DCN, fsdp over each slice.
Config pipelined(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {
      "model_name=llama3.1-70b",    "compile_topology=v5e-256",   "compile_topology_num_slices=4",
      "dcn_pipeline_parallelism=4", "ici_fsdp_parallelism=-1",    "per_device_batch_size=2",
      "max_target_length=2048",     "num_pipeline_microbatches=8"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return Config::load("", overrides);
}

struct Expected {
  int64_t iterations;
  int64_t layers_per_stage;
};

TEST(PipelineProgram, LoopLayersAndHandOvers) {
  // Circular (MaxText's default): 8 x 20 + 3 iterations of 1 layer; one pass: 8 + 3 of 20.
  for (const auto& [extra, expected] : std::vector<std::pair<std::vector<std::string>, Expected>>{
           {{}, {163, 1}}, {{"num_layers_per_pipeline_stage=20"}, {11, 20}}}) {
    SCOPED_TRACE(extra.empty() ? "circular" : extra.front());
    const StepProgram built = build_step_program(pipelined(extra));
    const Graph& graph = built.program.graph;
    int loops = 0;
    for (const Region& region : graph.regions()) {
      if (region.pipelined()) {
        ++loops;
        EXPECT_EQ(region.repeat, expected.iterations * expected.layers_per_stage) << region.name;
        EXPECT_EQ(region.parameter_sets(), 20) << region.name;  // 80 layers / 4 stages
      }
      if (region.phase == Phase::kOptimizer && region.name == "optimizer/layer") {
        EXPECT_EQ(region.repeat, 20);  // the stage's layers are updated once each
      }
    }
    EXPECT_EQ(loops, 2);  // forward and backward
    // Per loop (forward, backward): the hand-over the next iteration reads, the input stream,
    // and with circular storage (20 repeats, 8 microbatches > 4 stages) the storage mover.
    std::map<std::string, int> permutes;
    std::set<TensorId> carried;
    for (const Graph::Carry& carry : graph.carries()) {
      carried.insert(carry.from);
    }
    for (const Op& op : graph.ops()) {
      if (op.kind != OpKind::kCollectivePermute) {
        continue;
      }
      const std::string kind = op.name.substr(op.name.rfind('/') + 1);
      ++permutes[kind];
      EXPECT_EQ(op.attrs.mesh_axes, std::vector<std::string>{"stage"});
      EXPECT_EQ(op.attrs.group_size, 4);
      EXPECT_EQ(op.attrs.every, expected.layers_per_stage);
      EXPECT_EQ(carried.contains(op.outputs[0]), kind == "stage_permute") << op.name;
      // One microbatch's residual stream on this device: 2048 x 2 / 8 = 256 sequences of a
      // microbatch over 256 fsdp shards.
      const Tensor& moved = graph.tensor(op.inputs[0]);
      EXPECT_EQ(moved.dims.at(0).size, 1) << moved.name;
      EXPECT_EQ(moved.dims.at(1).size, 2048) << moved.name;
    }
    EXPECT_EQ(permutes["stage_permute"], 2);
    EXPECT_EQ(permutes["stream_permute"], 2);
    EXPECT_EQ(permutes["storage_permute"], expected.layers_per_stage == 1 ? 2 : 0);
    // The embedding shards its batch over the stages too: 2048 sequences / (4 x 256) = 2.
    const TensorId embedded =
        built.program.local_of_global[static_cast<size_t>(built.step->forward_info.embed_output)];
    EXPECT_EQ(graph.tensor(embedded).dims.at(0).size, 2);
  }
}

// Every iteration computes (SPMD), so the program does (S - 1) / iterations more layer work than
// it needs; the useful part, M R layer-iterations per layer slot, is MaxText's per-device count.
TEST(PipelineProgram, UsefulFlopsEqualMaxText) {
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{},
                                             {"num_layers_per_pipeline_stage=20"},
                                             {"pipeline_delay_activation_forwarding=true"}}) {
    SCOPED_TRACE(extra.empty() ? "circular" : extra.front());
    const Config config = pipelined(extra);
    const StepProgram built = build_step_program(config);
    const PipelineSchedule& schedule = built.step->forward_info.pipeline;
    const double useful = static_cast<double>(schedule.microbatches * schedule.repeats) /
                          static_cast<double>(schedule.iterations());
    const Graph& graph = built.program.graph;
    double total = 0;
    double executed = 0;
    for (const Op& op : graph.ops()) {
      if (op.phase != Phase::kForward && op.phase != Phase::kBackward) {
        continue;
      }
      const Region& region = graph.region(op.region);
      const double flops = static_cast<double>(region.repeat) * op_flops(graph, op).matmul;
      executed += flops;
      total += region.pipelined() ? flops * useful : flops;
    }
    const double maxtext = maxtext_training_flops_per_device(config).total_tflops() * 1e12;
    EXPECT_NEAR(total / maxtext, 1.0, 1e-9);
    EXPECT_GT(executed, total);
  }
}

}  // namespace
}  // namespace tpusim
