// The explorer's step-time bounds (sim/explore/step_bounds.h) against the programs they bound:
//   - the attention kind does not change the training step (so one program serves both kinds);
//   - the TensorCore bound never exceeds the step time the performance engine gives, per context;
//   - a remat policy's bound from the remat_policy=none program never exceeds the bound of the
//     policy's own partitioned program, and is not loose (within a few percent of it);
//   - on v7x with the SparseCore offload off, the TensorCore bound plus the collectives the
//     TensorCore drives still never exceeds the step, and is the tighter for them;
//   - the busiest link's seconds never exceed the step, on every kind of link (ICI, DCN, the
//     SparseCore queues, the host link), with and without accumulation;
//   - the remat_policy=none program's collectives bound every policy's (a policy runs at least
//     them), so the explorer's bound of a policy before partitioning it (its compute bound from
//     none, with none's collectives and none's dependency chains with fusible ops charged as
//     fused) never exceeds the policy's step, over random candidates;
//   - the dependency-chain bound (StepSimulator::chain_bound) never exceeds the step, over random
//     candidates of every kind the explorer searches (dense, MoE, v7x, multislice, pipeline
//     stages, GPU, every remat policy, perf switch and attention context), is at least the
//     TensorCore bound it refines, and its form over several contexts at once is at most each
//     context's own.
#include "sim/explore/step_bounds.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/mesh.h"
#include "sharding/step_program.h"
#include "sim/perf/step_simulator.h"
#include "support/timing_variants.h"

