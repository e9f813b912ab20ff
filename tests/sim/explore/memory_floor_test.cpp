// The explorer's memory floor (sim/explore/memory_floor.h) against the memory model of the
// partitioned program it stands in for, over random candidates (models, slices, meshes that
// divide, batches, remat policies, both attention kinds): its state equals the model's weights
// plus optimizer state, and state plus saved activations never exceed the peak, always; and its
// sums by shape are its sums term by term, bit for bit.
#include "sim/explore/memory_floor.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/divisibility.h"
#include "sharding/partitioner.h"
#include "sim/explore/memory_floor_set.h"
#include "sim/explore/search_space.h"
#include "sim/explore/training_step_cache.h"
#include "sim/memory/memory_model.h"

namespace tpusim {
namespace {

struct Setting {
  std::vector<std::string> overrides;
};

const std::vector<Setting> kSettings = {
    {{"model_name=tiny-llama", "compile_topology=v5e-8", "max_target_length=256"}},
    {{"model_name=llama2-7b", "compile_topology=v5p-16", "max_target_length=2048"}},
    {{"model_name=llama3.1-8b", "compile_topology=tpu7x-16", "max_target_length=4096"}},
    {{"model_name=mixtral-8x7b", "compile_topology=v5p-16", "max_target_length=1024"}},
    {{"model_name=qwen3-30b-a3b", "compile_topology=v6e-8", "max_target_length=1024"}},
    {{"model_name=gemma2-9b", "compile_topology=v5e-8", "max_target_length=1024"}},
    {{"model_name=tiny-moe", "compile_topology=v5e-8", "max_target_length=256"}},
    {{"model_name=llama2-7b", "compile_topology=v5e-8", "compile_topology_num_slices=2",
      "max_target_length=1024"}},
};

TEST(MemoryFloor, IsTheModelsStateAndNeverExceedsThePeak) {
  std::mt19937 random(40);
  int checked = 0;
  for (const Setting& setting : kSettings) {
    const Config config = Config::load("", setting.overrides);
    const SearchSpace space = build_search_space(config, {.max_per_device_batch = 4});
    const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
    TrainingStepCache steps(config, space);
    const Divisibility divisibility(*steps.get(0, 0), rules);
    int found = 0;
    for (int attempt = 0; attempt < 400 && found < 8; ++attempt) {
      const MeshShape& mesh = space.meshes[random() % space.meshes.size()];
      const size_t batch = random() % space.batches.size();
      const size_t remat = random() % space.remats.size();
      if (!divisibility.parameters_divide(mesh) ||
          !divisibility.batch_divides(mesh, space.batches[batch].loaded_microbatch)) {
        continue;
      }
      ++found;
      StepProgram program;
      program.slice = space.slice;
      program.mesh = place_mesh(mesh, space.slice);
      program.step = steps.get(batch, remat);
      program.microbatch = space.batches[batch].microbatch;
      program.accumulation_steps = space.batches[batch].accumulation_steps;
      program.global_batch = program.microbatch * program.accumulation_steps;
      program.program = partition(*program.step, rules, program.mesh);
      const MemoryFloor::Bytes floor = steps.memory_floor(batch, remat).bytes(mesh);
      // Terms merged by shape add up to the term-by-term sums bit for bit.
      const MemoryFloor::Bytes by_term = steps.memory_floor(batch, remat).bytes_by_term(mesh);
      EXPECT_EQ(floor.state, by_term.state);
      EXPECT_EQ(floor.saved, by_term.saved);
      for (const bool scores_in_hbm : {false, true}) {
        program.attention_scores_in_hbm = scores_in_hbm;
        const MemoryEstimate memory = estimate_memory(program);
        const std::string where = setting.overrides[0] + " " + mesh.describe() + " batch " +
                                  std::to_string(program.microbatch) + " " +
                                  space.remats[remat].label();
        const double state = memory.at_peak.weights + memory.at_peak.optimizer_state;
        EXPECT_NEAR(floor.state, state, 1e-9 * state) << where;
        EXPECT_GT(floor.saved, 0) << where;  // the inputs at least
        EXPECT_LE(floor.total(), memory.peak_bytes * (1 + 1e-12)) << where;
        ++checked;
      }
    }
    EXPECT_GT(found, 0) << setting.overrides[0];
  }
  EXPECT_GE(checked, 80);
}

// Several steps' floors in one pass (memory_floor_set.h) are each step's own, bit for bit: every
// remat policy of a batch, and every other one (the explorer asks for those still fitting).
TEST(MemoryFloorSet, GivesEachStepsOwnFloorBitForBit) {
  std::mt19937 random(41);
  int checked = 0;
  for (const Setting& setting : kSettings) {
    const Config config = Config::load("", setting.overrides);
    const SearchSpace space = build_search_space(config, {.max_per_device_batch = 4});
    TrainingStepCache steps(config, space);
    ASSERT_GE(space.remats.size(), 2U) << setting.overrides[0];
    for (int attempt = 0; attempt < 6; ++attempt) {
      const MeshShape& mesh = space.meshes[random() % space.meshes.size()];
      const size_t batch = random() % space.batches.size();
      for (const size_t stride : {size_t{1}, size_t{2}}) {
        std::vector<size_t> remats;
        std::vector<const MemoryFloor*> floors;
        for (size_t remat = attempt % stride; remat < space.remats.size(); remat += stride) {
          remats.push_back(remat);
          floors.push_back(&steps.memory_floor(batch, remat));
        }
        const MemoryFloorSet set(floors);
        std::vector<MemoryFloor::Bytes> bytes;
        set.bytes(mesh, bytes);
        ASSERT_EQ(bytes.size(), remats.size());
        for (size_t at = 0; at < remats.size(); ++at) {
          const MemoryFloor::Bytes own = floors[at]->bytes(mesh);
          const std::string where =
              setting.overrides[0] + " " + mesh.describe() + " " + space.remats[remats[at]].label();
          EXPECT_EQ(bytes[at].state, own.state) << where;
          EXPECT_EQ(bytes[at].saved, own.saved) << where;
          EXPECT_GT(own.saved, 0) << where;
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 200);
}

}  // namespace
}  // namespace tpusim
