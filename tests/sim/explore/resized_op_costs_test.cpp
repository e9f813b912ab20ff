// The TensorCore bounds of a kept program re-sized for another mesh without re-sizing it
// (sim/explore/resized_op_costs.h) against tensorcore_lower_bounds of a copy of the same program
// re-sized whole (sharding/program_resize.h, which program_resize tests hold to the partitioner):
// kept programs on random meshes, each then asked for a random run of meshes of its structure,
// repeats included so that kept costs are found as well as costed, must give the same step and
// region bounds and the same op and forward-op seconds, bit for bit, and nullopt exactly where the
// whole re-size is refused. Dense, GQA whose kv heads a tensor split does not divide, fp8_full and
// int8 (a quantized weight's scale reads the shard it is gathered from), multislice, a pipeline.
#include "sim/explore/resized_op_costs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/ir/op_kind_traits.h"
#include "sharding/device_mesh.h"
#include "sharding/divisibility.h"
#include "sharding/partitioner.h"
#include "sim/explore/search_space.h"
#include "sim/explore/training_step_cache.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {
namespace {

const std::vector<std::vector<std::string>> kSettings = {
    {"model_name=tiny-llama", "compile_topology=v5e-8", "max_target_length=256"},
    {"model_name=llama3.1-8b", "compile_topology=tpu7x-32", "max_target_length=4096"},
    {"model_name=gemma2-2b", "compile_topology=tpu7x-16", "max_target_length=1536",
     "quantization=fp8_full"},
    {"model_name=qwen3-0.6b", "compile_topology=v5p-16", "max_target_length=1000",
     "quantization=int8"},
    {"model_name=llama2-7b", "compile_topology=v5e-8", "compile_topology_num_slices=2",
     "max_target_length=1024"},
    {"model_name=tiny-llama", "compile_topology=v5e-8", "compile_topology_num_slices=2",
     "dcn_pipeline_parallelism=2", "max_target_length=256"},
};

// Both bounds of one program on one mesh, bit for bit.
void expect_same_bounds(const ComputeBounds& got, const ComputeBounds& want, const Graph& graph,
                        size_t contexts, const std::string& where) {
  EXPECT_EQ(got.step, want.step) << where;
  EXPECT_EQ(got.region_seconds, want.region_seconds) << where;
  EXPECT_EQ(got.op_seconds, want.op_seconds) << where;
  ASSERT_EQ(got.forward_ops.size(), want.forward_ops.size()) << where;
  for (const Op& op : graph.ops()) {
    const double* a = got.forward_ops.find(op.region, op.name);
    const double* b = want.forward_ops.find(op.region, op.name);
    ASSERT_EQ(a == nullptr, b == nullptr) << where << " " << op.name;
    for (size_t context = 0; a != nullptr && context < contexts; ++context) {
      EXPECT_EQ(a[context], b[context]) << where << " " << op.name;
    }
  }
}

struct Counts {
  int compared = 0;
  int refused = 0;
  int64_t costed = 0;
  int64_t found = 0;
};

// A kept program of a random mesh, batch and remat policy of `space`, asked for `asks` random
// meshes of its structure: ResizedOpCosts against a whole re-size of a copy.
void compare_runs(const std::vector<std::string>& overrides, std::mt19937& random, int programs,
                  int asks, Counts& counts) {
  const Config config = Config::load("", overrides);
  const SearchSpace space = build_search_space(config, {.max_per_device_batch = 2});
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  TrainingStepCache steps(config, space);
  const Divisibility divisibility(*steps.get(0, 0), rules);
  std::map<uint32_t, std::vector<const MeshShape*>> by_structure;
  for (const MeshShape& mesh : space.meshes) {
    if (divisibility.parameters_divide(mesh)) {
      by_structure[ResizableProgram::axes_above_one(mesh)].push_back(&mesh);
    }
  }
  const CostContext base = perf_options_from_config(config, *space.slice.chip).cost;
  std::vector<CostContext> contexts = {base, base};
  contexts[1].flash_attention = !base.flash_attention;  // attention ops cost per context
  for (int program = 0; program < programs; ++program) {
    auto group = by_structure.begin();
    std::advance(group, static_cast<long>(random() % by_structure.size()));
    const std::vector<const MeshShape*>& meshes = group->second;
    const MeshShape& a = *meshes[random() % meshes.size()];
    const size_t batch = random() % space.batches.size();
    const TrainingStep& step = *steps.get(batch, random() % space.remats.size());
    std::optional<ResizableProgram> kept =
        ResizableProgram::from(partition(step, rules, place_mesh(a, space.slice)), a);
    ASSERT_TRUE(kept.has_value()) << overrides[0];
    ResizableProgram whole = *kept;
    ResizedOpCosts costs(*kept);
    const int64_t accumulation = space.batches[batch].accumulation_steps;
    for (int ask = 0; ask < asks; ++ask) {
      const MeshShape& b = *meshes[random() % meshes.size()];
      const std::string where = overrides[0] + " " + a.describe() + " -> " + b.describe();
      const std::optional<ComputeBounds> got = costs.bounds(*kept, b, accumulation, contexts);
      const bool resized = whole.resize(b);
      ASSERT_EQ(got.has_value(), resized) << where;
      if (!resized) {
        ++counts.refused;
        continue;
      }
      const ComputeBounds want =
          tensorcore_lower_bounds(whole.graph(), accumulation, contexts, /*keep_forward_ops=*/true);
      expect_same_bounds(*got, want, whole.graph(), contexts.size(), where);
      ++counts.compared;
    }
    counts.costed += costs.costed();
    counts.found += costs.found();
  }
}

TEST(ResizedOpCosts, SameBoundsAsTheProgramResizedWhole) {
  std::mt19937 random(4559);
  Counts counts;
  for (const std::vector<std::string>& overrides : kSettings) {
    compare_runs(overrides, random, 6, 12, counts);
  }
  std::printf("%d bounds compared, %d refused; %lld op costs costed, %lld found kept\n",
              counts.compared, counts.refused, static_cast<long long>(counts.costed),
              static_cast<long long>(counts.found));
  EXPECT_GE(counts.compared, 200);
  EXPECT_GT(counts.costed, 0);
  EXPECT_GT(counts.found, counts.costed);  // meshes repeat: most costs are found kept
}

// What ResizedOpCosts keys on: a compute op's cost reads the shapes of tensors_cost_reads alone.
// Every other tensor of quantized programs (a weight's dynamic scale reads the shard it is
// gathered from) made larger, every op costs the same, under every context.
TEST(ResizedOpCosts, AnOpsCostReadsOnlyTheTensorsItNames) {
  int ops = 0;
  for (const char* quantization : {"quantization=fp8_full", "quantization=int8"}) {
    const Config config = Config::load(
        "", {"model_name=gemma2-2b", "compile_topology=v5p-16", "max_target_length=1024",
             "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2", quantization});
    const SearchSpace space = build_search_space(config, {.max_per_device_batch = 1});
    const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
    TrainingStepCache steps(config, space);
    const CostContext base = perf_options_from_config(config, *space.slice.chip).cost;
    const MeshShape mesh = resolve_mesh(config, space.slice);
    const Graph graph = partition(*steps.get(0, 0), rules, place_mesh(mesh, space.slice)).graph;
    std::vector<TensorId> reads;
    for (const Op& op : graph.ops()) {
      if (!is_compute(op.kind)) {
        continue;
      }
      reads.clear();
      tensors_cost_reads(graph, op, reads);
      Graph others = graph;
      for (const Tensor& tensor : graph.tensors()) {
        if (std::find(reads.begin(), reads.end(), tensor.id) == reads.end()) {
          for (Dim& dim : others.mutable_tensor(tensor.id).dims) {
            dim.size = 2 * dim.size + 1;
          }
        }
      }
      for (const bool fused : {false, true}) {
        EXPECT_EQ(cost_compute_op(others, op, base, fused).seconds,
                  cost_compute_op(graph, op, base, fused).seconds)
            << quantization << " " << op.name;
      }
      ++ops;
    }
  }
  EXPECT_GT(ops, 100);
}

// A group keeps the costs of its last few products: with room for 2, a kept program asked for
// every mesh of its structure three times over forgets and costs again, and the costs of one list
// of contexts are not taken for another's. The bounds are still the whole re-size's.
TEST(ResizedOpCosts, ForgetsTheOldestProductsAndCostsPerContexts) {
  const Config config = Config::load(
      "", {"model_name=llama3.1-8b", "compile_topology=tpu7x-32", "max_target_length=2048"});
  const SearchSpace space = build_search_space(config, {.max_per_device_batch = 1});
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  TrainingStepCache steps(config, space);
  std::map<uint32_t, std::vector<const MeshShape*>> by_structure;
  for (const MeshShape& mesh : space.meshes) {
    by_structure[ResizableProgram::axes_above_one(mesh)].push_back(&mesh);
  }
  const std::vector<const MeshShape*>* largest = &by_structure.begin()->second;
  for (const auto& [structure, meshes] : by_structure) {
    largest = meshes.size() > largest->size() ? &meshes : largest;
  }
  const CostContext base = perf_options_from_config(config, *space.slice.chip).cost;
  CostContext wide = base;
  wide.block_q = 2 * base.block_q;
  const std::vector<std::vector<CostContext>> lists = {{base}, {base, wide}, {wide}};
  const MeshShape& a = *largest->front();
  std::optional<ResizableProgram> kept =
      ResizableProgram::from(partition(*steps.get(0, 0), rules, place_mesh(a, space.slice)), a);
  ASSERT_TRUE(kept.has_value());
  ResizableProgram whole = *kept;
  ResizedOpCosts costs(*kept, /*kept_per_group=*/2);
  int compared = 0;
  for (const std::vector<CostContext>& contexts : lists) {
    for (int round = 0; round < 3; ++round) {
      for (const MeshShape* b : *largest) {
        const std::optional<ComputeBounds> got = costs.bounds(*kept, *b, 1, contexts);
        ASSERT_EQ(got.has_value(), whole.resize(*b)) << b->describe();
        if (got.has_value()) {
          expect_same_bounds(*got, tensorcore_lower_bounds(whole.graph(), 1, contexts, true),
                             whole.graph(), contexts.size(), b->describe());
          ++compared;
        }
      }
    }
  }
  std::printf("%zu meshes of one structure, %d bounds compared; %lld costed, %lld found\n",
              largest->size(), compared, static_cast<long long>(costs.costed()),
              static_cast<long long>(costs.found()));
  EXPECT_GT(largest->size(), 2U);
  EXPECT_GT(compared, 0);
  EXPECT_GT(costs.found(), 0);
}

}  // namespace
}  // namespace tpusim