namespace tpusim {
namespace {

using testing::timing_variants;
using testing::TimingVariant;

const std::vector<std::string> kPolicies = {"minimal_with_context", "minimal",
                                            "save_qkv_proj",        "save_dot_except_mlp",
                                            "qkv_proj_offloaded",   "full"};

std::vector<CostContext> contexts_of(const PerfOptions& base) {
  std::vector<CostContext> contexts;
  CostContext dot = base.cost;
  dot.flash_attention = false;
  contexts.push_back(dot);
  for (const int64_t block : {512, 1024}) {
    CostContext flash = base.cost;
    flash.flash_attention = true;
    flash.block_q = block;
    flash.block_kv = block;
    contexts.push_back(flash);
  }
  return contexts;
}

TEST(StepBounds, AttentionKindDoesNotChangeTheStep) {
  for (const std::string model : {"tiny-llama", "tiny-moe", "tiny-gpt3"}) {
    for (const std::string vocab_tiling : {"1", "2"}) {
      std::vector<std::string> keys = {"model_name=" + model, "max_target_length=128",
                                       "num_vocab_tiling=" + vocab_tiling};
      Config dot = Config::load("", keys);
      dot.set("attention", "dot_product", "test");
      Config flash = Config::load("", keys);
      flash.set("attention", "flash", "test");
      EXPECT_EQ(build_training_step(dot, 4).graph.to_text(),
                build_training_step(flash, 4).graph.to_text())
          << model;
    }
  }
}

struct Case {
  std::string name;
  std::vector<std::string> keys;
};

class RematBoundsTest : public ::testing::TestWithParam<Case> {};

TEST_P(RematBoundsTest, BoundsHoldAndAreTight) {
  Config none_config = Config::load("", GetParam().keys);
  none_config.set("remat_policy", "none", "test");
  const StepProgram none_program = build_step_program(none_config);
  const PerfOptions base = perf_options_from_config(none_config, *none_program.slice.chip);
  const std::vector<CostContext> contexts = contexts_of(base);
  const ComputeBounds none = tensorcore_lower_bounds(none_program, contexts, true);
  for (const std::string& policy : kPolicies) {
    Config config = none_config;
    config.set("remat_policy", policy, "test");
    const StepProgram program = build_step_program(config);
    const std::vector<double> from_none =
        remat_bounds(none, recomputed_beyond_none(*program.step, *none_program.step),
                     program.accumulation_steps);
    const std::vector<double> own = tensorcore_lower_bounds(program, contexts).step;
    ASSERT_EQ(from_none.size(), contexts.size());
    for (size_t context = 0; context < contexts.size(); ++context) {
      SCOPED_TRACE(policy + " context " + std::to_string(context));
      EXPECT_LE(from_none[context], own[context] * (1 + 1e-12));
      EXPECT_GE(from_none[context], none.step[context]);
      EXPECT_GT(from_none[context], 0.97 * own[context]);  // not loose
      if (std::getenv("TPUSIM_PRINT_BOUNDS") != nullptr) {
        std::printf("%s %s ctx%zu none %.6g from_none %.6g own %.6g\n", GetParam().name.c_str(),
                    policy.c_str(), context, none.step[context], from_none[context], own[context]);
      }
      PerfOptions options = base;
      options.cost = contexts[context];
      options.record_details = false;
      EXPECT_LE(own[context], simulate_step(program, options).step_seconds * (1 + 1e-12));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, RematBoundsTest,
    ::testing::Values(
        Case{"Fsdp",
             {"model_name=llama2-7b", "compile_topology=v5p-8", "max_target_length=2048",
              "per_device_batch_size=2"}},
        Case{"TensorAndAccumulation",
             {"model_name=llama2-7b", "compile_topology=v5p-8", "max_target_length=2048",
              "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "per_device_batch_size=1",
              "gradient_accumulation_steps=2"}},
        Case{"ContextAndVocabTiling",
             {"model_name=llama2-7b", "compile_topology=v5p-8", "max_target_length=4096",
              "ici_fsdp_parallelism=2", "ici_context_parallelism=2", "num_vocab_tiling=4"}},
        Case{"ExpertParallelMoe",
             {"model_name=mixtral-8x7b", "compile_topology=v5p-16", "max_target_length=1024",
              "ici_fsdp_parallelism=2", "ici_expert_parallelism=4"}}),
    [](const ::testing::TestParamInfo<Case>& param) { return param.param.name; });

// v7x without the SparseCore offload: its all-gathers, reduce-scatters and all-reduces over ICI
// (those not overlapped with a matmul) run on the TensorCore, so they add to its bound.
TEST(StepBounds, TensorCoreDrivenCollectivesAddToTheBoundOnV7x) {
  for (const std::vector<std::string>& mesh :
       {std::vector<std::string>{"ici_fsdp_parallelism=-1"},
        std::vector<std::string>{"ici_fsdp_parallelism=4", "ici_tensor_parallelism=4"},
        std::vector<std::string>{"ici_data_parallelism=2", "ici_fsdp_parallelism=4",
                                 "ici_tensor_parallelism=2", "gradient_accumulation_steps=2"}}) {
    std::vector<std::string> keys = {"model_name=llama2-7b", "compile_topology=tpu7x-16",
                                     "max_target_length=2048", "per_device_batch_size=1"};
    keys.insert(keys.end(), mesh.begin(), mesh.end());
    const Config config = Config::load("", keys);
    const StepProgram program = build_step_program(config);
    PerfOptions options = perf_options_from_config(config, *program.slice.chip);
    options.record_details = false;
    options.sparse_core_offload = false;
    const double compute = tensorcore_lower_bounds(program, {options.cost}).step.front();
    StepSimulator simulator(program);
    for (const bool collective_matmul : {false, true}) {
      SCOPED_TRACE(keys.back() + (collective_matmul ? " collective_matmul" : ""));
      options.collective_matmul = collective_matmul;
      const double driven = simulator.collective_bounds(options).tensorcore_driven_seconds;
      EXPECT_GT(driven, 0);  // FSDP's weight all-gathers at least
      EXPECT_LE(compute + driven, simulator.run(options).step_seconds * (1 + 1e-12));
    }
  }
  // Chips whose collectives are asynchronous have none (with their own options: v5p's chip).
  const Config v5p =
      Config::load("", {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048",
                        "per_device_batch_size=1", "ici_fsdp_parallelism=-1"});
  const StepProgram v5p_program = build_step_program(v5p);
  PerfOptions v5p_options = perf_options_from_config(v5p, *v5p_program.slice.chip);
  v5p_options.sparse_core_offload = false;
  EXPECT_GT(StepSimulator(v5p_program).collective_bounds(v5p_options).busiest_link_seconds, 0);
  EXPECT_EQ(StepSimulator(v5p_program).collective_bounds(v5p_options).tensorcore_driven_seconds, 0);
}

// The explorer reuses one StepSimulator across the placements of a mesh (it keeps per-mesh facts
// such as the collective times and whether continuation fusion applies, and forgets them on a new
// layout): under every placement and switch its bounds and step are a fresh simulator's, bit for
// bit, whatever placement it saw before.
TEST(StepBounds, ASimulatorReusedAcrossPlacementsGivesAFreshOnesBounds) {
  const std::vector<std::vector<std::string>> cases = {
      {"model_name=llama2-7b", "compile_topology=tpu7x-16", "max_target_length=2048",
       "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2", "ici_data_parallelism=2"},
      {"model_name=llama2-7b", "compile_topology=v5e-16", "compile_topology_num_slices=2",
       "max_target_length=1024", "dcn_data_parallelism=2", "ici_fsdp_parallelism=4",
       "ici_tensor_parallelism=4"},
  };
  for (const std::vector<std::string>& keys : cases) {
    const Config config = Config::load("", keys);
    StepProgram shared_program = build_step_program(config);
    const PerfOptions base = perf_options_from_config(config, *shared_program.slice.chip);
    StepSimulator shared(shared_program);  // reads shared_program.mesh as it is changed below
    int layouts = 0;
    for (const std::string first : {"tensor", "data", "fsdp", "tensor"}) {
      shared_program.mesh =
          place_mesh(shared_program.mesh.shape, shared_program.slice, {mesh_axis_index(first)});
      StepProgram fresh_program = shared_program;
      ++layouts;
      for (const TimingVariant& variant : timing_variants(base)) {
        SCOPED_TRACE(keys[1] + " placed first " + first + " " + variant.label);
        const PerfOptions& options = variant.options;
        StepSimulator fresh(fresh_program);
        const CollectiveBounds want = fresh.collective_bounds(options);
        const CollectiveBounds got = shared.collective_bounds(options);
        EXPECT_EQ(got.tensorcore_driven_seconds, want.tensorcore_driven_seconds);
        EXPECT_EQ(got.busiest_link_seconds, want.busiest_link_seconds);
        EXPECT_EQ(shared.chain_bound(options), StepSimulator(fresh_program).chain_bound(options));
        EXPECT_EQ(shared.run(options).step_seconds,
                  StepSimulator(fresh_program).run(options).step_seconds);
      }
    }
    EXPECT_EQ(layouts, 4);
  }
  // The v7x case has collectives the TensorCore drives (offload off), so the kept fact matters.
  const Config v7x = Config::load("", cases.front());
  const StepProgram program = build_step_program(v7x);
  PerfOptions options = perf_options_from_config(v7x, *program.slice.chip);
  options.sparse_core_offload = false;
  EXPECT_GT(StepSimulator(program).collective_bounds(options).tensorcore_driven_seconds, 0);
}

// Each link runs one collective or transfer at a time, so its busy seconds bound the step. The
// bound is only as good as the scheduler's extrapolation of repeated regions (a link's backlog
// must grow into the measured period), so it is checked here on meshes where links dominate.
TEST(StepBounds, BusiestLinkNeverExceedsTheStep) {
  const std::vector<std::vector<std::string>> cases = {
      {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048",
       "ici_fsdp_parallelism=-1"},
      {"model_name=llama2-7b", "compile_topology=v5p-32", "max_target_length=2048",
       "ici_fsdp_parallelism=2", "ici_tensor_parallelism=8", "gradient_accumulation_steps=3"},
      {"model_name=llama2-7b", "compile_topology=v5e-16", "compile_topology_num_slices=4",
       "max_target_length=2048", "dcn_fsdp_parallelism=4", "ici_fsdp_parallelism=-1"},
      {"model_name=llama2-7b", "compile_topology=v5e-16", "compile_topology_num_slices=2",
       "max_target_length=2048", "dcn_data_parallelism=2", "ici_tensor_parallelism=16"},
      {"model_name=mixtral-8x7b", "compile_topology=v6e-16", "max_target_length=2048",
       "ici_fsdp_parallelism=4", "ici_expert_parallelism=4"},
      {"model_name=llama2-7b", "compile_topology=tpu7x-16", "max_target_length=2048",
       "ici_fsdp_parallelism=4", "ici_tensor_parallelism=4"},
      {"model_name=llama2-7b", "compile_topology=v5p-8", "max_target_length=2048",
       "remat_policy=qkv_proj_offloaded"},
  };
  for (const std::vector<std::string>& keys : cases) {
    const Config config = Config::load("", keys);
    const StepProgram program = build_step_program(config);
    StepSimulator simulator(program);
    for (const TimingVariant& variant :
         timing_variants(perf_options_from_config(config, *program.slice.chip))) {
      SCOPED_TRACE(keys[0] + " " + keys[1] + " " + keys.back() + " " + variant.label);
      const double link = simulator.collective_bounds(variant.options).busiest_link_seconds;
      EXPECT_GT(link, 0);
      EXPECT_LE(link, simulator.run(variant.options).step_seconds * (1 + 1e-9));
    }
  }
}

// The model/slice settings and meshes the random-candidate bound checks below draw from: dense
// and MoE, v5p, v6e, v7x, multislice over DCN, pipeline stages and a GPU node.
const std::vector<std::vector<std::string>>& random_candidate_settings() {
  static const std::vector<std::vector<std::string>> settings = {
      {"model_name=llama2-7b", "compile_topology=v5p-16", "max_target_length=2048"},
      {"model_name=llama2-7b", "compile_topology=tpu7x-16", "max_target_length=2048"},
      {"model_name=llama3.1-8b", "compile_topology=v6e-8", "max_target_length=4096"},
      {"model_name=mixtral-8x7b", "compile_topology=v5p-16", "max_target_length=1024"},
      {"model_name=llama2-7b", "compile_topology=v5e-8", "compile_topology_num_slices=2",
       "max_target_length=1024", "dcn_data_parallelism=2"},
      {"model_name=llama2-7b", "compile_topology=v5p-16", "max_target_length=1024",
       "ici_pipeline_parallelism=2", "num_pipeline_microbatches=4"},
      {"model_name=llama2-7b", "hardware=gpu", "compile_topology=a3", "max_target_length=1024"},
  };
  return settings;
}

std::vector<std::vector<std::string>> random_candidate_meshes() {
  return {
      {"ici_fsdp_parallelism=-1"},
      {"ici_fsdp_parallelism=-1", "ici_tensor_parallelism=2"},
      {"ici_data_parallelism=2", "ici_fsdp_parallelism=-1"},
      {"ici_fsdp_parallelism=-1", "ici_context_parallelism=2"},
      {"ici_fsdp_parallelism=-1", "ici_expert_parallelism=2"},
      {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=-1"},
  };
}

// The explorer bounds a remat policy before partitioning it from the remat_policy=none program of
// the same mesh and batch: compute from remat_bounds, collectives and dependency chains from
// none's (a policy runs none's chains with recomputation inserted, an observation). Over random
// candidates (models, slices, meshes, batches, accumulation, policies, perf switches, attention
// contexts): none's collective bounds never exceed the policy's, and the bound never exceeds the
// step the performance engine gives the policy's own program.
TEST(StepBounds, BoundFromNoneNeverExceedsAPolicysStep) {
  const std::vector<std::vector<std::string>>& settings = random_candidate_settings();
  const std::vector<std::vector<std::string>> meshes = random_candidate_meshes();
  std::mt19937 random(40);
  int checked = 0;
  for (int draw = 0; draw < 48; ++draw) {
    std::vector<std::string> keys = settings[random() % settings.size()];
    const std::vector<std::string>& mesh = meshes[random() % meshes.size()];
    keys.insert(keys.end(), mesh.begin(), mesh.end());
    keys.push_back("per_device_batch_size=" + std::to_string(1 + random() % 2));
    keys.push_back("gradient_accumulation_steps=" + std::to_string(1 + random() % 2));
    const std::string& policy = kPolicies[random() % kPolicies.size()];
    Config none_config = Config::load("", keys);
    none_config.set("remat_policy", "none", "test");
    Config config = none_config;
    config.set("remat_policy", policy, "test");
    StepProgram none_program;
    StepProgram program;
    try {
      none_program = build_step_program(none_config);
      program = build_step_program(config);
    } catch (const std::exception&) {
      continue;  // a mesh the model does not split evenly
    }
    const PerfOptions base = perf_options_from_config(config, *program.slice.chip);
    const std::vector<CostContext> contexts = contexts_of(base);
    const ComputeBounds none_compute = tensorcore_lower_bounds(none_program, contexts, true);
    const std::vector<double> compute =
        remat_bounds(none_compute, recomputed_beyond_none(*program.step, *none_program.step),
                     program.accumulation_steps);
    StepSimulator none_simulator(none_program);
    StepSimulator simulator(program);
    std::string where;
    for (const std::string& key : keys) {
      where += key + " ";
    }
    for (const TimingVariant& variant : timing_variants(base)) {
      PerfOptions options = variant.options;
      const CollectiveBounds from_none = none_simulator.collective_bounds(options);
      const CollectiveBounds own = simulator.collective_bounds(options);
      SCOPED_TRACE(where + policy + " " + variant.label);
      EXPECT_LE(from_none.tensorcore_driven_seconds, own.tensorcore_driven_seconds * (1 + 1e-12));
      EXPECT_LE(from_none.busiest_link_seconds, own.busiest_link_seconds * (1 + 1e-12));
      const double none_chains = none_simulator.chain_bound(options, none_compute.op_seconds);
      for (size_t context = 0; context < contexts.size(); ++context) {
        options.cost = contexts[context];
        const double bound = std::max(compute[context] + from_none.tensorcore_driven_seconds,
                                      from_none.busiest_link_seconds);
        const double step = simulator.run(options).step_seconds;
        EXPECT_LE(bound, step * (1 + 1e-9)) << context;
        EXPECT_LE(none_chains, step * (1 + 1e-12)) << context;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 120);
}

// The explorer prunes a timing variant whose chain bound cannot beat the top N, so the bound must
// never exceed the step the performance engine gives, whatever the program: checked over random
// candidates (models, slices incl. v7x, multislice, pipeline stages and a GPU, meshes, batches,
// accumulation, all remat policies, perf switches, attention contexts). It must also cover what
// it replaces: the TensorCore bound of the same context.
TEST(StepBounds, ChainBoundNeverExceedsTheStep) {
  const std::vector<std::vector<std::string>>& settings = random_candidate_settings();
  std::vector<std::vector<std::string>> meshes = random_candidate_meshes();
  meshes.push_back({"ici_fsdp_parallelism=-1", "ici_tensor_sequence_parallelism=2"});
  std::vector<std::string> policies = kPolicies;
  policies.emplace_back("none");
  std::mt19937 random(51);
  int checked = 0;
  double least_ratio = 1;
  for (int draw = 0; draw < 40; ++draw) {
    std::vector<std::string> keys = settings[random() % settings.size()];
    const std::vector<std::string>& mesh = meshes[random() % meshes.size()];
    keys.insert(keys.end(), mesh.begin(), mesh.end());
    keys.push_back("per_device_batch_size=" + std::to_string(1 + random() % 2));
    keys.push_back("gradient_accumulation_steps=" + std::to_string(1 + random() % 2));
    keys.push_back("remat_policy=" + policies[random() % policies.size()]);
    StepProgram program;
    try {
      program = build_step_program(Config::load("", keys));
    } catch (const std::exception&) {
      continue;  // a mesh the model does not split evenly
    }
    const PerfOptions base = perf_options_from_config(Config::load("", keys), *program.slice.chip);
    const std::vector<CostContext> contexts = contexts_of(base);
    const std::vector<double> compute = tensorcore_lower_bounds(program, contexts).step;
    StepSimulator simulator(program);
    std::string where;
    for (const std::string& key : keys) {
      where += key + " ";
    }
    for (const TimingVariant& variant : timing_variants(base)) {
      PerfOptions options = variant.options;
      const double any_context = simulator.chain_bound(options, contexts);
      for (size_t context = 0; context < contexts.size(); ++context) {
        SCOPED_TRACE(where + variant.label + " context " + std::to_string(context));
        options.cost = contexts[context];
        const double chain = simulator.chain_bound(options);
        const double step = simulator.run(options).step_seconds;
        EXPECT_LE(chain, step * (1 + 1e-12));
        EXPECT_GE(chain, compute[context] * (1 - 1e-12));
        EXPECT_LE(any_context, chain * (1 + 1e-12));
        least_ratio = std::min(least_ratio, chain / step);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 300);
  // Not a tuned figure: the chains leave out only link contention and waits across iterations.
  EXPECT_GT(least_ratio, 0.5);
}

}  // namespace
}  // namespace tpusim
