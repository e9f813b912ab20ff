// Re-sized programs (sharding/program_resize.h, sim/explore/resizable_programs.h) against the
// partitioner: on random pairs of meshes with the same axes larger than 1 but different sizes
// (dense, GQA with kv heads a wide tensor split does not divide, multislice, a 2-stage pipeline),
// mesh A's program re-sized for mesh B, wherever its recorded size choices hold on B, must be B's
// own partition: the same `tpusim program` text (ops, tensors, local sizes, collectives with their
// group sizes), the same padding notes, and the same TensorCore bounds bit for bit. Where a choice
// comes out otherwise the re-size is refused. MoE routing is not resizable. And explore with
// re-sizing finds the same top N as without it, from a bar that bounds most batches out,
// partitioning fewer programs; a run that partitions every program checks each against a kept
// program re-sized for its mesh (std::logic_error). Over more settings (context and
// tensor_sequence splits, local/global attention, qwen3, MLA, fp8/int8, offloading remat, a
// 4-stage pipeline over 4 slices, padded sizes, a batch below 1 per device, axes of 3) the re-sized
// program also gives the same memory estimate and simulated step bit for bit, after being re-sized
// for another mesh first; threads sharing the kept programs get their own meshes' programs.
#include "sim/explore/resizable_programs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/divisibility.h"
#include "sharding/partitioner.h"
#include "sharding/program_resize.h"
#include "sim/explore/explorer.h"
#include "sim/explore/search_space.h"
#include "sim/explore/step_bounds.h"
#include "sim/explore/training_step_cache.h"
#include "sim/memory/memory_model.h"
#include "sim/perf/step_simulator.h"
#include "support/same_top.h"

