// Batch classes (sim/explore/batch_classes.h) against the partitioner: on random meshes of dense,
// multislice and pipelined settings at a small global batch (so that per_device_batch_size < 1
// pads the batch up on many meshes), every two batches with the same key are partitioned apart and
// their remat_policy=none programs must give the same TensorCore seconds per region pass bit for
// bit, so that one's bound with the other's repeats and accumulation count is the other's bound
// exactly (and so never above it). The same across the pipeline schedules of one stage count
// (num_pipeline_microbatches and layers per stage differ). MoE routing gets no key. And explore
// with the classes finds the same top N as without them, from a bar that bounds most batches out,
// building fewer programs; a run that builds every program checks each class's seconds against
// the built one's (std::logic_error).
#include "sim/explore/batch_classes.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/divisibility.h"
#include "sharding/partitioner.h"
#include "sim/explore/explorer.h"
#include "sim/explore/mesh_equivalence.h"
#include "sim/explore/pipeline_schedules.h"
#include "sim/explore/search_space.h"
#include "sim/explore/step_bounds.h"
#include "sim/explore/training_step_cache.h"
#include "sim/perf/step_simulator.h"
#include "support/same_top.h"

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

// One schedule's search space and steps, joined to a BatchClasses.
struct Schedule {
  Config config;
  SearchSpace space;
  std::unique_ptr<TrainingStepCache> steps;
  size_t id = 0;  // in the BatchClasses
  int64_t stages = 1;
};

std::unique_ptr<Schedule> join(const Config& config, int64_t global_batch, int64_t stages,
                               BatchClasses& classes) {
  auto schedule = std::make_unique<Schedule>();
  schedule->config = config;
  schedule->space = build_search_space(schedule->config, {.global_batch_size = global_batch});
  schedule->steps = std::make_unique<TrainingStepCache>(schedule->config, schedule->space);
  schedule->stages = stages;
  const LogicalAxisRules rules = LogicalAxisRules::from_config(schedule->config);
  std::vector<std::shared_ptr<const TrainingStep>> none_steps;
  for (size_t batch = 0; batch < schedule->space.batches.size(); ++batch) {
    none_steps.push_back(schedule->steps->get(batch, TrainingStepCache::kNoRemat));
  }
  const MeshEquivalence equivalence({none_steps.front().get(), schedule->steps->get(0, 0).get()},
                                    rules);
  schedule->id = classes.add_schedule(none_steps, equivalence.atoms(), rules);
  return schedule;
}

std::vector<CostContext> both_attention_contexts(const Schedule& schedule) {
  const CostContext base =
      perf_options_from_config(schedule.config, *schedule.space.slice.chip).cost;
  std::vector<CostContext> contexts = {base, base};
  contexts[0].flash_attention = true;
  contexts[1].flash_attention = false;
  return contexts;
}

bool divides(const Schedule& schedule, const MeshShape& mesh, size_t batch) {
  const LogicalAxisRules rules = LogicalAxisRules::from_config(schedule.config);
  const Divisibility divisibility(*schedule.steps->get(0, 0), rules);
  return divisibility.parameters_divide(mesh) &&
         divisibility.batch_divides(mesh, schedule.space.batches[batch].loaded_microbatch);
}

// Partitions (schedule a, batch i) and (schedule b, batch j) on `mesh` and checks that their
// seconds per region pass are equal and that a's give b's bounds exactly.
void expect_same_compute(const Schedule& a, size_t i, const Schedule& b, size_t j,
                         const MeshShape& mesh, const std::string& where) {
  const LogicalAxisRules rules_a = LogicalAxisRules::from_config(a.config);
  const LogicalAxisRules rules_b = LogicalAxisRules::from_config(b.config);
  const StepProgram program_a = none_program(a.space, *a.steps, rules_a, mesh, i);
  const StepProgram program_b = none_program(b.space, *b.steps, rules_b, mesh, j);
  const std::vector<CostContext> contexts = both_attention_contexts(a);
  const ComputeBounds at_a = tensorcore_lower_bounds(program_a, contexts);
  const ComputeBounds at_b = tensorcore_lower_bounds(program_b, contexts);
  if (&a == &b) {
    expect_same_local_shapes(program_a, program_b, where);
  }
  EXPECT_EQ(at_a.region_seconds, at_b.region_seconds) << where;
  const ComputeBounds derived =
      bounds_from_regions(at_a.region_seconds, program_b.program.graph.regions(),
                          b.space.batches[j].accumulation_steps);
  EXPECT_EQ(derived.step, at_b.step) << where;
}

