// The explorer against brute force: on small spaces every candidate is estimated through the
// ordinary `tpusim estimate` path (estimate_config), legality is read from the partitioner's own
// padding report and fit from the memory model, and the explorer must find the same best
// candidate and evaluate exactly the candidates that are legal and fit (so no pruning rule, the
// batch-monotone memory pruning included, ever discards a candidate that could run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/error.h"
#include "model/config.h"
#include "sharding/step_program.h"
#include "sim/estimate/estimate.h"
#include "sim/explore/explorer.h"
#include "sim/explore/program_signature.h"
#include "sim/explore/worker_result.h"

namespace tpusim {
namespace {

std::vector<std::string> split_args(const std::string& text) {
  std::vector<std::string> items;
  std::istringstream in(text);
  for (std::string item; in >> item;) {
    items.push_back(item);
  }
  return items;
}

struct BruteForce {
  int64_t same_placement = 0;        // a placement choice that lays the mesh as an earlier one
  int64_t placement_impossible = 0;  // a placement choice that cannot lay the mesh out
  int64_t illegal = 0;               // parameters or inputs do not split evenly
  int64_t legal = 0;                 // split evenly (and not a duplicate placement)
  int64_t legal_and_fitting = 0;
  int64_t total = 0;
  double best_objective = -1;
  std::string best_args;
  std::vector<double> objectives;               // of every legal, fitting candidate
  std::map<uint64_t, double> best_per_program;  // by program_signature
};

// Parameters and inputs must split evenly (JAX's rule for jit arguments); the partitioner pads
// anything else and reports every padded dim by tensor name. The one exception is the batch of a
// fractional per_device_batch_size: MaxText loads one sequence per device (which splits) and the
// step keeps fewer, which XLA pads.
bool legal(const Estimate& estimate, double per_device_batch_size) {
  std::set<std::string> arguments;
  for (const Tensor& tensor : estimate.program.step->graph.tensors()) {
    if (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kInput) {
      arguments.insert(tensor.name);
    }
  }
  for (const PaddingNote& note : estimate.program.program.padding) {
    const bool fractional_batch = note.dim == "batch" && per_device_batch_size < 1;
    if (arguments.count(note.tensor) > 0 && !fractional_batch) {
      return false;
    }
  }
  return true;
}

// estimate refuses what explore prunes as axis_does_not_divide, and says so.
bool refused_as_uneven(const UserError& error) {
  return std::string(error.what()).find("axis_does_not_divide") != std::string::npos;
}

BruteForce brute_force(const Config& config, const ExploreLimits& limits) {
  const SearchSpace space = build_search_space(config, limits);
  BruteForce result;
  for (const MeshShape& mesh : space.meshes) {
    for (const BatchChoice& batch : space.batches) {
      for (size_t remat = 0; remat < space.remats.size(); ++remat) {
        for (const std::string& kind : space.attention_kinds) {
          for (const PerfChoice& perf : space.perf_choices(kind)) {
            std::vector<std::string> placements_seen;  // estimate's mesh_placement, as text
            bool arguments_divide = true;              // placement does not change the shards
            for (size_t placement = 0; placement < space.placements.size(); ++placement) {
              Candidate candidate{
                  mesh, batch, static_cast<int>(remat), kind, perf, static_cast<int>(placement), 0};
              ++result.total;
              if (!arguments_divide) {
                ++result.illegal;
                continue;
              }
              // A choice that places an axis of size 1 first is the default order again.
              bool trivial = placement > 0;
              for (const int axis : space.placements[placement]) {
                trivial = trivial && mesh.ici[static_cast<size_t>(axis)] == 1;
              }
              if (trivial) {
                ++result.same_placement;
                continue;
              }
              Config full = config;
              for (const std::string& item : candidate_overrides(space, candidate)) {
                const auto [key, value] = split_override(item);
                full.set(key, value, "brute force");
              }
              Estimate estimate;
              try {
                estimate = estimate_config(full);
              } catch (const UserError& error) {
                if (refused_as_uneven(error)) {
                  arguments_divide = false;
                  ++result.illegal;
                } else {
                  ++result.placement_impossible;
                }
                continue;
              }
              // What estimate accepts splits evenly by the partitioner's own padding report.
              EXPECT_TRUE(legal(estimate, full.get_float("per_device_batch_size")))
                  << full.get_float("per_device_batch_size") << " on " << mesh.describe();
              const std::string laid_out = estimate.json["mesh_placement"].dump();
              if (std::find(placements_seen.begin(), placements_seen.end(), laid_out) !=
                  placements_seen.end()) {
                ++result.same_placement;
                continue;
              }
              placements_seen.push_back(laid_out);
              const double usable = estimate.memory.capacity_bytes * (1 - limits.min_hbm_headroom);
              ++result.legal;
              if (estimate.memory.peak_bytes > usable) {
                continue;
              }
              ++result.legal_and_fitting;
              result.objectives.push_back(estimate.tokens_per_s_per_chip);
              double& program_best = result.best_per_program[program_signature(estimate.program)];
              program_best = std::max(program_best, estimate.tokens_per_s_per_chip);
              if (estimate.tokens_per_s_per_chip > result.best_objective) {
                result.best_objective = estimate.tokens_per_s_per_chip;
                std::string args;
                for (const std::string& item : candidate_overrides(space, candidate)) {
                  args += item + " ";
                }
                result.best_args = args;
              }
            }
          }
        }
      }
    }
  }
  return result;
}

void expect_explorer_matches_brute_force(const std::vector<std::string>& overrides,
                                         const ExploreLimits& limits) {
  const Config config = Config::load("", overrides);
  ExploreOptions options;
  options.limits = limits;
  options.top = 3;
  options.threads = 2;
  const ExploreResult result = explore(config, options);
  const BruteForce expected = brute_force(config, limits);

  int64_t pruned = 0;
  for (const auto& [reason, count] : result.pruned) {
    pruned += count;
  }
  EXPECT_EQ(result.candidates_evaluated + pruned, expected.total);
  EXPECT_EQ(result.space.size(), expected.total);
  auto pruned_for = [&](const std::string& reason) -> int64_t {
    const auto found = result.pruned.find(reason);
    return found == result.pruned.end() ? 0 : found->second;
  };
  // Exactly the illegal candidates are pruned for divisibility; the timed ones all fit; every
  // legal, fitting candidate is either timed or provably below the top 3 (a policy bounded from
  // the remat_policy=none program is pruned as cannot_beat_top before its memory is known, so
  // that count may also hold candidates that would not fit).
  EXPECT_EQ(pruned_for("axis_does_not_divide"), expected.illegal);
  EXPECT_EQ(pruned_for("same_placement"), expected.same_placement);
  EXPECT_EQ(pruned_for("placement_impossible"), expected.placement_impossible);
  EXPECT_LE(result.candidates_evaluated, expected.legal_and_fitting);
  EXPECT_GE(result.candidates_evaluated + pruned_for("cannot_beat_top"),
            expected.legal_and_fitting);
  // The explorer lists one candidate per program, the best of it.
  std::vector<double> best;
  for (const auto& [program, objective] : expected.best_per_program) {
    best.push_back(objective);
  }
  std::sort(best.begin(), best.end(), std::greater<>());
  ASSERT_EQ(std::min<size_t>(best.size(), 3), result.top.size());
  for (size_t rank = 0; rank < result.top.size(); ++rank) {
    EXPECT_EQ(tie_key(result.top[rank].tokens_per_s_per_chip), tie_key(best[rank]))
        << "rank " << rank;
  }
  ASSERT_FALSE(result.top.empty());
  // The explorer's lean timing and the full estimate of its winner agree with brute force.
  EXPECT_DOUBLE_EQ(result.top[0].tokens_per_s_per_chip, expected.best_objective)
      << "explorer: " << result.top[0].args << "\nbrute force: " << expected.best_args;
  EXPECT_DOUBLE_EQ(result.top[0].objective, result.top[0].tokens_per_s_per_chip);
  for (size_t rank = 1; rank < result.top.size(); ++rank) {
    EXPECT_GE(tie_key(result.top[rank - 1].objective), tie_key(result.top[rank].objective));
  }
}

TEST(Explorer, BestEqualsBruteForceOnTinyLlamaEveryDimension) {
  // 4 devices: 28 meshes x 3 batches x 11 remat policies x (dot, flash) x collective matmul.
  expect_explorer_matches_brute_force(
      {"model_name=tiny-llama", "compile_topology=v5e-4", "max_target_length=256"},
      {.global_batch_size = 8, .max_accumulation_steps = 4});
}

TEST(Explorer, BestEqualsBruteForceUnderHbmPressure) {
  // llama2-7b on 8 v5e chips (16 GiB each): weights-only, batch-monotone and plain memory pruning
  // all happen; a 10% headroom limit applies.
  expect_explorer_matches_brute_force(
      {"model_name=llama2-7b", "compile_topology=v5e-8", "max_target_length=2048",
       "attention=flash", "collective_matmul=true", "sa_block_q=512", "sa_block_kv=512"},
      {.global_batch_size = 32, .max_accumulation_steps = 8, .min_hbm_headroom = 0.1});
}

TEST(Explorer, BestEqualsBruteForceOverPlacementsOnV7x) {
  // tpu7x-16: 8 chips (2x2x2) of two chiplets. Which mesh axis takes the chiplet pair, and which
  // the torus axes, is searched (mesh_placement_first); the other timing switches are pinned.
  expect_explorer_matches_brute_force(
      {"model_name=tiny-llama", "compile_topology=tpu7x-16", "max_target_length=256",
       "remat_policy=full", "attention=flash", "sa_block_q=512", "sa_block_kv=512",
       "collective_matmul=true", "sparse_core_collective_offload=off"},
      {.global_batch_size = 16, .max_accumulation_steps = 1});
}

TEST(Explorer, BestEqualsBruteForceWhenDotProductScoresDoNotFit) {
  // llama2-7b at 8192 tokens on v5p-8: at 8 sequences per device the dot_product scores no
  // longer fit while flash still does, so fit is decided per attention kind.
  expect_explorer_matches_brute_force(
      {"model_name=llama2-7b", "compile_topology=v5p-8", "max_target_length=8192",
       "remat_policy=full", "sa_block_q=512", "sa_block_kv=512", "collective_matmul=true",
       "sparse_core_collective_offload=off"},
      {.global_batch_size = 32, .max_accumulation_steps = 4});
}

TEST(Explorer, PlacementChoicesLayTheMeshDifferently) {
  const Config config =
      Config::load("", {"model_name=tiny-llama", "compile_topology=tpu7x-16",
                        "max_target_length=256", "remat_policy=full", "attention=flash"});
  const SearchSpace space = build_search_space(config, {.global_batch_size = 16});
  ASSERT_GT(space.placements.size(), 1U);
  EXPECT_TRUE(space.placements[0].empty());  // create_device_mesh's order first
  EXPECT_NE(
      std::find(space.searched_keys.begin(), space.searched_keys.end(), "mesh_placement_first"),
      space.searched_keys.end());
  ExploreOptions options;
  options.limits = {.global_batch_size = 16};
  options.top = 1;
  const ExploreResult result = explore(config, options);
  ASSERT_EQ(result.top.size(), 1U);
  // The winner's args reproduce it through `tpusim estimate`, placement included.
  EXPECT_NE(result.top[0].args.find("mesh_placement_first="), std::string::npos);
  EXPECT_EQ(result.top[0].maxtext_overrides.end(),
            std::find_if(result.top[0].maxtext_overrides.begin(),
                         result.top[0].maxtext_overrides.end(), [](const std::string& item) {
                           return item.rfind("mesh_placement_first", 0) == 0;
                         }));
  EXPECT_DOUBLE_EQ(
      estimate_config(Config::load("", split_args(result.top[0].args))).tokens_per_s_per_chip,
      result.top[0].tokens_per_s_per_chip);
}

// Candidates that score the same to 9 digits are one entry, the first in the space's order,
// whatever order they are offered or merged in; the other places go to different scores.
TEST(WorkerResult, TiesCollapseToTheFirstCandidateInAnyOrder) {
  auto scored = [](int64_t order, double objective) {
    Scored item;
    item.candidate.order = order;
    item.objective = objective;
    return item;
  };
  const std::vector<Scored> offers = {scored(7, 100.0), scored(3, 100.0 * (1 + 1e-14)),
                                      scored(9, 90.0),  scored(5, 100.0),
                                      scored(1, 80.0),  scored(2, 95.0)};
  std::vector<size_t> permutation = {0, 1, 2, 3, 4, 5};
  std::vector<std::pair<int64_t, double>> first;
  do {
    WorkerResult a;
    WorkerResult b;
    for (size_t index = 0; index < permutation.size(); ++index) {
      (index % 2 == 0 ? a : b).offer(offers[permutation[index]], 3);
    }
    a.merge(std::move(b), 3);
    std::vector<std::pair<int64_t, double>> kept;
    for (const Scored& item : a.top) {
      kept.emplace_back(item.candidate.order, tie_key(item.objective));
    }
    if (first.empty()) {
      first = kept;
      ASSERT_EQ(kept.size(), 3U);
      EXPECT_EQ(kept[0].first, 3);  // of 7, 3 and 5, all scoring 100
      EXPECT_EQ(kept[1].first, 2);
      EXPECT_EQ(kept[2].first, 9);
    }
    EXPECT_EQ(kept, first);
  } while (std::next_permutation(permutation.begin(), permutation.end()));
  EXPECT_TRUE(cannot_reach(89.0, 90.0));
  EXPECT_FALSE(cannot_reach(90.0 * (1 - 1e-14), 90.0));
}

// cannot_reach answers "below the threshold with a tie key of its own" without the tie keys when
// the bound is far below: the same answer as the keys give, near the 1e-6 shortcut and at the
// 9 significant digits the keys keep, over magnitudes and signs.
TEST(WorkerResult, CannotReachAgreesWithTheTieKeys) {
  int checked = 0;
  for (const double threshold : {-5.0, 1e-300, 1e-12, 0.3, 1.0, 9.999999999, 10.0, 6.9140132317,
                                 123456.789, 1e12, std::numeric_limits<double>::infinity()}) {
    for (const double gap :
         {0.0, 1e-12, 4e-10, 6e-10, 1e-9, 5e-9, 1e-8, 9.9e-7, 1e-6, 1.01e-6, 1e-5, 0.5, 2.0}) {
      for (const double bound : {threshold * (1 - gap), threshold - gap, threshold * (1 + gap)}) {
        SCOPED_TRACE(std::to_string(bound) + " of " + std::to_string(threshold));
        const bool keys = bound < threshold && tie_key(bound) != tie_key(threshold);
        EXPECT_EQ(cannot_reach(bound, threshold), keys);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 11 * 13 * 3);
}

// One entry per program: the best candidate of a program stays, whatever order the candidates
// arrive in (and across merges), with the others as its spellings; different programs that score
// the same are different entries, the first in the space's order ahead.
TEST(WorkerResult, OneEntryPerProgramInAnyOrder) {
  auto scored = [](int64_t order, double objective, uint64_t program, int fsdp) {
    Scored item;
    item.candidate.order = order;
    item.candidate.mesh.ici.fill(1);
    item.candidate.mesh.dcn.fill(1);
    item.candidate.mesh.ici[static_cast<size_t>(mesh_axis_index("fsdp"))] = fsdp;
    item.objective = objective;
    item.program = program;
    return item;
  };
  const std::vector<Scored> offers = {scored(7, 100.0, 11, 16), scored(3, 99.0, 11, 8),
                                      scored(9, 90.0, 12, 16),  scored(5, 90.0, 13, 4),
                                      scored(1, 80.0, 14, 2),   scored(2, 95.0, 11, 2)};
  std::vector<size_t> permutation = {0, 1, 2, 3, 4, 5};
  do {
    WorkerResult a;
    WorkerResult b;
    for (size_t index = 0; index < permutation.size(); ++index) {
      (index % 2 == 0 ? a : b).offer(offers[permutation[index]], 3);
    }
    a.merge(std::move(b), 3);
    ASSERT_EQ(a.top.size(), 3U);
    EXPECT_EQ(a.top[0].candidate.order, 7);  // program 11's best
    EXPECT_EQ(a.top[1].candidate.order, 5);  // 90 twice, two programs: the first in order first
    EXPECT_EQ(a.top[2].candidate.order, 9);
    // Program 11's other meshes (fsdp=8 and fsdp=2) are its spellings, when they were offered
    // before the entry could drop them (the 95 after the 99 is still listed: same program).
    EXPECT_LE(a.top[0].spellings.size(), 2U);
    for (const Candidate& spelling : a.top[0].spellings) {
      EXPECT_NE(spelling.mesh.ici, a.top[0].candidate.mesh.ici);
    }
  } while (std::next_permutation(permutation.begin(), permutation.end()));
}

// Strips the mesh axes' names: what remains is the program's shapes, groups and bytes.
TEST(ProgramSignature, TextWithoutAxesKeepsShapesAndGroups) {
  EXPECT_EQ(program_text_without_axes(
                "ag (w[embed:256@fsdp+expert,mlp:8@tensor] bf16) -> g[embed:4096,mlp:8@tensor] "
                "bf16 over {fsdp,expert} group 16 bytes 64\n"),
            "ag (w[embed:256,mlp:8] bf16) -> g[embed:4096,mlp:8] bf16 group 16 bytes 64\n");
}

// The issue's case: `explore --top 5` listed five rows of one answer. Each row must now be a
// different per-device program, read from `tpusim program`'s text (Graph::to_text), both as
// printed and with the mesh axes' names removed by an independent pattern.
TEST(Explorer, TopCandidatesAreDifferentPrograms) {
  const Config config = Config::load("", {"model_name=llama2-7b", "compile_topology=v5p-32"});
  ExploreOptions options;
  options.top = 5;
  const ExploreResult result = explore(config, options);
  ASSERT_EQ(result.top.size(), 5U);
  const std::regex axes(R"(@[a-z_+]+| over \{[a-z_,]*\})");
  std::set<std::string> printed;
  std::set<std::string> unnamed;
  for (const RankedCandidate& ranked : result.top) {
    const StepProgram program = build_step_program(Config::load("", split_args(ranked.args)));
    const std::string text = std::to_string(program.microbatch) + " of " +
                             std::to_string(program.global_batch) + "\n" +
                             program.program.graph.to_text();
    EXPECT_TRUE(printed.insert(text).second) << ranked.args;
    EXPECT_TRUE(unnamed.insert(std::regex_replace(text, axes, "")).second) << ranked.args;
  }
}

TEST(Explorer, ResultsDoNotDependOnThreads) {
  const Config config = Config::load("", {"model_name=tiny-llama", "compile_topology=v5e-8",
                                          "max_target_length=256", "remat_policy=full"});
  ExploreOptions options;
  options.top = 5;
  options.threads = 1;
  const ExploreResult one = explore(config, options);
  options.threads = 3;
  const ExploreResult three = explore(config, options);
  ASSERT_EQ(one.top.size(), three.top.size());
  for (size_t rank = 0; rank < one.top.size(); ++rank) {
    EXPECT_EQ(one.top[rank].args, three.top[rank].args);
    EXPECT_EQ(one.top[rank].step_time_s, three.top[rank].step_time_s);
  }
  // Branch and bound skips a thread-dependent number; every other count is fixed.
  for (const char* reason : {"axis_does_not_divide", "weights_exceed_hbm", "does_not_fit_hbm"}) {
    EXPECT_EQ(one.pruned.count(reason) > 0 ? one.pruned.at(reason) : 0,
              three.pruned.count(reason) > 0 ? three.pruned.at(reason) : 0)
        << reason;
  }
  auto timed_or_bounded = [](const ExploreResult& result) {
    const auto bounded = result.pruned.find("cannot_beat_top");
    return result.candidates_evaluated + (bounded == result.pruned.end() ? 0 : bounded->second);
  };
  EXPECT_EQ(timed_or_bounded(one), timed_or_bounded(three));
}

TEST(Explorer, PinnedKeysAreNotSearched) {
  const Config config = Config::load(
      "", {"model_name=tiny-llama", "compile_topology=v5e-8", "ici_tensor_parallelism=2",
           "remat_policy=minimal", "attention=dot_product", "per_device_batch_size=2"});
  const SearchSpace space = build_search_space(config, {});
  EXPECT_EQ(space.remats.size(), 1U);
  EXPECT_EQ(space.attention_kinds, std::vector<std::string>{"dot_product"});
  EXPECT_EQ(space.batches.size(), 1U);
  for (const MeshShape& mesh : space.meshes) {
    EXPECT_EQ(mesh.size("tensor"), 2);
    EXPECT_EQ(mesh.num_devices(), 8);
  }
  // The other six axes share the remaining factor 4: C(2 + 5, 5) = 21 ordered factorizations.
  EXPECT_EQ(space.meshes.size(), 21U);
}

TEST(Explorer, CustomRematSearchesTheFreeTensorKeys) {
  const Config config =
      Config::load("", {"model_name=tiny-llama", "compile_topology=v5e-1", "remat_policy=custom",
                        "decoder_layer_input=offload", "query_proj=device", "key_proj=device",
                        "value_proj=device", "out_proj=remat", "context=remat", "mlpwi_0=remat"});
  const SearchSpace space = build_search_space(config, {});
  // tiny-llama names decoder_layer_input, query/key/value_proj, context, out_proj, mlpwi_0,
  // mlpwi_1 and mlpwo: two left free -> 3^2 policies.
  EXPECT_EQ(space.remats.size(), 9U);
  std::set<std::string> labels;
  for (const RematChoice& choice : space.remats) {
    labels.insert(choice.label());
  }
  EXPECT_EQ(labels.size(), 9U);
}

TEST(Explorer, ContradictingPinsAreUserErrors) {
  const std::vector<std::pair<std::string, ExploreLimits>> cases = {
      {"ici_tensor_parallelism=3", {}},  // does not divide 8 devices
      {"per_device_batch_size=3", {.global_batch_size = 8}},
      {"", {.min_hbm_headroom = 1.5}},
      {"mesh_placement_first=fsdb", {}},
  };
  for (const auto& [pin, limits] : cases) {
    std::vector<std::string> overrides = {"model_name=tiny-llama", "compile_topology=v5e-8"};
    if (!pin.empty()) {
      overrides.push_back(pin);
    }
    EXPECT_THROW(build_search_space(Config::load("", overrides), limits), UserError) << pin;
  }
  ExploreOptions options;
  options.objective = ExploreObjective::kTokensPerDollar;
  EXPECT_THROW(
      explore(Config::load("", {"model_name=tiny-llama", "compile_topology=v5e-1"}), options),
      UserError);
}

TEST(Explorer, EmptyFeasibleSetReportsTheSmallestFootprint) {
  const Config config = Config::load(
      "", {"model_name=llama3.1-70b", "compile_topology=v5e-4", "max_target_length=2048"});
  ExploreOptions options;
  options.limits.max_per_device_batch = 1;
  const ExploreResult result = explore(config, options);
  EXPECT_TRUE(result.top.empty());
  EXPECT_EQ(result.candidates_evaluated, 0);
  EXPECT_GT(result.smallest_peak_hbm_bytes, result.usable_hbm_bytes);
  EXPECT_GT(result.pruned.at("weights_exceed_hbm"), 0);
}

}  // namespace
}  // namespace tpusim

namespace tpusim {
namespace {

// exact_schedules changes how later pipeline schedules are searched; a search with one schedule
// (a single slice) refuses it rather than accept a flag that does nothing (it did, exit 0).
TEST(Explorer, ExactSchedulesWithOneScheduleIsBadInput) {
  const Config config = Config::load("", {"model_name=tiny-llama", "compile_topology=v5e-4"});
  ExploreOptions options;
  options.exact_schedules = true;
  try {
    explore(config, options);
    ADD_FAILURE() << "explore accepted exact_schedules with one schedule";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("--exact-schedules: this search has one pipeline"),
              std::string::npos)
        << error.what();
  }
}

// On a multislice slice explore weighs pipelining over DCN against data/FSDP there: one search
// per schedule (no pipeline; 2 stages circular or one pass, each with 2, 4 and 8 microbatches),
// merged by the objective. Each schedule's best is a real estimate of its own command line.
TEST(Explorer, RanksPipelinesOverDcnAgainstDataParallelism) {
  const Config config = Config::load(
      "", {"model_name=tiny-llama", "compile_topology=v5e-4", "compile_topology_num_slices=2",
           "max_target_length=256", "remat_policy=full", "ici_fsdp_parallelism=4",
           "attention=flash", "sa_block_q=512", "sa_block_kv=512"});
  ExploreOptions options;
  options.top = 200;  // everything that fits: each schedule's best appears in the list
  options.exact_schedules = true;
  const ExploreResult result = explore(config, options);
  std::set<std::string> schedules;
  bool pipelined_found = false;
  for (const PipelineOption& option : result.pipeline_options) {
    schedules.insert(option.schedule);
    EXPECT_TRUE(option.stages == 1 || option.stages == 2) << option.schedule;
    if (!option.found) {
      continue;
    }
    pipelined_found = pipelined_found || option.stages == 2;
    const Estimate again = estimate_config(Config::load("", [&] {
      std::vector<std::string> overrides;
      std::istringstream words(option.args);
      for (std::string word; words >> word;) {
        overrides.push_back(word);
      }
      return overrides;
    }()));
    EXPECT_DOUBLE_EQ(again.step_seconds, option.step_time_s) << option.args;
    if (option.stages == 2) {
      EXPECT_NE(option.args.find("dcn_pipeline_parallelism=2"), std::string::npos);
      EXPECT_GT(option.bubble_s, 0.0) << option.schedule;
    }
  }
  // tiny-llama's 2 layers on 2 stages: one layer per stage is both circular and one pass.
  EXPECT_EQ(
      schedules,
      (std::set<std::string>{
          "no pipeline", "2 stages x 1 layer, 1 repeat, 2 microbatches: 3 iterations, bubble 33.3%",
          "2 stages x 1 layer, 1 repeat, 4 microbatches: 5 iterations, bubble 20.0%",
          "2 stages x 1 layer, 1 repeat, 8 microbatches: 9 iterations, bubble 11.1%"}));
  EXPECT_TRUE(pipelined_found);
  ASSERT_FALSE(result.top.empty());
  for (size_t rank = 1; rank < result.top.size(); ++rank) {
    EXPECT_GE(result.top[rank - 1].objective, result.top[rank].objective);
  }
  EXPECT_NE(std::find(result.space.searched_keys.begin(), result.space.searched_keys.end(),
                      "dcn_pipeline_parallelism"),
            result.space.searched_keys.end());
  int64_t in_schedules = 0;
  for (const PipelineOption& option : result.pipeline_options) {
    in_schedules += option.candidates;
  }
  EXPECT_EQ(result.candidates_in_space, in_schedules);
}

// Without exact_schedules the later schedules are searched only for what can enter the top N
// found before them (and skipped whole when their bubble alone keeps them out): the top N is the
// exact search's, and a schedule reported as bounded out is one whose exact best is below the
// bar it was given. A compute-bound 4-layer llama2-7b over 2 slices: without a pipeline it wins.
// The schedules' bound takes the MXU rate of the config's matmuls: bf16, or int8 under AQT int8
// (v5e's int8 MXU rate is twice bf16); the top N is exact in both.
TEST(Explorer, LaterPipelineSchedulesSearchedFromTheTopSoFarKeepTheTopN) {
  for (const std::string quantization : {"", "int8"}) {
    const Config config = Config::load(
        "", {"model_name=llama2-7b", "override_model_config=true", "base_num_decoder_layers=4",
             "compile_topology=v5e-4", "compile_topology_num_slices=2", "max_target_length=2048",
             "ici_fsdp_parallelism=4", "quantization=" + quantization});
    for (const int top : {1, 3}) {
      SCOPED_TRACE("quantization=" + quantization + " top " + std::to_string(top));
      ExploreOptions options;
      options.top = top;
      options.exact_schedules = true;
      const ExploreResult exact = explore(config, options);
      options.exact_schedules = false;
      const ExploreResult bounded = explore(config, options);
      ASSERT_EQ(exact.top.size(), bounded.top.size());
      for (size_t rank = 0; rank < exact.top.size(); ++rank) {
        EXPECT_EQ(exact.top[rank].args, bounded.top[rank].args);
        EXPECT_EQ(exact.top[rank].objective, bounded.top[rank].objective);
      }
      ASSERT_EQ(exact.pipeline_options.size(), bounded.pipeline_options.size());
      int bounded_out = 0;
      int skipped_whole = 0;  // by the bubble's bound, before any program of the schedule is built
      for (size_t index = 0; index < exact.pipeline_options.size(); ++index) {
        const PipelineOption& mine = bounded.pipeline_options[index];
        const PipelineOption& truth = exact.pipeline_options[index];
        EXPECT_EQ(mine.schedule, truth.schedule);
        EXPECT_FALSE(truth.bounded_out);
        EXPECT_GT(truth.programs_built, 0) << truth.schedule;
        if (mine.bounded_out) {
          ++bounded_out;
          skipped_whole += mine.programs_built == 0 ? 1 : 0;
          EXPECT_FALSE(mine.found);
          if (truth.found) {
            EXPECT_LT(truth.objective, mine.bar) << truth.schedule;
          }
        } else {
          EXPECT_EQ(mine.found, truth.found) << truth.schedule;
          if (truth.found) {
            EXPECT_EQ(mine.objective, truth.objective) << truth.schedule;
          }
        }
      }
      EXPECT_GT(bounded_out, 0);
      if (quantization.empty()) {
        // Under int8 the bound, which charges every matmul at the int8 rate, is too loose here.
        EXPECT_GT(skipped_whole, 0);
      }
      EXPECT_LT(bounded.candidates_evaluated, exact.candidates_evaluated);
    }
  }
}

}  // namespace
}  // namespace tpusim
