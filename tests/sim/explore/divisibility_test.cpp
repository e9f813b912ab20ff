// tests/sim/explore/divisibility_test.cpp: explore's axis_does_not_divide and estimate's refusal
// are one check (sharding/divisibility.h): over a whole search space, estimate refuses exactly the
// mesh and batch pairs explore prunes, and explore prunes every candidate of those pairs.
#include "sharding/divisibility.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "model/autodiff/training_step.h"
#include "model/config.h"
#include "sharding/logical_rules.h"
#include "sharding/step_program.h"
#include "sim/explore/candidate.h"
#include "sim/explore/explorer.h"
#include "sim/explore/search_space.h"

namespace tpusim {
namespace {

// Issue 35: estimate accepted splits explore itself pruned (max_target_length=68 over context=8;
// 12 sequences over fsdp=8). 68 splits over context 2 and 4 but not 8; a global batch of 12
// gives per_device_batch_size 1.5 (12 sequences: loaded as they are, which splits over 2 and 4
// but not 8) and 0.75 / 0.5 / 0.375 (one sequence per device loaded: always splits).
TEST(RedTeam, Item2_EstimateRefusesExactlyWhatExplorePrunes) {
  const Config config =
      Config::load("", {"model_name=tiny-llama", "compile_topology=v5e-8", "max_target_length=68",
                        "remat_policy=full", "attention=dot_product"});
  const ExploreLimits limits{.global_batch_size = 12, .max_accumulation_steps = 4};
  const SearchSpace space = build_search_space(config, limits);
  const Divisibility divisibility(build_training_step(config, space.batches.front().microbatch),
                                  LogicalAxisRules::from_config(config));
  int64_t refused_pairs = 0;
  int64_t accepted_pairs = 0;
  bool refused_length = false;
  bool refused_batch = false;
  for (const MeshShape& mesh : space.meshes) {
    for (const BatchChoice& batch : space.batches) {
      const bool pruned = !divisibility.parameters_divide(mesh) ||
                          !divisibility.batch_divides(mesh, batch.loaded_microbatch);
      const std::string kind = space.attention_kinds.front();
      const Candidate candidate{mesh, batch, 0, kind, space.perf_choices(kind).front(), 0, 0};
      Config full = config;
      apply_candidate(full, space, candidate, CandidateKeys::kWithMesh);
      std::string refusal;
      try {
        build_step_program(full);
      } catch (const UserError& error) {
        refusal = error.what();
      }
      SCOPED_TRACE(mesh.describe() + " per_device_batch_size " +
                   std::to_string(batch.per_device_batch_size) + ": " + refusal);
      EXPECT_EQ(pruned, !refusal.empty());
      if (!refusal.empty()) {
        EXPECT_NE(refusal.find("axis_does_not_divide"), std::string::npos);
        refused_length = refused_length || refusal.rfind("max_target_length: 68", 0) == 0;
        refused_batch = refused_batch || refusal.rfind("per_device_batch_size: 1.5", 0) == 0;
      }
      (pruned ? refused_pairs : accepted_pairs) += 1;
    }
  }
  EXPECT_TRUE(refused_length);
  EXPECT_TRUE(refused_batch);
  EXPECT_GT(accepted_pairs, 0);

  ExploreOptions options;
  options.limits = limits;
  options.top = 1;
  options.threads = 2;
  const ExploreResult result = explore(config, options);
  const auto found = result.pruned.find("axis_does_not_divide");
  ASSERT_NE(found, result.pruned.end());
  EXPECT_EQ(found->second, refused_pairs * space.candidates_per_mesh_and_batch());
}

}  // namespace
}  // namespace tpusim