TEST(BatchClasses, BatchesOfOneKeyGiveTheSameTensorCoreSums) {
  std::mt19937 random(56);
  int compared = 0;
  int settings_with_classes = 0;
  for (const Setting& setting : kSettings) {
    const Config config = Config::load("", setting.keys);
    BatchClasses classes;
    const std::unique_ptr<Schedule> schedule = join(config, setting.global_batch, 1, classes);
    const SearchSpace& space = schedule->space;
    ASSERT_GE(space.batches.size(), 2U) << setting.keys[0];
    int in_setting = 0;
    for (int draw = 0; draw < 20000 && in_setting < 100; ++draw) {
      const MeshShape& mesh = space.meshes[random() % space.meshes.size()];
      const size_t a = random() % space.batches.size();
      const size_t b = random() % space.batches.size();
      const std::vector<int64_t> key = classes.key(schedule->id, mesh, a);
      if (a == b || key.empty() || key != classes.key(schedule->id, mesh, b) ||
          !divides(*schedule, mesh, a) || !divides(*schedule, mesh, b)) {
        continue;
      }
      ++in_setting;
      expect_same_compute(*schedule, a, *schedule, b, mesh,
                          setting.keys[0] + " " + mesh.describe() + " microbatch " +
                              std::to_string(space.batches[a].microbatch) + " vs " +
                              std::to_string(space.batches[b].microbatch));
      ++compared;
    }
    settings_with_classes += in_setting > 0 ? 1 : 0;
    std::printf("%s: %d pairs of one key compared\n", setting.keys[0].c_str(), in_setting);
  }
  EXPECT_GE(settings_with_classes, 4);
  EXPECT_GE(compared, 300);
}

// Every pipeline schedule explore searches on a multislice slice, joined to one BatchClasses.
std::vector<std::unique_ptr<Schedule>> join_schedules(const Config& config, int64_t global_batch,
                                                      BatchClasses& classes) {
  std::vector<std::string> keys;
  std::vector<std::unique_ptr<Schedule>> schedules;
  for (const ScheduleChoice& choice : pipeline_schedule_choices(config, keys)) {
    try {
      schedules.push_back(
          join(with_schedule(config, choice), global_batch, choice.stages, classes));
    } catch (const UserError&) {
      // A schedule the batch or the layers cannot take: explore skips it too.
    }
  }
  return schedules;
}

const MeshShape* find_mesh(const SearchSpace& space, const MeshShape& mesh) {
  for (const MeshShape& other : space.meshes) {
    if (other.describe() == mesh.describe()) {
      return &other;
    }
  }
  return nullptr;
}

// Pairs of two schedules of one stage count (other num_pipeline_microbatches or layers per stage)
// with the same key on one mesh: the same seconds per region pass, and each one's bound from the
// other's seconds.
TEST(BatchClasses, PipelineSchedulesOfOneKeyGiveTheSameTensorCoreSums) {
  std::mt19937 random(57);
  const std::vector<Setting> settings = {
      {{"model_name=tiny-llama", "compile_topology=v5e-8", "compile_topology_num_slices=2",
        "max_target_length=256"},
       16},
      {{"model_name=tiny-llama", "compile_topology=v5e-16", "compile_topology_num_slices=4",
        "max_target_length=256"},
       32},
      {{"model_name=llama2-7b", "compile_topology=v5e-16", "compile_topology_num_slices=4",
        "max_target_length=1024"},
       32},
  };
  int compared = 0;
  int other_repeats = 0;  // pairs whose layer loops run other iteration counts
  int other_sizes = 0;    // pairs whose steps have dims of other global sizes
  for (const Setting& setting : settings) {
    const Config config = Config::load("", setting.keys);
    BatchClasses classes;
    const std::vector<std::unique_ptr<Schedule>> schedules =
        join_schedules(config, setting.global_batch, classes);
    ASSERT_GE(schedules.size(), 4U) << setting.keys[0];
    int in_setting = 0;
    for (int draw = 0; draw < 400000 && in_setting < 150; ++draw) {
      const Schedule& a = *schedules[random() % schedules.size()];
      const Schedule& b = *schedules[random() % schedules.size()];
      if (&a == &b || a.stages != b.stages || a.stages == 1) {
        continue;
      }
      const MeshShape& mesh = a.space.meshes[random() % a.space.meshes.size()];
      const MeshShape* in_b = find_mesh(b.space, mesh);
      const size_t i = random() % a.space.batches.size();
      const size_t j = random() % b.space.batches.size();
      const std::vector<int64_t> key = classes.key(a.id, mesh, i);
      if (in_b == nullptr || key.empty() || key != classes.key(b.id, *in_b, j) ||
          !divides(a, mesh, i) || !divides(b, *in_b, j)) {
        continue;
      }
      ++in_setting;
      const auto repeats = [](const Schedule& schedule, size_t batch) {
        std::vector<int64_t> found;
        for (const Region& region :
             schedule.steps->get(batch, TrainingStepCache::kNoRemat)->graph.regions()) {
          found.push_back(region.repeat);
        }
        return found;
      };
      other_repeats += repeats(a, i) != repeats(b, j) ? 1 : 0;
      const auto sizes = [](const Schedule& schedule, size_t batch) {
        std::vector<int64_t> found;
        for (const Tensor& tensor :
             schedule.steps->get(batch, TrainingStepCache::kNoRemat)->graph.tensors()) {
          for (const Dim& dim : tensor.dims) {
            found.push_back(dim.size);
          }
        }
        return found;
      };
      other_sizes += sizes(a, i) != sizes(b, j) ? 1 : 0;
      expect_same_compute(a, i, b, j, mesh,
                          setting.keys[0] + " " + mesh.describe() + " schedules " +
                              std::to_string(a.id) + "/" + std::to_string(b.id) + " microbatch " +
                              std::to_string(a.space.batches[i].microbatch) + " vs " +
                              std::to_string(b.space.batches[j].microbatch));
      ++compared;
    }
    std::printf("%s x %s: %d pairs of two schedules compared\n", setting.keys[0].c_str(),
                setting.keys[2].c_str(), in_setting);
    EXPECT_GT(in_setting, 0) << setting.keys[0];
  }
  std::printf("%d of %d pairs with other region repeats, %d with other dim sizes\n", other_repeats,
              compared, other_sizes);
  EXPECT_GE(compared, 300);
  EXPECT_GE(other_repeats, 100);
  EXPECT_GE(other_sizes, 100);
}

