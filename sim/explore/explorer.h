// sim/explore/explorer.h: searches a SearchSpace and ranks the candidates that fit.
//
// Every candidate of the space is either evaluated (per-device program built, memory estimated,
// step timed by the performance engine, exactly as `tpusim estimate` would) or pruned for a
// reason, and the counts add up to the space's size:
//   - axis_does_not_divide: a mesh axis splits a parameter dim or the batch/sequence of the input
//     unevenly (JAX requires jit arguments to divide evenly), checked before any program is built
//     (sharding/divisibility.h: estimate and train refuse the same splits);
//   - same_placement: a placement choice (mesh_placement_first) that lays the mesh's axes onto
//     exactly the physical portions an earlier choice does, or names an axis of size 1 there;
//   - weights_exceed_hbm: the mesh's weights and optimizer state alone exceed HBM (the memory
//     floor's state, sim/explore/memory_floor.h: the memory model's exactly, from the step and
//     the mesh without a program; they do not depend on batch or remat);
//   - does_not_fit_hbm: peak HBM of the program over the usable HBM (less the headroom limit),
//     or, before the program is built, its memory floor (state plus the activations the remat
//     policy saves, at most the peak) already over it; batches are tried in increasing size and
//     memory grows with the batch, so once a batch does not fit, the larger ones of the same mesh
//     and remat are pruned unbuilt (all of them once no policy fits);
//   - cannot_beat_top (branch and bound, sim/explore/step_bounds.h): the TensorCore runs compute
//     ops one at a time, so the sum of their costs bounds a program's step time from below
//     whatever the collectives and perf switches do. Per (mesh, batch), the remat_policy=none
//     program bounds every policy (skip the batch), and with a policy's recomputation added it
//     bounds that policy before its program is built (so this count may include candidates that
//     would not have fit); a built program's bound per attention cost context skips its timing
//     variants. A candidate is skipped only when its best possible objective is below the N-th
//     best found so far, so the top N never changes; how many are skipped depends on how early
//     the threads find good ones.
// Work is reused, not cut: one training step per (batch, remat) is shared by all meshes, one
// partitioned program and memory estimate per (mesh, batch, remat) is shared by its timing
// variants (attention kind, flash blocks, SparseCore offload, collective matmul: the attention
// kind changes the kernel's cost, not the program), and those are timed without trace or
// breakdown. Meshes are spread over threads, those of one equivalence key (mesh_equivalence.h) in
// a row on one thread past the first 5% of the space's order, so that the programs built for the
// first bound the others unbuilt (MeshEvaluator::evaluate_group); the top N (ties broken by the
// order of the space, so results do not depend on threads or this grouping) get a full estimate.
// The top N are N different per-device programs (sim/explore/program_signature.h): of the
// candidates that run one program (timing switches and placements, or the same program spelled with
// other mesh axes) the best is listed, with the other spellings it timed
// (RankedCandidate::same_program). Where the time went is in ExploreResult::phases. The parts, one
// file each: the space (search_space.h), a candidate and its keys (candidate.h), the objective
// (objective.h), the shared training steps (training_step_cache.h), the divisibility rule
// (divisibility.h), one mesh's evaluation (mesh_evaluator.h), what the workers and ranks found
// (worker_result.h), the bounds (step_bounds.h) and pipeline schedules (pipeline_schedules.h); this
// file runs them and merges the schedules.
//
// Example:
//   Config config = Config::load("", {"model_name=llama2-7b", "compile_topology=v5p-32"});
//   ExploreResult result = explore(config, {.top = 5});
//   result.top[0].args;  // "ici_data_parallelism=1 ici_fsdp_parallelism=16 ... remat_policy=..."
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/explore/candidate.h"
#include "sim/explore/objective.h"
#include "sim/explore/search_space.h"
#include "sim/perf/timing_labels.h"

