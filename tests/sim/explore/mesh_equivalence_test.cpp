// Mesh equivalence (sim/explore/mesh_equivalence.h) against the partitioner: meshes of one key,
// drawn at random over dense, MoE and multislice settings, are partitioned apart and must give
// the same TensorCore bounds, memory and per-device program (program_signature), bit for bit. And
// an explore run that partitions every program and checks what an equivalent mesh showed
// (check_equivalent_meshes) finds the same top N as the ordinary run, which skips those programs
// or bounds them with an equivalent mesh's program laid onto its layouts (llama2-7b on v5p-32, the
// issue's search; a multislice search took minutes on a loaded machine).
#include "sim/explore/mesh_equivalence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/divisibility.h"
#include "sharding/partitioner.h"
#include "sim/explore/explorer.h"
#include "sim/explore/program_signature.h"
#include "sim/explore/search_space.h"
#include "sim/explore/step_bounds.h"
#include "sim/explore/training_step_cache.h"
#include "sim/memory/memory_model.h"
#include "sim/perf/step_simulator.h"
#include "support/timing_variants.h"

namespace tpusim {
namespace {

using testing::timing_variants;
using testing::TimingVariant;

const std::vector<std::vector<std::string>> kSettings = {
    {"model_name=tiny-llama", "compile_topology=v5e-8", "max_target_length=256"},
    {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048"},
    {"model_name=llama3.1-8b", "compile_topology=tpu7x-16", "max_target_length=4096"},
    {"model_name=mixtral-8x7b", "compile_topology=v5p-16", "max_target_length=1024"},
    {"model_name=qwen3-30b-a3b", "compile_topology=v6e-8", "max_target_length=1024"},
    {"model_name=tiny-moe", "compile_topology=v5e-8", "max_target_length=256"},
    {"model_name=llama2-7b", "compile_topology=v5e-8", "compile_topology_num_slices=2",
     "max_target_length=1024"},
};

// One of kSettings with what both comparisons build from it: its search space (batches up to 4
// per device), rules, training steps, divisibility and the meshes' equivalence.
struct Setting {
  Config config;
  SearchSpace space;
  LogicalAxisRules rules;
  TrainingStepCache steps;
  Divisibility divisibility;
  MeshEquivalence equivalence;

  explicit Setting(const std::vector<std::string>& overrides)
      : config(Config::load("", overrides)),
        space(build_search_space(config, {.max_per_device_batch = 4})),
        rules(LogicalAxisRules::from_config(config)),
        steps(config, space),
        divisibility(*steps.get(0, 0), rules),
        equivalence({steps.get(0, TrainingStepCache::kNoRemat).get(), steps.get(0, 0).get()},
                    rules) {}

  // The meshes whose parameters divide, grouped by equivalence key.
  std::map<std::vector<int64_t>, std::vector<const MeshShape*>> groups_by_key() const {
    std::map<std::vector<int64_t>, std::vector<const MeshShape*>> groups;
    for (const MeshShape& mesh : space.meshes) {
      if (divisibility.parameters_divide(mesh)) {
        groups[equivalence.key(mesh)].push_back(&mesh);
      }
    }
    return groups;
  }
};

StepProgram partitioned(const SearchSpace& space, TrainingStepCache& steps,
                        const LogicalAxisRules& rules, const MeshShape& mesh, size_t batch,
                        size_t remat) {
  StepProgram program;
  program.slice = space.slice;
  program.mesh = place_mesh(mesh, space.slice);
  program.step = steps.get(batch, remat);
  program.microbatch = space.batches[batch].microbatch;
  program.accumulation_steps = space.batches[batch].accumulation_steps;
  program.global_batch = program.microbatch * program.accumulation_steps;
  program.program = partition(*program.step, rules, program.mesh);
  return program;
}

TEST(MeshEquivalence, MeshesOfOneKeyGiveTheSameProgramBoundsAndMemory) {
  std::mt19937 random(40);
  int compared = 0;
  for (const std::vector<std::string>& overrides : kSettings) {
    Setting setting(overrides);
    const Config& config = setting.config;
    const SearchSpace& space = setting.space;
    const LogicalAxisRules& rules = setting.rules;
    TrainingStepCache& steps = setting.steps;
    const Divisibility& divisibility = setting.divisibility;
    const auto groups = setting.groups_by_key();
    const CostContext base = perf_options_from_config(config, *space.slice.chip).cost;
    std::vector<CostContext> contexts = {base, base};
    contexts[0].flash_attention = true;
    contexts[1].flash_attention = false;
    int in_setting = 0;
    for (const auto& [key, meshes] : groups) {
      if (meshes.size() < 2 || in_setting >= 6) {
        continue;
      }
      const size_t batch = random() % space.batches.size();
      const size_t remat = random() % space.remats.size();
      const MeshShape& first = *meshes.front();
      const MeshShape& other = *meshes[1 + random() % (meshes.size() - 1)];
      if (!divisibility.batch_divides(first, space.batches[batch].loaded_microbatch)) {
        continue;
      }
      ASSERT_TRUE(divisibility.batch_divides(other, space.batches[batch].loaded_microbatch));
      ++in_setting;
      StepProgram a = partitioned(space, steps, rules, first, batch, remat);
      StepProgram b = partitioned(space, steps, rules, other, batch, remat);
      const std::string where = overrides[0] + " " + first.describe() + " vs " + other.describe() +
                                " " + space.remats[remat].label();
      EXPECT_EQ(program_signature(a), program_signature(b)) << where;
      EXPECT_EQ(tensorcore_lower_bounds(a, contexts).step,
                tensorcore_lower_bounds(b, contexts).step)
          << where;
      for (const bool scores_in_hbm : {false, true}) {
        a.attention_scores_in_hbm = scores_in_hbm;
        b.attention_scores_in_hbm = scores_in_hbm;
        EXPECT_EQ(estimate_memory(a).peak_bytes, estimate_memory(b).peak_bytes) << where;
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 12);  // groups of two or more meshes exist on most settings (18 here)
}

// The program partitioned on one mesh, timed on another mesh of its key relabeled onto it, gives
// the other mesh's collective bounds, chains and step (within rounding: sums over several atoms'
// links may run in another order), under every placement choice and perf switch.
TEST(MeshEquivalence, RelabeledMeshTimesAnEquivalentMeshsProgram) {
  std::mt19937 random(45);
  int compared = 0;
  int exact = 0;
  double worst = 0;
  for (const std::vector<std::string>& overrides : kSettings) {
    Setting setting(overrides);
    const Config& config = setting.config;
    const SearchSpace& space = setting.space;
    const LogicalAxisRules& rules = setting.rules;
    TrainingStepCache& steps = setting.steps;
    const Divisibility& divisibility = setting.divisibility;
    const MeshEquivalence& equivalence = setting.equivalence;
    const auto groups = setting.groups_by_key();
    const PerfOptions base = perf_options_from_config(config, *space.slice.chip);
    int in_setting = 0;
    for (const auto& [key, meshes] : groups) {
      if (meshes.size() < 2 || in_setting >= 6) {
        continue;
      }
      const size_t batch = random() % space.batches.size();
      const size_t remat = random() % space.remats.size();
      const MeshShape& first = *meshes.front();
      const MeshShape& other = *meshes[1 + random() % (meshes.size() - 1)];
      if (!divisibility.batch_divides(first, space.batches[batch].loaded_microbatch)) {
        continue;
      }
      ++in_setting;
      StepProgram a = partitioned(space, steps, rules, first, batch, remat);
      StepProgram b = partitioned(space, steps, rules, other, batch, remat);
      StepSimulator on_a(a);
      StepSimulator on_b(b);
      for (const std::vector<int>& placement : space.placements) {
        b.mesh = place_mesh(other, space.slice, placement);
        a.mesh = equivalence.relabeled(b.mesh, first);
        for (const TimingVariant& variant : timing_variants(base)) {
          const PerfOptions& options = variant.options;
          const std::string where = overrides[0] + " " + first.describe() + " as " +
                                    other.describe() + " " + variant.label;
          const CollectiveBounds want = on_b.collective_bounds(options);
          const CollectiveBounds got = on_a.collective_bounds(options);
          const std::vector<std::pair<double, double>> pairs = {
              {want.tensorcore_driven_seconds, got.tensorcore_driven_seconds},
              {want.busiest_link_seconds, got.busiest_link_seconds},
              {on_b.chain_bound(options), on_a.chain_bound(options)},
              {on_b.run(options).step_seconds, on_a.run(options).step_seconds}};
          for (const auto& [expected, actual] : pairs) {
            const double error = std::abs(actual - expected) / std::max(1e-300, expected);
            EXPECT_LE(error, 1e-12) << where << ": " << expected << " vs " << actual;
            worst = std::max(worst, error);
            exact += actual == expected ? 1 : 0;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_GE(compared, 12 * 4);
  std::printf("relabeled: %d of %d equal bit for bit, largest relative difference %.3g\n", exact,
              compared, worst);
}

TEST(MeshEquivalence, AtomsHoldEveryAxisOnceAndKeepSplitsApart) {
  const Config config = Config::load("", {"model_name=mixtral-8x7b", "compile_topology=v5p-32"});
  const SearchSpace space = build_search_space(config, {.max_per_device_batch = 1});
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  TrainingStepCache steps(config, space);
  const MeshEquivalence equivalence({steps.get(0, 0).get()}, rules);
  uint32_t seen = 0;
  for (const uint32_t atom : equivalence.atoms()) {
    EXPECT_EQ(seen & atom, 0U);
    seen |= atom;
  }
  EXPECT_EQ(seen, (1U << kNumMeshAxes) - 1);
  auto key_of = [&](int fsdp, const std::string& other, int size) {
    MeshShape mesh;
    mesh.ici.fill(1);
    mesh.dcn.fill(1);
    mesh.ici[static_cast<size_t>(mesh_axis_index("fsdp"))] = fsdp;
    mesh.ici[static_cast<size_t>(mesh_axis_index(other))] = size;
    return equivalence.key(mesh);
  };
  EXPECT_NE(key_of(16, "expert", 1), key_of(8, "expert", 2));  // expert splits the experts
  EXPECT_NE(key_of(16, "tensor", 1), key_of(8, "tensor", 2));
  EXPECT_EQ(key_of(16, "tensor", 1), key_of(16, "expert", 1));
}

TEST(MeshEquivalence, ExploreFindsTheSameTopWhetherItSkipsOrChecksEquivalentMeshes) {
  // llama2-7b on v5p-32 (the search) has no two meshes of one key; llama3.1-8b on v5p-32
  // has 509 programs bounded from an equivalent mesh's.
  const std::vector<std::vector<std::string>> settings = {
      kSettings[1],
      {"model_name=llama3.1-8b", "compile_topology=v5p-32", "max_target_length=4096"}};
  int64_t borrowed = 0;
  for (const std::vector<std::string>& overrides : settings) {
    const Config config = Config::load("", overrides);
    ExploreOptions options;
    options.top = 5;
    options.threads = 2;
    options.limits.max_per_device_batch = 2;
    const ExploreResult skipping = explore(config, options);
    options.check_equivalent_meshes = true;  // throws std::logic_error on a disagreement
    const ExploreResult checking = explore(config, options);
    EXPECT_EQ(checking.phases.equivalent_mesh_skips, 0);
    // The checking run builds every program; the ordinary one bounds some from an equivalent
    // mesh's program laid onto its layouts (MeshEquivalence::relabeled), unbuilt.
    EXPECT_EQ(checking.phases.borrowed_programs, 0);
    borrowed += skipping.phases.borrowed_programs;
    ASSERT_EQ(skipping.top.size(), checking.top.size()) << overrides[0];
    for (size_t index = 0; index < skipping.top.size(); ++index) {
      EXPECT_EQ(skipping.top[index].args, checking.top[index].args) << overrides[0];
      EXPECT_EQ(skipping.top[index].step_time_s, checking.top[index].step_time_s);
    }
  }
  EXPECT_GT(borrowed, 0);
}

TEST(MeshEquivalence, SettledMeshesOfAKeyCountTheSameReplayedOrEvaluated) {
  // Under a bar above the search's best (plan's far slices), most meshes are settled by memory
  // floors and compute bounds alone; the next meshes of their key replay their counts on their
  // own placements (MeshEvaluator::evaluate_group). The checking run evaluates every mesh in full
  // and throws std::logic_error where a replay would have counted otherwise.
  const Config config =
      Config::load("", {"model_name=llama3.1-8b", "compile_topology=v5p-32",
                        "compile_topology_num_slices=2", "max_target_length=4096"});
  ExploreOptions options;
  options.top = 5;
  options.threads = 1;
  options.limits.max_per_device_batch = 2;
  options.limits.global_batch_size = 64;
  const ExploreResult open = explore(config, options);
  ASSERT_FALSE(open.top.empty());
  options.initial_bar = open.top.front().objective * 1.001;
  const ExploreResult skipping = explore(config, options);
  options.check_equivalent_meshes = true;
  const ExploreResult checking = explore(config, options);
  EXPECT_EQ(skipping.pruned, checking.pruned);
  EXPECT_EQ(skipping.candidates_in_space, checking.candidates_in_space);
  EXPECT_EQ(skipping.phases.floor_skipped_programs, checking.phases.floor_skipped_programs);
  EXPECT_GT(skipping.phases.equivalent_mesh_skips, 0);
}

TEST(MeshEquivalence, SettledMeshesReplayAlsoWhereTheSearchTimesCandidates) {
  // Without a bar, the search times candidates on some meshes of a key and settles others by
  // floors and bounds alone: a mesh that timed or built something must not be replayed. The
  // checking run throws std::logic_error where a replay would have counted, timed or partitioned
  // otherwise; both runs find the same top.
  const Config config =
      Config::load("", {"model_name=tiny-llama", "compile_topology=v5e-8", "remat_policy=full"});
  ExploreOptions options;
  options.top = 5;
  options.threads = 1;
  const ExploreResult skipping = explore(config, options);
  options.check_equivalent_meshes = true;
  const ExploreResult checking = explore(config, options);
  ASSERT_FALSE(skipping.top.empty());
  EXPECT_EQ(skipping.top.front().tokens_per_s_per_chip, checking.top.front().tokens_per_s_per_chip);
  EXPECT_EQ(skipping.pruned, checking.pruned);
  EXPECT_GT(skipping.phases.equivalent_mesh_skips, 0);
  EXPECT_GT(skipping.candidates_evaluated, 0);
}

}  // namespace
}  // namespace tpusim