// One region at a time: pairs (of any schedules of one stage count) whose keys of some region r
// agree on a mesh, though their whole keys need not (the layer loop's microbatch m / M against
// the embedding's and the head's m), run the same compute in a pass of r.
TEST(BatchClasses, RegionsOfOneKeyGiveTheSameTensorCoreSeconds) {
  std::mt19937 random(571);
  const Config config =
      Config::load("", {"model_name=llama2-7b", "compile_topology=v5e-16",
                        "compile_topology_num_slices=4", "max_target_length=1024"});
  BatchClasses classes;
  const std::vector<std::unique_ptr<Schedule>> schedules = join_schedules(config, 32, classes);
  int compared = 0;
  int other_whole_keys = 0;  // pairs whose whole keys differ (other compute in some region)
  for (int draw = 0; draw < 400000 && compared < 300; ++draw) {
    const Schedule& a = *schedules[random() % schedules.size()];
    const Schedule& b = *schedules[random() % schedules.size()];
    if (a.stages != b.stages) {
      continue;
    }
    const MeshShape& mesh = a.space.meshes[random() % a.space.meshes.size()];
    const MeshShape* in_b = find_mesh(b.space, mesh);
    const size_t i = random() % a.space.batches.size();
    const size_t j = random() % b.space.batches.size();
    if (in_b == nullptr || (&a == &b && i == j) || !divides(a, mesh, i) || !divides(b, *in_b, j)) {
      continue;
    }
    const std::vector<std::vector<int64_t>> keys_a = classes.region_keys(a.id, mesh, i);
    const std::vector<std::vector<int64_t>> keys_b = classes.region_keys(b.id, *in_b, j);
    if (keys_a.empty() || keys_a.size() != keys_b.size()) {
      continue;
    }
    std::vector<size_t> shared;
    for (size_t region = 0; region < keys_a.size(); ++region) {
      if (keys_a[region] == keys_b[region]) {
        shared.push_back(region);
      }
    }
    if (shared.empty()) {
      continue;
    }
    ++compared;
    other_whole_keys += shared.size() < keys_a.size() ? 1 : 0;
    const StepProgram program_a =
        none_program(a.space, *a.steps, LogicalAxisRules::from_config(a.config), mesh, i);
    const StepProgram program_b =
        none_program(b.space, *b.steps, LogicalAxisRules::from_config(b.config), mesh, j);
    const std::vector<CostContext> contexts = both_attention_contexts(a);
    const ComputeBounds at_a = tensorcore_lower_bounds(program_a, contexts);
    const ComputeBounds at_b = tensorcore_lower_bounds(program_b, contexts);
    for (const size_t region : shared) {
      for (size_t context = 0; context < contexts.size(); ++context) {
        EXPECT_EQ(at_a.region_seconds[context][region], at_b.region_seconds[context][region])
            << mesh.describe() << " schedules " << a.id << "/" << b.id << " batches " << i << "/"
            << j << " region " << region;
      }
    }
  }
  std::printf("%d pairs with regions of one key compared, %d of them with other whole keys\n",
              compared, other_whole_keys);
  EXPECT_GE(compared, 200);
  EXPECT_GE(other_whole_keys, 50);
}