namespace tpusim {
namespace {

const std::vector<std::vector<std::string>> kSettings = {
    {"model_name=tiny-llama", "compile_topology=v5e-8", "max_target_length=256"},
    {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048"},
    // 8 kv heads: tensor splits of 16 gather them (a size choice of attention).
    {"model_name=llama3.1-8b", "compile_topology=tpu7x-32", "max_target_length=4096"},
    {"model_name=gemma2-2b", "compile_topology=v6e-16", "max_target_length=2048"},
    {"model_name=llama2-7b", "compile_topology=v5e-8", "compile_topology_num_slices=2",
     "max_target_length=1024"},
    {"model_name=tiny-llama", "compile_topology=v5e-8", "compile_topology_num_slices=2",
     "dcn_pipeline_parallelism=2", "max_target_length=256"},
};

PartitionedProgram partitioned(const SearchSpace& space, const TrainingStep& step,
                               const LogicalAxisRules& rules, const MeshShape& mesh) {
  return partition(step, rules, place_mesh(mesh, space.slice));
}

// The same per-device program: ops, tensors, local sizes and collectives (`tpusim program`'s
// text, group sizes included), and the same padding notes.
void expect_same_program(const PartitionedProgram& resized, const PartitionedProgram& built,
                         const std::string& where) {
  ASSERT_EQ(resized.graph.to_text(), built.graph.to_text()) << where;
  ASSERT_EQ(resized.padding.size(), built.padding.size()) << where;
  for (size_t index = 0; index < built.padding.size(); ++index) {
    const PaddingNote& a = resized.padding[index];
    const PaddingNote& b = built.padding[index];
    EXPECT_EQ(a.tensor, b.tensor) << where;
    EXPECT_EQ(a.dim, b.dim) << where;
    EXPECT_EQ(a.global_size, b.global_size) << where;
    EXPECT_EQ(a.shards, b.shards) << where;
    EXPECT_EQ(a.padded_size, b.padded_size) << where;
  }
  EXPECT_EQ(resized.local_of_global, built.local_of_global) << where;
}

using ByStructure = std::map<uint32_t, std::vector<const MeshShape*>>;

// Two meshes of one structure, drawn from a random group, and a batch and remat policy that both
// split evenly.
struct DrawnPair {
  const std::vector<const MeshShape*>* group = nullptr;
  const MeshShape* a = nullptr;
  const MeshShape* b = nullptr;
  size_t batch = 0;
  size_t remat = 0;
};

std::optional<DrawnPair> draw_pair(std::mt19937& random, const ByStructure& by_structure,
                                   const SearchSpace& space, const Divisibility& divisibility) {
  auto group = by_structure.begin();
  std::advance(group, static_cast<long>(random() % by_structure.size()));
  const std::vector<const MeshShape*>& meshes = group->second;
  DrawnPair pair{&meshes, meshes[random() % meshes.size()], meshes[random() % meshes.size()],
                 random() % space.batches.size(), random() % space.remats.size()};
  const int64_t loaded = space.batches[pair.batch].loaded_microbatch;
  if (pair.a == pair.b || !divisibility.batch_divides(*pair.a, loaded) ||
      !divisibility.batch_divides(*pair.b, loaded)) {
    return std::nullopt;
  }
  return pair;
}

TEST(ProgramResize, SameChoicesGiveThePartitionersProgram) {
  std::mt19937 random(58);
  int resized = 0;
  int refused = 0;
  for (const std::vector<std::string>& overrides : kSettings) {
    const Config config = Config::load("", overrides);
    const SearchSpace space = build_search_space(config, {.max_per_device_batch = 4});
    const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
    TrainingStepCache steps(config, space);
    const Divisibility divisibility(*steps.get(0, 0), rules);
    ByStructure by_structure;
    for (const MeshShape& mesh : space.meshes) {
      if (divisibility.parameters_divide(mesh)) {
        by_structure[ResizableProgram::axes_above_one(mesh)].push_back(&mesh);
      }
    }
    const CostContext base = perf_options_from_config(config, *space.slice.chip).cost;
    std::vector<CostContext> contexts = {base, base};
    contexts[0].flash_attention = true;
    contexts[1].flash_attention = false;
    int in_setting = 0;
    for (int draw = 0; draw < 400 && in_setting < 40; ++draw) {
      const std::optional<DrawnPair> pair = draw_pair(random, by_structure, space, divisibility);
      if (!pair.has_value()) {
        continue;
      }
      const MeshShape& a = *pair->a;
      const MeshShape& b = *pair->b;
      const size_t batch = pair->batch;
      const size_t remat = pair->remat;
      ++in_setting;
      const TrainingStep& step = *steps.get(batch, remat);
      std::optional<ResizableProgram> from =
          ResizableProgram::from(partitioned(space, step, rules, a), a);
      ASSERT_TRUE(from.has_value()) << overrides[0];
      if (!from->resize(b)) {
        ++refused;
        continue;
      }
      ++resized;
      const PartitionedProgram built = partitioned(space, step, rules, b);
      const std::string where = overrides[0] + " " + a.describe() + " -> " + b.describe() + " " +
                                space.remats[remat].label() + " batch " + std::to_string(batch);
      expect_same_program(from->program(), built, where);
      const int64_t accumulation = space.batches[batch].accumulation_steps;
      const ComputeBounds want = tensorcore_lower_bounds(built.graph, accumulation, contexts);
      const ComputeBounds got = tensorcore_lower_bounds(from->graph(), accumulation, contexts);
      EXPECT_EQ(got.step, want.step) << where;
      EXPECT_EQ(got.region_seconds, want.region_seconds) << where;
    }
  }
  std::printf("%d pairs re-sized and compared, %d refused by a size choice\n", resized, refused);
  EXPECT_GE(resized, 100);
}

// Settings the first test lacks: context and tensor_sequence splits under attention, local and
// global attention (gemma2, gemma3), qwen3 dense (qk norms), MLA attention, fp8 and int8
// quantization, a custom remat policy that offloads, 4 slices with a 4-stage pipeline, sizes that
// pad (a length and a vocab no split divides) and a per-device batch below 1 (a global batch of 4
// sequences on 8 chips), and axes of size 3.
struct Setting {
  std::vector<std::string> overrides;
  const char* split = nullptr;  // a mesh axis both meshes split (nullptr: any structure)
  int64_t global_batch = 0;     // explore's --global-batch-size (0: per-device batches searched)
};

const std::vector<Setting> kMoreSettings = {
    {{"model_name=llama3.1-8b", "compile_topology=v5p-32", "max_target_length=8192"}, "context"},
    {{"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=4096"},
     "tensor_sequence"},
    {{"model_name=gemma3-4b", "compile_topology=v6e-16", "max_target_length=3000"}},
    {{"model_name=gemma3-4b", "compile_topology=v6e-16", "max_target_length=3000"}, "context"},
    {{"model_name=gemma2-2b", "compile_topology=tpu7x-16", "max_target_length=1536",
      "quantization=fp8_full"}},
    {{"model_name=qwen3-0.6b", "compile_topology=v5p-16", "max_target_length=1000",
      "quantization=int8"}},
    {{"model_name=qwen3-8b", "compile_topology=v5e-16", "max_target_length=2048",
      "remat_policy=custom", "decoder_layer_input=offload", "query_proj=offload", "mlpwo=device"}},
    {{"model_name=llama2-7b", "compile_topology=v5e-16", "compile_topology_num_slices=4",
      "dcn_pipeline_parallelism=4", "max_target_length=384"}},
    {{"model_name=tiny-qwen3", "compile_topology=v5e-8", "max_target_length=200",
      "override_model_config=true", "vocab_size=1001"},
     nullptr,
     4},
    // Axes of 3 (192 chips; 3 slices): splits that do not divide kv heads, lengths, vocab.
    {{"model_name=llama3.1-8b", "compile_topology=v5p-384", "max_target_length=1000"}},
    {{"model_name=gemma2-2b", "compile_topology=v5e-8", "compile_topology_num_slices=3",
      "max_target_length=1000"}},
    {{"model_name=tiny-mla", "compile_topology=v5e-8", "max_target_length=200",
      "override_model_config=true", "num_experts=1", "num_experts_per_tok=1"}},
};

// The step program explore evaluates for (batch, mesh) with `program` as its per-device program.
StepProgram step_program(const SearchSpace& space, const std::shared_ptr<const TrainingStep>& step,
                         size_t batch, const MeshShape& mesh, PartitionedProgram program) {
  StepProgram result;
  result.slice = space.slice;
  result.mesh = place_mesh(mesh, space.slice);
  result.step = step;
  result.program = std::move(program);
  result.program.mesh = result.mesh;
  const BatchChoice& choice = space.batches[batch];
  result.microbatch = choice.microbatch;
  result.accumulation_steps = choice.accumulation_steps;
  result.global_batch = choice.microbatch * choice.accumulation_steps;
  return result;
}

// Memory and the simulated step of the re-sized program against the built one, bit for bit.
void expect_same_estimates(const StepProgram& resized, const StepProgram& built,
                           const PerfOptions& options, const std::string& where) {
  const MemoryEstimate want = estimate_memory(built);
  const MemoryEstimate got = estimate_memory(resized);
  EXPECT_EQ(got.peak_bytes, want.peak_bytes) << where;
  EXPECT_EQ(got.peak_region, want.peak_region) << where;
  EXPECT_EQ(got.host_offloaded_bytes, want.host_offloaded_bytes) << where;
  EXPECT_EQ(got.at_peak.total(), want.at_peak.total()) << where;
  EXPECT_EQ(got.fits, want.fits) << where;
  const StepTiming want_time = StepSimulator(built).run(options);
  const StepTiming got_time = StepSimulator(resized).run(options);
  ASSERT_GT(want.peak_bytes, 0) << where;
  ASSERT_GT(want_time.step_seconds, 0) << where;
  EXPECT_EQ(got_time.step_seconds, want_time.step_seconds) << where;
  EXPECT_EQ(got_time.hardware_matmul_flops, want_time.hardware_matmul_flops) << where;
}

struct PairCounts {
  int resized = 0;
  int refused = 0;
};

// Random pairs of meshes of one structure in the setting's space: A's program re-sized for B
// against B's own partition (program text, padding, memory, simulated step).
void compare_random_pairs(const Setting& setting, std::mt19937& random, int pairs,
                          PairCounts& counts) {
  const std::vector<std::string>& overrides = setting.overrides;
  const Config config = Config::load("", overrides);
  const SearchSpace space = build_search_space(
      config, {.global_batch_size = setting.global_batch, .max_per_device_batch = 2});
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  TrainingStepCache steps(config, space);
  const Divisibility divisibility(*steps.get(0, 0), rules);
  ByStructure by_structure;
  for (const MeshShape& mesh : space.meshes) {
    if (divisibility.parameters_divide(mesh) &&
        (setting.split == nullptr || mesh.size(mesh_axis_index(setting.split)) > 1)) {
      by_structure[ResizableProgram::axes_above_one(mesh)].push_back(&mesh);
    }
  }
  ASSERT_FALSE(by_structure.empty()) << overrides[0];
  PerfOptions options = perf_options_from_config(config, *space.slice.chip);
  options.record_details = false;
  int in_setting = 0;
  for (int draw = 0; draw < 20 * pairs && in_setting < pairs; ++draw) {
    const std::optional<DrawnPair> pair = draw_pair(random, by_structure, space, divisibility);
    if (!pair.has_value()) {
      continue;
    }
    const std::vector<const MeshShape*>& meshes = *pair->group;
    const MeshShape& a = *pair->a;
    const MeshShape& b = *pair->b;
    const size_t batch = pair->batch;
    const size_t remat = pair->remat;
    ++in_setting;
    const std::shared_ptr<const TrainingStep> step = steps.get(batch, remat);
    std::optional<ResizableProgram> from =
        ResizableProgram::from(partitioned(space, *step, rules, a), a);
    ASSERT_TRUE(from.has_value()) << overrides[0];
    // As a kept program is re-sized for mesh after mesh: first for a third mesh (whether or not
    // its choices hold there), then for B.
    from->resize(*meshes[random() % meshes.size()]);
    if (!from->resize(b)) {
      ++counts.refused;
      continue;
    }
    ++counts.resized;
    const std::string where = overrides[0] + " " + overrides[1] + " " + a.describe() + " -> " +
                              b.describe() + " " + space.remats[remat].label() + " batch " +
                              std::to_string(batch);
    const StepProgram built =
        step_program(space, step, batch, b, partitioned(space, *step, rules, b));
    expect_same_program(from->program(), built.program, where);
    expect_same_estimates(step_program(space, step, batch, b, from->program()), built, options,
                          where);
  }
}

TEST(ProgramResize, MoreSettingsGiveThePartitionersProgramMemoryAndStep) {
  std::mt19937 random(4558);
  PairCounts counts;
  for (const Setting& setting : kMoreSettings) {
    const PairCounts before = counts;
    compare_random_pairs(setting, random, 40, counts);
    std::printf("%s %s split %s: %d re-sized, %d refused\n", setting.overrides[0].c_str(),
                setting.overrides[1].c_str(), setting.split == nullptr ? "any" : setting.split,
                counts.resized - before.resized, counts.refused - before.refused);
  }
  EXPECT_GE(counts.resized, 300);
}

// llama3.1-8b on tpu7x-32 at 2048 tokens, one sequence per device at most: 8 kv heads, 32
// devices (tensor splits up to 16 gather them), what the targeted tests below partition.
struct Llama8bOn32 {
  Config config = Config::load(
      "", {"model_name=llama3.1-8b", "compile_topology=tpu7x-32", "max_target_length=2048"});
  SearchSpace space = build_search_space(config, {.max_per_device_batch = 1});
  TrainingStepCache steps{config, space};
  LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  Divisibility divisibility{*steps.get(0, 0), rules};

  // The remat_policy=none program partitioned on `mesh`.
  PartitionedProgram none_on(const MeshShape& mesh) {
    return partitioned(space, *steps.get(0, TrainingStepCache::kNoRemat), rules, mesh);
  }
  // That program kept to re-size and re-sized once onto its own mesh (its table of local sizes
  // then points into its own tensors); nullopt if either step refuses.
  std::optional<ResizableProgram> kept_on(const MeshShape& mesh) {
    std::optional<ResizableProgram> kept = ResizableProgram::from(none_on(mesh), mesh);
    if (!kept.has_value() || !kept->resize(mesh)) {
      return std::nullopt;
    }
    return kept;
  }

  // The meshes dividing the first batch that share the most common structure (axes above 1).
  std::vector<const MeshShape*> largest_structure() const {
    const int64_t loaded = space.batches[0].loaded_microbatch;
    ByStructure by_structure;
    for (const MeshShape& mesh : space.meshes) {
      if (divisibility.parameters_divide(mesh) && divisibility.batch_divides(mesh, loaded)) {
        by_structure[ResizableProgram::axes_above_one(mesh)].push_back(&mesh);
      }
    }
    const auto largest = std::max_element(
        by_structure.begin(), by_structure.end(),
        [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    return largest->second;
  }
};

// Worker threads share the kept programs: each re-sizes a slot in place under its lock and copies
// the result. Two threads asking for different meshes of one structure at once must each get
// their mesh's own partition (run under ThreadSanitizer, a race also reports).
TEST(ResizablePrograms, ThreadsGetTheirOwnMeshesPrograms) {
  Llama8bOn32 setting;
  const SearchSpace& space = setting.space;
  TrainingStepCache& steps = setting.steps;
  const LogicalAxisRules& rules = setting.rules;
  const TrainingStep& step = *steps.get(0, TrainingStepCache::kNoRemat);
  const std::vector<const MeshShape*> meshes = setting.largest_structure();
  ASSERT_GE(meshes.size(), 4U);
  std::vector<std::string> texts;
  texts.reserve(meshes.size());
  for (const MeshShape* mesh : meshes) {
    texts.push_back(partitioned(space, step, rules, *mesh).graph.to_text());
  }
  ResizablePrograms kept;
  kept.offer(0, TrainingStepCache::kNoRemat, partitioned(space, step, rules, *meshes[0]),
             *meshes[0]);
  std::array<int, 2> resized{};
  std::array<int, 2> wrong{};
  auto ask = [&](size_t thread) {
    for (int round = 0; round < 40; ++round) {
      const size_t which = (thread == 0 ? static_cast<size_t>(round)
                                        : meshes.size() * 40 - 1 - static_cast<size_t>(round)) %
                           meshes.size();
      std::string text;
      if (kept.with_resized(
              0, TrainingStepCache::kNoRemat, *meshes[which],
              [&](const PartitionedProgram& program) { text = program.graph.to_text(); })) {
        ++resized[thread];
        wrong[thread] += text == texts[which] ? 0 : 1;
      }
    }
  };
  std::thread other(ask, 1);
  ask(0);
  other.join();
  EXPECT_GT(resized[0] + resized[1], 0);
  EXPECT_EQ(wrong[0], 0);
  EXPECT_EQ(wrong[1], 0);
}

// A lent program (lend) is the borrower's mesh's own partition, its slot is skipped by every
// other call while lent, and it goes back at give_back or with the loan (the borrower gets what it
// held before).
TEST(ResizablePrograms, ALentProgramIsTheMeshsOwnAndGoesBack) {
  Llama8bOn32 setting;
  const SearchSpace& space = setting.space;
  const TrainingStep& step = *setting.steps.get(0, TrainingStepCache::kNoRemat);
  const std::vector<const MeshShape*> meshes = setting.largest_structure();
  ASSERT_GE(meshes.size(), 3U);
  const size_t none = TrainingStepCache::kNoRemat;
  ResizablePrograms kept;
  kept.offer(0, none, partitioned(space, step, setting.rules, *meshes[0]), *meshes[0]);
  const CostContext base = perf_options_from_config(setting.config, *space.slice.chip).cost;
  const std::vector<CostContext> contexts = {base};
  auto own_text = [&](size_t which) {
    return partitioned(space, step, setting.rules, *meshes[which]).graph.to_text();
  };
  auto resized_text = [&](size_t which) {
    std::string text;
    kept.with_resized(0, none, *meshes[which],
                      [&](const PartitionedProgram& program) { text = program.graph.to_text(); });
    return text;
  };
  ASSERT_FALSE(own_text(1) == own_text(2));
  PartitionedProgram borrower;  // holds no program before it borrows one
  const std::string held = borrower.graph.to_text();
  {
    ResizablePrograms::Loan loan;
    ASSERT_TRUE(kept.lend(0, none, *meshes[1], borrower, loan));
    EXPECT_TRUE(loan.active());
    EXPECT_TRUE(borrower.graph.to_text() == own_text(1));
    EXPECT_TRUE(resized_text(2).empty());  // skipped while lent
    EXPECT_FALSE(kept.bounds(0, none, *meshes[2], 1, contexts).has_value());
    ResizablePrograms::Loan other;
    EXPECT_FALSE(kept.lend(0, none, *meshes[2], borrower, other));
    loan.give_back();
    EXPECT_FALSE(loan.active());
    EXPECT_TRUE(borrower.graph.to_text() == held);
    EXPECT_TRUE(resized_text(2) == own_text(2));
    ASSERT_TRUE(kept.lend(0, none, *meshes[2], borrower, loan));
    EXPECT_TRUE(borrower.graph.to_text() == own_text(2));
  }  // the loan ends with it
  EXPECT_TRUE(borrower.graph.to_text() == held);
  EXPECT_TRUE(resized_text(1) == own_text(1));
  EXPECT_TRUE(kept.bounds(0, none, *meshes[2], 1, contexts).has_value());
}

MeshShape ici_mesh(std::initializer_list<std::pair<const char*, int>> sizes) {
  MeshShape mesh;
  mesh.ici.fill(1);
  mesh.dcn.fill(1);
  for (const auto& [axis, size] : sizes) {
    mesh.ici[static_cast<size_t>(mesh_axis_index(axis))] = size;
  }
  return mesh;
}

// llama3.1-8b has 8 kv heads: a tensor split of 16 gathers them whole (attention's size choice),
// one of 4 keeps them split. The same axes are larger than 1 in both meshes.
TEST(ProgramResize, KvHeadsASplitDoesNotDivideRefuseTheResize) {
  Llama8bOn32 setting;
  const SearchSpace& space = setting.space;
  TrainingStepCache& steps = setting.steps;
  const LogicalAxisRules& rules = setting.rules;
  const TrainingStep& step = *steps.get(0, TrainingStepCache::kNoRemat);
  const MeshShape four = ici_mesh({{"fsdp", 8}, {"tensor", 4}});
  const MeshShape two = ici_mesh({{"fsdp", 16}, {"tensor", 2}});
  const MeshShape sixteen = ici_mesh({{"fsdp", 2}, {"tensor", 16}});
  std::optional<ResizableProgram> from =
      ResizableProgram::from(partitioned(space, step, rules, four), four);
  ASSERT_TRUE(from.has_value());
  EXPECT_FALSE(from->resize(sixteen));
  ASSERT_TRUE(from->resize(two));
  expect_same_program(from->program(), partitioned(space, step, rules, two), "tensor 4 -> 2");
}

// A re-sized program copied, or moved, re-sizes its own tensors, not those of the one it came from
// (ResizableProgram keeps where each local size is, and points again after a copy or a move).
TEST(ProgramResize, ACopyResizesItsOwnProgram) {
  Llama8bOn32 setting;
  const MeshShape four = ici_mesh({{"fsdp", 8}, {"tensor", 4}});
  const MeshShape two = ici_mesh({{"fsdp", 16}, {"tensor", 2}});
  std::optional<ResizableProgram> from = setting.kept_on(four);
  ASSERT_TRUE(from.has_value());
  ResizableProgram copy = *from;
  ASSERT_TRUE(copy.resize(two));
  const PartitionedProgram on_four = setting.none_on(four);
  const PartitionedProgram on_two = setting.none_on(two);
  expect_same_program(from->program(), on_four, "the original after its copy's resize");
  expect_same_program(copy.program(), on_two, "the copy");
  ResizableProgram moved = std::move(copy);
  ASSERT_TRUE(moved.resize(four));
  expect_same_program(moved.program(), on_four, "moved");
  ASSERT_TRUE(from->resize(two));
  expect_same_program(moved.program(), on_four, "moved, after the original's resize");
}

// A program given a copy of itself (moved back into the object it was copied from, as a container
// does when it drops an element and puts a copy in its place) re-sizes its own tensors: its table
// of where each local size is came with the copy and points into the tensors the move freed,
// although the program's address, which ResizableProgram compares to see a copy or a move, is the
// same.
TEST(ProgramResize, AProgramGivenACopyOfItselfResizesItsOwnTensors) {
  Llama8bOn32 setting;
  const MeshShape four = ici_mesh({{"fsdp", 8}, {"tensor", 4}});
  const MeshShape two = ici_mesh({{"fsdp", 16}, {"tensor", 2}});
  std::optional<ResizableProgram> from = setting.kept_on(four);  // its table: its own tensors
  ASSERT_TRUE(from.has_value());
  ResizableProgram copy = *from;
  *from = std::move(copy);
  ASSERT_TRUE(from->resize(two));
  expect_same_program(from->program(), setting.none_on(two), "given a copy of itself");
}

// A recorded choice of each kind that comes out otherwise on the mesh refuses the resize, even on
// the mesh the program was built for (the first mesh of the space that records each kind).
TEST(ProgramResize, EveryKindOfChoiceIsChecked) {
  Llama8bOn32 setting;
  const SearchSpace& space = setting.space;
  TrainingStepCache& steps = setting.steps;
  const LogicalAxisRules& rules = setting.rules;
  const Divisibility& divisibility = setting.divisibility;
  std::map<SizeDecision::Kind, int> checked;
  for (const MeshShape& mesh : space.meshes) {
    if (!divisibility.parameters_divide(mesh) || checked.size() == 3) {
      continue;
    }
    const PartitionedProgram program =
        partitioned(space, *steps.get(0, TrainingStepCache::kNoRemat), rules, mesh);
    for (size_t index = 0; index < program.size_decisions.recorded.size(); ++index) {
      if (checked.contains(program.size_decisions.recorded[index].kind)) {
        continue;
      }
      PartitionedProgram flipped = program;
      SizeDecision& decision = flipped.size_decisions.recorded[index];
      decision.outcome = !decision.outcome;
      std::optional<ResizableProgram> from = ResizableProgram::from(flipped, mesh);
      ASSERT_TRUE(from.has_value());
      EXPECT_FALSE(from->resize(mesh)) << mesh.describe() << " " << static_cast<int>(decision.kind);
      ++checked[decision.kind];
    }
    std::optional<ResizableProgram> same = ResizableProgram::from(program, mesh);
    ASSERT_TRUE(same.has_value());
    EXPECT_TRUE(same->resize(mesh)) << mesh.describe();
  }
  // Einsum byte comparisons, attention's kv split, and the tensor-parallel reductions of q, k and
  // v's input gradients that reassociation compares.
  EXPECT_EQ(checked.size(), 3U);
}

TEST(ProgramResize, MoeRoutingIsNotResizable) {
  const Config config = Config::load(
      "", {"model_name=mixtral-8x7b", "compile_topology=v5p-16", "max_target_length=1024"});
  const SearchSpace space = build_search_space(config, {.max_per_device_batch = 2});
  TrainingStepCache steps(config, space);
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  const MeshShape& mesh = space.meshes.front();
  EXPECT_FALSE(
      ResizableProgram::from(partitioned(space, *steps.get(0, 0), rules, mesh), mesh).has_value());
}

ExploreResult explore_with(const Config& config, double bar, bool resized, bool check) {
  ExploreOptions options;
  options.threads = 2;
  options.resized_programs = resized;
  options.check_equivalent_meshes = check;
  return testing::explore_top3(config, bar, options);
}

TEST(ProgramResize, ExploreFindsTheSameTopWithFewerPrograms) {
  const Config config = Config::load(
      "", {"model_name=llama3.1-8b", "compile_topology=tpu7x-32", "max_target_length=2048"});
  const ExploreResult unbounded = explore_with(config, -1e300, false, false);
  ASSERT_EQ(unbounded.top.size(), 3U);
  const double bar = testing::bar_under_third(unbounded);
  const ExploreResult without = explore_with(config, bar, false, false);
  const ExploreResult with = explore_with(config, bar, true, false);
  testing::expect_same_top(with, without, unbounded);
  std::printf(
      "programs partitioned %lld re-sizing, %lld without; %lld batches bounded by a re-sized "
      "program, %lld programs copied re-sized\n",
      static_cast<long long>(with.programs_built), static_cast<long long>(without.programs_built),
      static_cast<long long>(with.phases.resized_program_skips),
      static_cast<long long>(with.phases.resized_programs));
  EXPECT_GT(with.phases.resized_program_skips, 0);
  EXPECT_GT(with.phases.resized_programs, 0);
  EXPECT_EQ(without.phases.resized_program_skips, 0);
  EXPECT_LT(with.programs_built, without.programs_built);
  // Every program built, each one a kept program re-sizes for compared with the built one's
  // bounds (throws if one differed).
  const ExploreResult checked = explore_with(config, bar, true, true);
  ASSERT_EQ(checked.top.size(), with.top.size());
  EXPECT_EQ(checked.top.front().args, with.top.front().args);
}

// Explore in checking mode partitions every program and compares each with a kept program
// re-sized for its mesh (std::logic_error on a difference): over the settings of the randomized
// test above that explore fastest (tensor_sequence, gemma3 with context, axes of 3 in a slice and
// over 3 slices), every pair of meshes the search meets.
TEST(ProgramResize, ExploreChecksEveryResizeOverMoreSettings) {
  for (const size_t index : {1U, 3U, 9U, 10U}) {
    const Setting& setting = kMoreSettings[index];
    const Config config = Config::load("", setting.overrides);
    const ExploreResult checked = explore_with(config, -1e300, true, true);
    EXPECT_FALSE(checked.top.empty()) << setting.overrides[0];
  }
}

}  // namespace
}  // namespace tpusim