namespace tpusim {

class Config;
class ProcessGroup;

struct ExploreOptions {
  ExploreLimits limits;
  ExploreObjective objective = ExploreObjective::kTokensPerSecondPerChip;
  int top = 10;
  int threads = 0;  // 0 = all cores
  // false: time every candidate that fits (cannot_beat_top stays 0); the top N is the same.
  bool branch_and_bound = true;
  // Multislice only: search every pipeline schedule without a bar from the others, so that each
  // schedule's own best is exact (PipelineOption). false: each later schedule starts from the top
  // N found so far and skips what cannot enter it; the top N is the same, and a schedule none of
  // whose candidates reaches it is reported as bounded out.
  bool exact_schedules = false;
  // Under mpirun: the process-level exchanges; each rank searches every num_ranks()-th mesh and
  // the ranks' results are merged (every rank gets the merged result). nullptr = one process.
  ProcessGroup* processes = nullptr;
  // Called now and then from one thread with (meshes done, meshes in all).
  std::function<void(int64_t, int64_t)> progress;
  // Keep up to this many samples of what was evaluated (a uniform sample per worker thread, for
  // explore's HTML scatter); 0 keeps none. Under mpirun only this rank's samples are kept.
  size_t max_samples = 0;
  // A bar from outside the search (tpusim plan's incumbent on another slice), in the objective's
  // units (tokens_per_dollar: tokens/s/chip, the order it ranks by): candidates that cannot exceed
  // it are skipped as if it were the N-th best already found, so the result may list fewer than
  // `top` (none when nothing beats it), and a listed one below it is not the slice's best.
  double initial_bar = -std::numeric_limits<double>::infinity();
  // --objective tokens_per_dollar: what one chip-hour of the slice costs (--prices). One price per
  // slice ranks like tokens/s/chip; the objectives listed are tokens per unit of currency.
  double price_per_chip_hour = 0;
  // Tests: build every program even where an equivalent mesh's (mesh_equivalence.h) memory and
  // compute bounds, or a batch's region classes (batch_classes.h), would skip it, and check that
  // they agree bit for bit with the built program's (std::logic_error else).
  bool check_equivalent_meshes = false;
  // Bound a batch's remat_policy=none program from the region classes of programs already built
  // (batch_classes.h, class_bounds.h: other batches, equivalent meshes, other pipeline schedules)
  // instead of partitioning it. Tests turn it off to compare.
  bool batch_classes = true;
  // Bound a batch's remat_policy=none program by re-sizing one built for a mesh with the same axes
  // larger than 1 (resizable_programs.h) instead of partitioning it. Tests turn it off to compare.
  bool resized_programs = true;
};

// One evaluated candidate, for plots: timed (it fits) or built and found not to fit (no time).
struct ExploreSample {
  double step_seconds = 0;  // 0 when it does not fit (not timed)
  double tokens_per_s_per_chip = 0;
  double peak_bytes = 0;
  bool fits = false;
};

// A candidate whose peak takes more than this share of usable HBM is flagged in explore's text,
// JSON and page (--min-hbm-headroom excludes such candidates when the user asks for a margin).
inline constexpr double kTightHbmFraction = 0.95;

struct RankedCandidate {
  Candidate candidate;
  std::string args;                            // tpusim overrides that reproduce it
  std::vector<std::string> maxtext_overrides;  // the keys MaxText itself understands
  std::string libtpu_init_args;                // the flags that give a real run tpusim's switches
  double step_time_s = 0;
  double mfu = 0;
  double tokens_per_s_per_chip = 0;
  double hbm_peak_bytes_per_device = 0;
  double hbm_capacity_bytes = 0;
  bool fits = false;
  double objective = 0;  // larger is better (step time: its negative)
  // Other candidates found to run the same per-device program (program_signature.h), each as the
  // overrides in which it differs from this one ("ici_fsdp_parallelism=8 ici_expert_...=2").
  std::vector<std::string> same_program;
  // The share of usable HBM the candidate's peak takes; above kTightHbmFraction it fits with
  // little margin for what the memory model does not count (fragmentation, XLA's scratch).
  double hbm_used_fraction() const {
    return hbm_capacity_bytes > 0 ? hbm_peak_bytes_per_device / hbm_capacity_bytes : 0.0;
  }
  nlohmann::json estimate;  // the full `tpusim estimate --json` of the candidate
  Breakdown breakdown;      // its step breakdown, typed (the JSON's "breakdown" renders it)
};

// One pipeline schedule the explorer searched (its best candidate, if any fits): how a
// multislice run compares pipelining over DCN with data/FSDP parallelism there.
struct PipelineOption {
  int64_t stages = 1;            // 1: no pipeline
  int64_t microbatches = 0;      // num_pipeline_microbatches (stages > 1)
  int64_t layers_per_stage = 0;  // num_layers_per_pipeline_stage (stages > 1)
  std::string schedule;          // PipelineSchedule::describe() of the best, or "no pipeline"
  int64_t candidates = 0;        // in this schedule's space
  int64_t evaluated = 0;         // of them, timed (0 when the schedule was bounded out whole)
  int64_t programs_built = 0;    // partitioned for this schedule's search
  double elapsed_s = 0;          // this schedule's search
  bool found = false;            // something fits (and, unless bounded_out, its best is exact)
  // Searched from the top N of the schedules before it (ExploreOptions::exact_schedules false),
  // no candidate of this schedule could reach it: its best objective is below `bar`.
  bool bounded_out = false;
  double bar = 0;
  double step_time_s = 0;
  double objective = 0;
  double bubble_s = 0;              // the best candidate's pipeline_bubble
  double stage_transfers_s = 0;     // its exposed stage hand-overs (collectives over "stage")
  double gradient_reduction_s = 0;  // its exposed cross-slice gradient reduction
  std::string args;                 // its overrides
};

// Where a search's time went, summed over worker threads (and ranks): CPU-side seconds of each
// phase, so with T threads they add up to about T x elapsed_s (less the setup and the final full
// estimates of the top N).
struct ExplorePhases {
  double partition_s = 0;            // partitioning per-device programs
  double memory_s = 0;               // memory estimates (fit)
  double bounds_s = 0;               // TensorCore and collective lower bounds
  double simulate_s = 0;             // timing candidates (StepSimulator set-up and runs)
  double signature_s = 0;            // program signatures of candidates that enter a top N
  int64_t bound_programs = 0;        // remat_policy=none programs built to bound a batch
  int64_t bounded_out_programs = 0;  // of them, those whose bound skipped the whole batch
  int64_t unfit_programs = 0;        // programs built whose every attention kind exceeds HBM
  int64_t timed_programs = 0;        // programs of which at least one candidate was timed
  // (mesh, batch, remat) programs not built: their memory floor (memory_floor.h) exceeds HBM.
  int64_t floor_skipped_programs = 0;
  // Variants not timed because their bound cannot reach a variant of the same program (mesh,
  // batch, remat) timed before them (counted in cannot_beat_top too).
  int64_t below_own_program = 0;
  // Programs not built: the same program on an equivalent mesh (mesh_equivalence.h) showed that it
  // does not fit or cannot beat the top N.
  int64_t equivalent_mesh_skips = 0;
  // Variants not timed because their dependency-chain bound (StepSimulator::chain_bound) cannot
  // beat the top N (counted in cannot_beat_top too).
  int64_t chain_bounded = 0;
  // remat_policy=none programs not built to bound a batch: the one an equivalent mesh built just
  // before (meshes are searched by equivalence key) bounds it on this mesh's layout
  // (MeshEquivalence::relabeled).
  int64_t borrowed_programs = 0;
  // remat_policy=none programs not built to bound a batch: a program of the same class on this
  // mesh or an equivalent one, at another batch or under another pipeline schedule
  // (batch_classes.h: the same compute per region pass), gave its TensorCore bound, which alone
  // cannot beat the top N.
  int64_t batch_class_skips = 0;
  // Of those, the batches whose class's bound came from another pipeline schedule's program.
  int64_t schedule_class_skips = 0;
  // remat_policy=none programs not built to bound a batch: a program built for a mesh with the
  // same axes larger than 1, re-sized for this one (resizable_programs.h), gave its TensorCore
  // bound, which alone cannot beat the top N.
  int64_t resized_program_skips = 0;
  // Programs not partitioned: a program kept from a mesh with the same axes larger than 1 and the
  // same size choices, re-sized for this mesh, is its own (copied instead; not in programs_built).
  int64_t resized_programs = 0;