TEST(BatchClasses, MoeRoutingGetsNoKey) {
  const Config config =
      Config::load("", {"model_name=tiny-moe", "compile_topology=v5e-8", "max_target_length=256"});
  BatchClasses classes;
  const std::unique_ptr<Schedule> schedule = join(config, 4, 1, classes);
  ASSERT_GE(schedule->space.batches.size(), 2U);
  for (const MeshShape& mesh : schedule->space.meshes) {
    EXPECT_TRUE(classes.key(schedule->id, mesh, 0).empty()) << mesh.describe();
  }
}

ExploreResult explore_with(const Config& config, double bar, bool classes, bool check,
                           int64_t global_batch = 8) {
  ExploreOptions options;
  options.limits.global_batch_size = global_batch;
  options.threads = 1;
  options.batch_classes = classes;
  options.check_equivalent_meshes = check;
  return testing::explore_top3(config, bar, options);
}

TEST(BatchClasses, ExploreFindsTheSameTopWithFewerPrograms) {
  const Config config = Config::load(
      "", {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048"});
  const ExploreResult unbounded = explore_with(config, -1e300, false, false);
  ASSERT_EQ(unbounded.top.size(), 3U);
  const double bar = testing::bar_under_third(unbounded);
  const ExploreResult without = explore_with(config, bar, false, false);
  const ExploreResult with = explore_with(config, bar, true, false);
  testing::expect_same_top(with, without, unbounded);
  EXPECT_GT(with.phases.batch_class_skips, 0);
  EXPECT_EQ(without.phases.batch_class_skips, 0);
  EXPECT_LT(with.programs_built, without.programs_built);
  // Every program built, each class's bound compared with the built one's (throws if one differs).
  const ExploreResult checked = explore_with(config, bar, true, true);
  ASSERT_EQ(checked.top.size(), with.top.size());
  EXPECT_EQ(checked.top.front().args, with.top.front().args);
}

// Across pipeline schedules: the later schedules of a stage count bound batches with the seconds
// of programs an earlier one built, and find the same top N and the same per-schedule bests.
TEST(BatchClasses, PipelineSchedulesFindTheSameTopWithFewerPrograms) {
  const Config config =
      Config::load("", {"model_name=llama2-7b", "compile_topology=v5e-8",
                        "compile_topology_num_slices=2", "max_target_length=1024"});
  const ExploreResult unbounded = explore_with(config, -1e300, false, false, 16);
  ASSERT_EQ(unbounded.top.size(), 3U);
  const double bar = testing::bar_under_third(unbounded);
  const ExploreResult without = explore_with(config, bar, false, false, 16);
  const ExploreResult with = explore_with(config, bar, true, false, 16);
  testing::expect_same_top(with, without, unbounded);
  ASSERT_EQ(with.pipeline_options.size(), without.pipeline_options.size());
  for (size_t index = 0; index < with.pipeline_options.size(); ++index) {
    const PipelineOption& a = with.pipeline_options[index];
    const PipelineOption& b = without.pipeline_options[index];
    EXPECT_EQ(a.found, b.found) << index;
    EXPECT_EQ(a.bounded_out, b.bounded_out) << index;
    EXPECT_EQ(a.objective, b.objective) << index;
    EXPECT_EQ(a.args, b.args) << index;
  }
  std::printf(
      "programs %lld with the classes, %lld without; %lld batches bounded by another "
      "schedule's class\n",
      static_cast<long long>(with.programs_built), static_cast<long long>(without.programs_built),
      static_cast<long long>(with.phases.schedule_class_skips));
  EXPECT_GT(with.phases.schedule_class_skips, 0);
  EXPECT_LT(with.programs_built, without.programs_built);
  // Every program built, each class's seconds compared with the built one's (throws if one
  // differed).
  const ExploreResult checked = explore_with(config, bar, true, true, 16);
  ASSERT_EQ(checked.top.size(), with.top.size());
  EXPECT_EQ(checked.top.front().args, with.top.front().args);
}

}  // namespace
}  // namespace tpusim
