// Batch classes (sim/explore/batch_classes.h) against the partitioner: on random meshes of dense,
// multislice and pipelined settings at a small global batch (so that per_device_batch_size < 1
// pads the batch up on many meshes), every two batches with the same key are partitioned apart and
// their remat_policy=none programs must give the same per-microbatch and optimizer TensorCore sums
// bit for bit, so that one's bound at the other's accumulation count is the other's bound exactly
// (and so never above it). MoE routing gets no key. And explore with the classes finds the same
// top N as without them, from a bar that bounds most batches out, building fewer programs; a run
// that builds every program checks each class's bound against the built one (std::logic_error).
#include "sim/explore/batch_classes.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/divisibility.h"
#include "sharding/partitioner.h"
#include "sim/explore/explorer.h"
#include "sim/explore/search_space.h"
#include "sim/explore/step_bounds.h"
#include "sim/explore/training_step_cache.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {
namespace {

struct Setting {
  std::vector<std::string> keys;
  int64_t global_batch = 0;
};

const std::vector<Setting> kSettings = {
    {{"model_name=tiny-llama", "compile_topology=v5e-8", "max_target_length=256"}, 4},
    {{"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048"}, 8},
    {{"model_name=llama3.1-8b", "compile_topology=tpu7x-16", "max_target_length=4096"}, 8},
    {{"model_name=llama2-7b", "compile_topology=v5e-8", "compile_topology_num_slices=2",
      "max_target_length=1024"},
     8},
    {{"model_name=tiny-llama", "compile_topology=v5e-8", "compile_topology_num_slices=2",
      "max_target_length=256", "dcn_pipeline_parallelism=2", "num_pipeline_microbatches=2",
      "num_layers_per_pipeline_stage=1"},
     8},
};

StepProgram none_program(const SearchSpace& space, TrainingStepCache& steps,
                         const LogicalAxisRules& rules, const MeshShape& mesh, size_t batch) {
  StepProgram program;
  program.slice = space.slice;
  program.mesh = place_mesh(mesh, space.slice);
  program.step = steps.get(batch, TrainingStepCache::kNoRemat);
  program.microbatch = space.batches[batch].microbatch;
  program.accumulation_steps = space.batches[batch].accumulation_steps;
  program.global_batch = program.microbatch * program.accumulation_steps;
  program.program = partition(*program.step, rules, program.mesh);
  return program;
}

// Stronger than equal bounds: the two per-device programs have the same ops and every tensor the
// same local dims (a reshard of a batch dim onto fewer axes than its rule's, which the key does
// not see, would show here first).
void expect_same_local_shapes(const StepProgram& a, const StepProgram& b,
                              const std::string& where) {
  const Graph& x = a.program.graph;
  const Graph& y = b.program.graph;
  ASSERT_EQ(x.ops().size(), y.ops().size()) << where;
  ASSERT_EQ(x.tensors().size(), y.tensors().size()) << where;
  for (size_t index = 0; index < x.tensors().size(); ++index) {
    const Tensor& left = x.tensors()[index];
    const Tensor& right = y.tensors()[index];
    ASSERT_EQ(left.dims.size(), right.dims.size()) << where << " " << left.name;
    for (size_t dim = 0; dim < left.dims.size(); ++dim) {
      EXPECT_EQ(left.dims[dim].size, right.dims[dim].size) << where << " " << left.name;
    }
  }
}

TEST(BatchClasses, BatchesOfOneKeyGiveTheSameTensorCoreSums) {
  std::mt19937 random(56);
  int compared = 0;
  int settings_with_classes = 0;
  for (const Setting& setting : kSettings) {
    const Config config = Config::load("", setting.keys);
    const SearchSpace space =
        build_search_space(config, {.global_batch_size = setting.global_batch});
    ASSERT_GE(space.batches.size(), 2U) << setting.keys[0];
    const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
    TrainingStepCache steps(config, space);
    std::vector<const TrainingStep*> none_steps;
    for (size_t batch = 0; batch < space.batches.size(); ++batch) {
      none_steps.push_back(steps.get(batch, TrainingStepCache::kNoRemat).get());
    }
    const BatchClasses classes(none_steps, rules);
    const Divisibility divisibility(*steps.get(0, 0), rules);
    const CostContext base = perf_options_from_config(config, *space.slice.chip).cost;
    std::vector<CostContext> contexts = {base, base};
    contexts[0].flash_attention = true;
    contexts[1].flash_attention = false;
    int in_setting = 0;
    for (int draw = 0; draw < 20000 && in_setting < 100; ++draw) {
      const MeshShape& mesh = space.meshes[random() % space.meshes.size()];
      const size_t a = random() % space.batches.size();
      const size_t b = random() % space.batches.size();
      const std::vector<int64_t> key = classes.key(mesh, a);
      if (a == b || key.empty() || key != classes.key(mesh, b) ||
          !divisibility.parameters_divide(mesh) ||
          !divisibility.batch_divides(mesh, space.batches[a].loaded_microbatch) ||
          !divisibility.batch_divides(mesh, space.batches[b].loaded_microbatch)) {
        continue;
      }
      ++in_setting;
      const StepProgram program_a = none_program(space, steps, rules, mesh, a);
      const StepProgram program_b = none_program(space, steps, rules, mesh, b);
      const ComputeBounds at_a = tensorcore_lower_bounds(program_a, contexts);
      const ComputeBounds at_b = tensorcore_lower_bounds(program_b, contexts);
      const std::string where = setting.keys[0] + " " + mesh.describe() + " microbatch " +
                                std::to_string(space.batches[a].microbatch) + " vs " +
                                std::to_string(space.batches[b].microbatch);
      expect_same_local_shapes(program_a, program_b, where);
      EXPECT_EQ(at_a.microbatch, at_b.microbatch) << where;
      EXPECT_EQ(at_a.optimizer, at_b.optimizer) << where;
      for (size_t context = 0; context < contexts.size(); ++context) {
        EXPECT_EQ(step_of(at_a.microbatch[context], at_a.optimizer[context],
                          space.batches[b].accumulation_steps),
                  at_b.step[context])
            << where;
      }
      ++compared;
    }
    settings_with_classes += in_setting > 0 ? 1 : 0;
    std::printf("%s: %d pairs of one key compared\n", setting.keys[0].c_str(), in_setting);
  }
  EXPECT_GE(settings_with_classes, 4);
  EXPECT_GE(compared, 300);
}

TEST(BatchClasses, MoeRoutingGetsNoKey) {
  const Config config =
      Config::load("", {"model_name=tiny-moe", "compile_topology=v5e-8", "max_target_length=256"});
  const SearchSpace space = build_search_space(config, {.global_batch_size = 4});
  TrainingStepCache steps(config, space);
  std::vector<const TrainingStep*> none_steps;
  for (size_t batch = 0; batch < space.batches.size(); ++batch) {
    none_steps.push_back(steps.get(batch, TrainingStepCache::kNoRemat).get());
  }
  const BatchClasses classes(none_steps, LogicalAxisRules::from_config(config));
  ASSERT_GE(space.batches.size(), 2U);
  for (const MeshShape& mesh : space.meshes) {
    EXPECT_TRUE(classes.key(mesh, 0).empty()) << mesh.describe();
  }
}

ExploreResult explore_with(const Config& config, double bar, bool classes, bool check) {
  ExploreOptions options;
  options.limits.global_batch_size = 8;
  options.objective = ExploreObjective::kTokensPerSecondPerChip;
  options.top = 3;
  options.threads = 1;
  options.initial_bar = bar;
  options.batch_classes = classes;
  options.check_equivalent_meshes = check;
  return explore(config, options);
}

TEST(BatchClasses, ExploreFindsTheSameTopWithFewerPrograms) {
  const Config config = Config::load(
      "", {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048"});
  const ExploreResult unbounded = explore_with(config, -1e300, false, false);
  ASSERT_EQ(unbounded.top.size(), 3U);
  // A bar just under the third best: the top 3 stays, most batches are bounded out.
  const double bar = unbounded.top.back().objective * (1 - 1e-9);
  const ExploreResult without = explore_with(config, bar, false, false);
  const ExploreResult with = explore_with(config, bar, true, false);
  ASSERT_EQ(with.top.size(), without.top.size());
  for (size_t index = 0; index < with.top.size(); ++index) {
    EXPECT_EQ(with.top[index].args, without.top[index].args) << index;
    EXPECT_EQ(with.top[index].step_time_s, without.top[index].step_time_s) << index;
    EXPECT_EQ(with.top[index].args, unbounded.top[index].args) << index;
  }
  EXPECT_GT(with.phases.batch_class_skips, 0);
  EXPECT_EQ(without.phases.batch_class_skips, 0);
  EXPECT_LT(with.programs_built, without.programs_built);
  // Every program built, each class's bound compared with the built one's (throws if one differs).
  const ExploreResult checked = explore_with(config, bar, true, true);
  ASSERT_EQ(checked.top.size(), with.top.size());
  EXPECT_EQ(checked.top.front().args, with.top.front().args);
}

}  // namespace
}  // namespace tpusim