  void add(const ExplorePhases& other);
  std::vector<double> as_numbers() const;  // for merge_ranks
  static ExplorePhases from_numbers(const std::vector<double>& numbers);
  nlohmann::json to_json() const;
};

struct ExploreResult {
  SearchSpace space;  // the first schedule's (no pipeline unless the stage axis is pinned)
  int64_t candidates_in_space = 0;               // over every pipeline schedule searched
  std::vector<PipelineOption> pipeline_options;  // more than one when pipelines are searched
  int64_t candidates_evaluated = 0;
  std::map<std::string, int64_t> pruned;  // reason -> candidates
  int64_t programs_built = 0;
  ExplorePhases phases;
  double elapsed_s = 0;
  int threads = 1;  // per rank
  int ranks = 1;
  ExploreObjective objective = ExploreObjective::kTokensPerSecondPerChip;
  std::vector<RankedCandidate> top;  // best first
  // Over the programs considered (why nothing fits): the least peak of those built, or the memory
  // floor (memory_floor.h, at most the peak) of those whose floor alone exceeded HBM.
  double smallest_peak_hbm_bytes = 0;
  double usable_hbm_bytes = 0;
  std::vector<ExploreSample> samples;  // with ExploreOptions::max_samples
  int64_t samples_seen = 0;            // candidates the samples were drawn from
  // The rank (from 1) of the first row above top[index] that scores the same to 9 digits
  // (tie_key): a different program that times the same (fsdp vs fsdp_transpose splits of one
  // size, say); 0 when there is none.
  int same_score_as(size_t index) const;
  nlohmann::json to_json() const;
};

// Searches the space of build_search_space, once per pipeline schedule: on a multislice slice
// (or with a stage axis pinned) the stage counts over DCN that divide the slices, each with
// MaxText's circular layout (num_layers_per_pipeline_stage=1) and one pass (layers / stages),
// and num_pipeline_microbatches of 1, 2 and 4 x stages, unless the user pinned them; the rankings
// merge by the objective. No pipeline is searched first; each later schedule starts its branch
// and bound from the top N found so far (19 schedules of a 512-chip v4 run over 8 slices: 5 min
// when each starts from nothing), so a schedule that cannot reach the top N is reported as
// bounded out, not with its own best. ExploreOptions::exact_schedules searches each on its own,
// for a table that compares every schedule's exact best.
ExploreResult explore(const Config& config, const ExploreOptions& options);

}  // namespace tpusim
