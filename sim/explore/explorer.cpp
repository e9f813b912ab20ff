#include "sim/explore/explorer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "hw/chip_spec.h"
#include "model/config.h"
#include "model/flops_maxtext.h"
#include "sharding/divisibility.h"
#include "sharding/logical_rules.h"
#include "sim/estimate/estimate.h"
#include "sim/explore/batch_classes.h"
#include "sim/explore/candidate.h"
#include "sim/explore/class_bounds.h"
#include "sim/explore/mesh_equivalence.h"
#include "sim/explore/mesh_evaluator.h"
#include "sim/explore/pipeline_schedules.h"
#include "sim/explore/resizable_programs.h"
#include "sim/explore/training_step_cache.h"
#include "sim/explore/worker_result.h"
#include "sim/perf/step_simulator.h"
#include "sim/perf/xla_switch_flags.h"
#include "sim/transport/process_group.h"

namespace tpusim {
namespace {

std::vector<std::string> maxtext_keys(const std::vector<std::string>& overrides) {
  // tpusim-only switches (XLA flags or a custom device order on a real TPU, not MaxText keys).
  std::vector<std::string> keys;
  for (const std::string& item : overrides) {
    if (item.rfind("sparse_core_collective_offload=", 0) != 0 &&
        item.rfind("collective_matmul=", 0) != 0 && item.rfind("mesh_placement_first=", 0) != 0) {
      keys.push_back(item);
    }
  }
  return keys;
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) {
    text += (text.empty() ? "" : " ") + item;
  }
  return text;
}

// Thins `samples` to at most `most` (0: no limit) by a fixed stride, keeping their order.
void thin_samples(std::vector<ExploreSample>& samples, size_t most) {
  if (most == 0 || samples.size() <= most) {
    return;
  }
  std::vector<ExploreSample> thinned;
  thinned.reserve(most);
  for (size_t index = 0; index < most; ++index) {
    thinned.push_back(samples[index * samples.size() / most]);
  }
  samples = std::move(thinned);
}

void check_options(const ExploreOptions& options) {
  if (options.objective == ExploreObjective::kTokensPerDollar &&
      !(options.price_per_chip_hour > 0 && std::isfinite(options.price_per_chip_hour))) {
    throw UserError(
        "--objective tokens_per_dollar: needs --prices FILE with a price for this hardware (the "
        "hardware catalog has no prices; configs/prices.example.yml shows the format)");
  }
  // Each listed candidate is estimated again in full for its breakdown (~1.5 ms): --top 65536
  // ran for minutes (found by the command-line fuzz). A ranking longer than this is not read.
  constexpr int kMaxTop = 1000;
  if (options.top < 1 || options.top > kMaxTop) {
    throw UserError("--top: " + std::to_string(options.top) + " must be from 1 to " +
                    std::to_string(kMaxTop));
  }
}

// MaxText's FLOPs per device of each batch of the space (MFU, and the pipeline schedules' bound).
std::vector<MaxTextFlops> maxtext_flops_per_batch(const Config& config, const SearchSpace& space) {
  std::vector<MaxTextFlops> flops;
  flops.reserve(space.batches.size());
  for (const BatchChoice& batch : space.batches) {
    Candidate candidate;
    candidate.batch = batch;
    candidate.attention = space.attention_kinds[0];
    flops.push_back(maxtext_training_flops_per_device(candidate_config(config, space, candidate)));
  }
  return flops;
}

// Joins the schedule's batches to the batch classes (batch_classes.h) where the explorer bounds
// batches by the remat_policy=none program (branch and bound over several policies), else joins
// none (no keys): that needs every batch's none step, built here once. Returns the schedule's
// number in `classes`.
size_t join_batch_classes(const ExploreOptions& options, const SearchSpace& space,
                          TrainingStepCache& steps, const MeshEquivalence& equivalence,
                          const LogicalAxisRules& rules, BatchClasses& classes) {
  std::vector<std::shared_ptr<const TrainingStep>> none_steps;
  if (options.batch_classes && options.branch_and_bound && space.remats.size() >= 2 &&
      space.batches.size() >= 2) {
    for (size_t batch = 0; batch < space.batches.size(); ++batch) {
      none_steps.push_back(steps.get(batch, TrainingStepCache::kNoRemat));
    }
  }
  return classes.add_schedule(none_steps, equivalence.atoms(), rules);
}

// Evaluates this rank's meshes (every ranks-th) on `threads` worker threads; the workers'
// results merged.
WorkerResult search_meshes(const ExploreContext& context, int threads, int rank, int ranks,
                           size_t my_meshes) {
  const ExploreOptions& options = context.options;
  std::vector<WorkerResult> workers(static_cast<size_t>(threads));
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  // Meshes of one equivalence key (the same per-device programs) one after the other on one
  // thread, at the place of the first of them: the remat_policy=none programs built for it bound
  // the others (MeshEvaluator::evaluate_group). Not the first kFrontShare of the space's order,
  // searched one by one: there the top N's bar is still low, and meshes pulled forward to join
  // their group would be timed at it (searching every mesh grouped timed 6,258 candidates on the
  // v5p-1024 search instead of 3,424; with the front alone 3,634).
  constexpr double kFrontShare = 0.05;
  const auto front = static_cast<size_t>(kFrontShare * static_cast<double>(my_meshes));
  std::vector<std::vector<size_t>> groups;
  {
    std::map<std::vector<int64_t>, size_t> group_of_key;
    for (size_t slot = 0; slot < my_meshes; ++slot) {
      const size_t mesh = slot * static_cast<size_t>(ranks) + static_cast<size_t>(rank);
      if (slot < front) {
        groups.push_back({mesh});
        continue;
      }
      const auto [found, added] = group_of_key.try_emplace(
          context.equivalence.key(context.space.meshes[mesh]), groups.size());
      if (added) {
        groups.emplace_back();
      }
      groups[found->second].push_back(mesh);
    }
  }
  auto work = [&](int thread) {
    MeshEvaluator evaluator(context);
    auto last_report = std::chrono::steady_clock::now();
    try {
      for (size_t group = next++; group < groups.size(); group = next++) {
        evaluator.evaluate_group(groups[group], workers[static_cast<size_t>(thread)]);
        done += groups[group].size();
        if (thread == 0 && options.progress) {
          const auto now = std::chrono::steady_clock::now();
          if (now - last_report > std::chrono::milliseconds(200)) {
            last_report = now;
            options.progress(static_cast<int64_t>(done.load()), static_cast<int64_t>(my_meshes));
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      failure = std::current_exception();
      next = groups.size();
    }
  };
  std::vector<std::thread> pool;
  for (int thread = 1; thread < threads; ++thread) {
    pool.emplace_back(work, thread);
  }
  work(0);
  for (std::thread& thread : pool) {
    thread.join();
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
  if (options.progress) {
    options.progress(static_cast<int64_t>(my_meshes), static_cast<int64_t>(my_meshes));
  }
  WorkerResult merged;
  for (WorkerResult& worker : workers) {
    merged.merge(std::move(worker), static_cast<size_t>(options.top));
  }
  return merged;
}

// The overrides in which `other` differs from `kept` (its spelling of the same program).
std::string differing_overrides(const std::vector<std::string>& kept,
                                const std::vector<std::string>& other) {
  std::vector<std::string> differing;
  for (const std::string& item : other) {
    if (std::find(kept.begin(), kept.end(), item) == kept.end()) {
      differing.push_back(item);
    }
  }
  return join(differing);
}

// A winner, estimated in full through the same path as `tpusim estimate`, with the command line
// that reproduces it (the user's overrides the candidate does not replace, then its keys).
RankedCandidate rank_winner(const Config& config, const SearchSpace& space, const Scored& scored) {
  const std::vector<std::string> overrides = candidate_overrides(space, scored.candidate);
  std::vector<std::string> args;
  for (const std::string& item : config.command_line_overrides()) {
    const std::string key = split_override(item).first;
    const bool replaced = std::any_of(overrides.begin(), overrides.end(), [&](const auto& o) {
      return split_override(o).first == key;
    });
    if (!replaced) {
      args.push_back(item);
    }
  }
  args.insert(args.end(), overrides.begin(), overrides.end());
  Config full = config;
  apply_candidate(full, space, scored.candidate, CandidateKeys::kWithMesh);
  const Estimate estimate = estimate_config(full);
  RankedCandidate ranked;
  ranked.candidate = scored.candidate;
  ranked.args = join(args);
  ranked.maxtext_overrides = maxtext_keys(args);
  const PerfOptions perf = perf_options_from_config(full, *space.slice.chip);
  ranked.libtpu_init_args =
      join(libtpu_flags_for(perf.sparse_core_offload, perf.collective_matmul, *space.slice.chip));
  ranked.step_time_s = estimate.step_seconds;
  ranked.mfu = estimate.mfu;
  ranked.tokens_per_s_per_chip = estimate.tokens_per_s_per_chip;
  ranked.hbm_peak_bytes_per_device = estimate.memory.peak_bytes;
  ranked.hbm_capacity_bytes = estimate.memory.capacity_bytes;
  ranked.fits = estimate.memory.fits;
  ranked.objective = scored.objective;
  for (const Candidate& spelling : scored.spellings) {
    ranked.same_program.push_back(
        differing_overrides(overrides, candidate_overrides(space, spelling)));
  }
  ranked.estimate = estimate.json;
  ranked.breakdown = estimate.timing.breakdown;
  return ranked;
}

// True when no candidate of a pipelined schedule can reach `bar`, decided before any program is
// built: a candidate computes at least MaxText's matmul FLOPs of its batch, spread evenly over the
// devices, at the fastest MXU rate its matmuls run at (tensorcore_lower_bounds charges none less),
// and the decoder layers' share of them runs `stretch` times (the loop's iterations over those that
// carry a microbatch: the bubble's iterations compute like the others). Models with experts are
// left to the per-program bounds, as a capacity factor below 1 computes fewer FLOPs than MaxText
// counts.
bool schedule_cannot_reach(const ExploreSettings& settings, const SearchSpace& space,
                           const ExploreOptions& options, const PerfOptions& perf,
                           const std::vector<MaxTextFlops>& flops_per_batch, double stretch,
                           double bar) {
  if (!std::isfinite(bar) || stretch <= 1 || settings.num_experts > 1) {
    return false;
  }
  const ChipSpec& chip = *space.slice.chip;
  // The fastest rate a matmul of this config runs at: its quantization's narrow type if it has
  // one (the search does not change quantization), else bf16.
  const double flops_per_second = peak_flops_per_device(perf.cost, true) *
                                  chip.mxu_achievable_fraction * perf.cost.program_efficiency;
  const double tokens_per_sequence = static_cast<double>(settings.max_target_length);
  for (size_t index = 0; index < space.batches.size(); ++index) {
    const BatchChoice& batch = space.batches[index];
    const MaxTextFlops& flops = flops_per_batch[index];
    const double outside_layers_tflops =
        3.0 * static_cast<double>(flops.gradient_accumulation_steps) * flops.forward.unembed / 1e12;
    const double layers_tflops = flops.total_tflops() - outside_layers_tflops;
    const double step_lower_bound =
        (outside_layers_tflops + stretch * layers_tflops) * 1e12 / flops_per_second;
    const double tokens =
        static_cast<double>(batch.microbatch * batch.accumulation_steps) * tokens_per_sequence;
    if (!cannot_reach(objective_upper_bound(
                          options.objective, step_lower_bound, flops.total_tflops(),
                          chip.mfu_peak_bf16_tflops_per_device, tokens, space.slice.total_chips()),
                      bar)) {
      return false;
    }
  }
  return true;
}

// What the pipeline schedules of one explore share: the batch classes of every schedule searched
// and the TensorCore seconds of their programs by class (class_bounds.h).
struct SharedClasses {
  BatchClasses classes;
  ClassBounds bounds;
};

// One schedule's search; `bar` (the objective of the N-th best found before it, -infinity for
// none) starts its branch and bound, and `stretch` is the schedule's iterations over the
// iterations that carry a microbatch (1 without a pipeline).
ExploreResult explore_one_schedule(const Config& config, const ExploreOptions& options,
                                   SharedClasses& shared,
                                   double bar = -std::numeric_limits<double>::infinity(),
                                   double stretch = 1) {
  const auto started = std::chrono::steady_clock::now();
  check_options(options);
  ExploreResult result;
  result.objective = options.objective;
  result.space = build_search_space(config, options.limits);
  const SearchSpace& space = result.space;
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  TrainingStepCache steps(config, space);
  const std::vector<MaxTextFlops> flops_per_batch = maxtext_flops_per_batch(config, space);
  const PerfOptions base_perf = perf_options_from_config(config, *space.slice.chip);
  const ExploreSettings settings = ExploreSettings::from_config(config);

  const int rank = options.processes != nullptr ? options.processes->rank() : 0;
  const int ranks = options.processes != nullptr ? options.processes->num_ranks() : 1;
  result.ranks = ranks;
  // This rank's meshes: every ranks-th, so that each rank gets a share of the costly ones.
  const size_t my_meshes =
      (space.meshes.size() + static_cast<size_t>(ranks - 1 - rank)) / static_cast<size_t>(ranks);
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  const int threads =
      std::max(1, std::min<int>(options.threads > 0 ? options.threads : static_cast<int>(cores),
                                static_cast<int>(std::max<size_t>(1, my_meshes))));
  result.threads = threads;
  SharedThreshold threshold(options.branch_and_bound);
  threshold.raise(bar);
  if (options.branch_and_bound &&
      schedule_cannot_reach(settings, space, options, base_perf, flops_per_batch, stretch, bar)) {
    result.pruned[kPrunedCannotBeatTop] = space.size();
    result.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    result.candidates_in_space = space.size();
    return result;
  }
  const Divisibility divisibility(*steps.get(0, 0), rules);
  // The tensors' dims name the sets of axes the rules give: the batch changes their sizes and a
  // remat policy which are saved or recomputed (clones keep their dims), not their names.
  const std::shared_ptr<const TrainingStep> none_step = steps.get(0, TrainingStepCache::kNoRemat);
  const std::shared_ptr<const TrainingStep> first_step = steps.get(0, 0);
  const MeshEquivalence equivalence({none_step.get(), first_step.get()}, rules);
  SharedProgramFacts facts(options.check_equivalent_meshes);
  ResizablePrograms resizable;
  const size_t schedule =
      join_batch_classes(options, space, steps, equivalence, rules, shared.classes);
  const ExploreContext context{config,         settings,     space,           options,
                               rules,          steps,        flops_per_batch, base_perf,
                               threshold,      divisibility, equivalence,     facts,
                               shared.classes, schedule,     shared.bounds,   resizable};
  WorkerResult merged = search_meshes(context, threads, rank, ranks, my_meshes);
  if (ranks > 1) {
    std::vector<ExploreSample> samples = std::move(merged.samples);
    const int64_t seen = merged.samples_seen;
    merged = merge_ranks(merged, *options.processes, CandidateNumbering(space),
                         static_cast<size_t>(options.top));
    merged.samples = std::move(samples);  // this rank's only
    merged.samples_seen = seen;
  }
  // Each worker kept up to max_samples; thin the union to max_samples by a fixed stride.
  thin_samples(merged.samples, options.max_samples);
  result.samples = std::move(merged.samples);
  result.samples_seen = merged.samples_seen;
  result.candidates_evaluated = merged.evaluated;
  result.programs_built = merged.programs;
  result.phases = merged.phases;
  result.pruned = merged.pruned;
  result.smallest_peak_hbm_bytes = std::isfinite(merged.smallest_peak) ? merged.smallest_peak : 0;
  result.usable_hbm_bytes = merged.capacity;
  for (const Scored& scored : merged.top) {
    result.top.push_back(rank_winner(config, space, scored));
  }
  result.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  result.candidates_in_space = space.size();
  return result;
}

// Adds one pipeline schedule's search to the merged result (its top to `everything`).
void add_schedule(ExploreResult& merged, const ExploreResult& part,
                  std::vector<RankedCandidate>& everything) {
  if (merged.pipeline_options.size() == 1) {
    merged.space = part.space;
    merged.objective = part.objective;
    merged.threads = part.threads;
    merged.ranks = part.ranks;
  }
  merged.candidates_in_space += part.candidates_in_space;
  merged.candidates_evaluated += part.candidates_evaluated;
  merged.programs_built += part.programs_built;
  merged.phases.add(part.phases);
  for (const auto& [reason, count] : part.pruned) {
    merged.pruned[reason] += count;
  }
  merged.smallest_peak_hbm_bytes =
      merged.pipeline_options.size() == 1 || part.smallest_peak_hbm_bytes == 0
          ? std::max(merged.smallest_peak_hbm_bytes, part.smallest_peak_hbm_bytes)
          : std::min(merged.smallest_peak_hbm_bytes, part.smallest_peak_hbm_bytes);
  merged.usable_hbm_bytes = std::max(merged.usable_hbm_bytes, part.usable_hbm_bytes);
  merged.samples.insert(merged.samples.end(), part.samples.begin(), part.samples.end());
  merged.samples_seen += part.samples_seen;
  everything.insert(everything.end(), part.top.begin(), part.top.end());
}

void sort_best_first(std::vector<RankedCandidate>& ranked) {
  std::stable_sort(
      ranked.begin(), ranked.end(),
      [](const RankedCandidate& a, const RankedCandidate& b) { return a.objective > b.objective; });
}

// The objective a later schedule must reach to enter the top N found so far (-infinity while
// fewer than N are found, or for exact schedules).
double top_bar(std::vector<RankedCandidate>& everything, const ExploreOptions& options) {
  sort_best_first(everything);
  if (options.exact_schedules || everything.size() < static_cast<size_t>(options.top)) {
    return -std::numeric_limits<double>::infinity();
  }
  return everything[static_cast<size_t>(options.top) - 1].objective;
}

// A schedule searched from `bar` whose best could not reach it: its own best is unknown (below
// the bar), so it is reported as bounded out rather than with a candidate that merely got timed.
void mark_bounded_out(PipelineOption& option, const ExploreResult& part, double bar) {
  if (!std::isfinite(bar)) {
    return;
  }
  const auto pruned = part.pruned.find(kPrunedCannotBeatTop);
  const bool bounded = pruned != part.pruned.end() && pruned->second > 0;
  if ((option.found && cannot_reach(option.objective, bar)) || (!option.found && bounded)) {
    option.found = false;
    option.bounded_out = true;
    option.bar = bar;
  }
}

nlohmann::json pipeline_option_json(const PipelineOption& option) {
  nlohmann::json item = {{"stages", option.stages},
                         {"schedule", option.schedule},
                         {"candidates", option.candidates},
                         {"candidates_evaluated", option.evaluated},
                         {"programs_built", option.programs_built},
                         {"elapsed_s", option.elapsed_s},
                         {"fits", option.found}};
  if (option.bounded_out) {
    item["bounded_out"] = true;
    item["objective_below"] = option.bar;
  }
  if (option.stages > 1) {
    item["num_pipeline_microbatches"] = option.microbatches;
    item["num_layers_per_pipeline_stage"] = option.layers_per_stage;
  }
  if (option.found) {
    item["best_step_time_s"] = option.step_time_s;
    item["best_objective"] = option.objective;
    item["pipeline_bubble_s"] = option.bubble_s;
    item["exposed_stage_transfers_s"] = option.stage_transfers_s;
    item["exposed_dcn_gradient_reduction_s"] = option.gradient_reduction_s;
    item["args"] = option.args;
  }
  return item;
}

nlohmann::json ranked_json(const RankedCandidate& ranked) {
  nlohmann::json item;
  item["args"] = ranked.args;
  item["maxtext_overrides"] = join(ranked.maxtext_overrides);
  item["libtpu_init_args"] = ranked.libtpu_init_args;
  item["step_time_s"] = ranked.step_time_s;
  item["mfu"] = ranked.mfu;
  item["tokens_per_s_per_chip"] = ranked.tokens_per_s_per_chip;
  item["hbm_peak_bytes_per_device"] = ranked.hbm_peak_bytes_per_device;
  item["hbm_capacity_bytes"] = ranked.hbm_capacity_bytes;
  item["hbm_headroom_bytes"] = ranked.hbm_capacity_bytes - ranked.hbm_peak_bytes_per_device;
  item["hbm_used_fraction"] = ranked.hbm_used_fraction();
  item["hbm_tight"] = ranked.hbm_used_fraction() > kTightHbmFraction;
  item["fits"] = ranked.fits;
  item["same_program_as"] = ranked.same_program;
  item["mesh"] = ranked.estimate["mesh"];
  item["mesh_placement"] = ranked.estimate["mesh_placement"];
  item["breakdown"] = ranked.estimate["breakdown"];
  item["estimate_command"] = "tpusim estimate " + ranked.args;
  return item;
}

}  // namespace

namespace {

// Every field of ExplorePhases once, with its JSON name: add, the numbers ranks exchange and the
// JSON all follow this table (seconds first, then counts, in this order).
struct PhaseSeconds {
  const char* name;
  double ExplorePhases::*member;
};
struct PhaseCount {
  const char* name;
  int64_t ExplorePhases::*member;
};
constexpr std::array kPhaseSeconds = {
    PhaseSeconds{"partition", &ExplorePhases::partition_s},
    PhaseSeconds{"memory", &ExplorePhases::memory_s},
    PhaseSeconds{"bounds", &ExplorePhases::bounds_s},
    PhaseSeconds{"simulate", &ExplorePhases::simulate_s},
    PhaseSeconds{"program_signatures", &ExplorePhases::signature_s}};
constexpr std::array kPhaseCounts = {
    PhaseCount{"bound_programs", &ExplorePhases::bound_programs},
    PhaseCount{"bounded_out_programs", &ExplorePhases::bounded_out_programs},
    PhaseCount{"unfit_programs", &ExplorePhases::unfit_programs},
    PhaseCount{"timed_programs", &ExplorePhases::timed_programs},
    PhaseCount{"floor_skipped_programs", &ExplorePhases::floor_skipped_programs},
    PhaseCount{"below_own_program", &ExplorePhases::below_own_program},
    PhaseCount{"equivalent_mesh_skips", &ExplorePhases::equivalent_mesh_skips},
    PhaseCount{"chain_bounded", &ExplorePhases::chain_bounded},
    PhaseCount{"borrowed_programs", &ExplorePhases::borrowed_programs},
    PhaseCount{"batch_class_skips", &ExplorePhases::batch_class_skips},
    PhaseCount{"schedule_class_skips", &ExplorePhases::schedule_class_skips},
    PhaseCount{"resized_program_skips", &ExplorePhases::resized_program_skips},
    PhaseCount{"resized_programs", &ExplorePhases::resized_programs}};

}  // namespace

void ExplorePhases::add(const ExplorePhases& other) {
  for (const PhaseSeconds& field : kPhaseSeconds) {
    this->*field.member += other.*field.member;
  }
  for (const PhaseCount& field : kPhaseCounts) {
    this->*field.member += other.*field.member;
  }
}

std::vector<double> ExplorePhases::as_numbers() const {
  std::vector<double> numbers;
  numbers.reserve(kPhaseSeconds.size() + kPhaseCounts.size());
  for (const PhaseSeconds& field : kPhaseSeconds) {
    numbers.push_back(this->*field.member);
  }
  for (const PhaseCount& field : kPhaseCounts) {
    numbers.push_back(static_cast<double>(this->*field.member));
  }
  return numbers;
}

ExplorePhases ExplorePhases::from_numbers(const std::vector<double>& numbers) {
  ExplorePhases phases;
  size_t index = 0;
  for (const PhaseSeconds& field : kPhaseSeconds) {
    phases.*field.member = numbers.at(index++);
  }
  for (const PhaseCount& field : kPhaseCounts) {
    phases.*field.member = static_cast<int64_t>(numbers.at(index++));
  }
  return phases;
}

nlohmann::json ExplorePhases::to_json() const {
  nlohmann::json json = nlohmann::json::object();
  for (const PhaseSeconds& field : kPhaseSeconds) {
    json[field.name] = this->*field.member;
  }
  for (const PhaseCount& field : kPhaseCounts) {
    json[field.name] = this->*field.member;
  }
  return json;
}

// tokens_per_dollar ranks by tokens/s/chip (one price per slice); its listed objectives are
// tokens per unit of currency: tokens/s/chip x 3600 s / the price of a chip-hour.
void objectives_per_dollar(ExploreResult& result, const ExploreOptions& options) {
  if (options.objective != ExploreObjective::kTokensPerDollar) {
    return;
  }
  const double per_dollar = 3600.0 / options.price_per_chip_hour;
  for (RankedCandidate& ranked : result.top) {
    ranked.objective *= per_dollar;
  }
  for (PipelineOption& option : result.pipeline_options) {
    option.objective *= per_dollar;
  }
}

ExploreResult explore(const Config& config, const ExploreOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string> schedule_keys;
  const std::vector<ScheduleChoice> choices = pipeline_schedule_choices(config, schedule_keys);
  if (options.exact_schedules && choices.size() == 1) {
    // It changes how later schedules are searched; with one there is nothing to change.
    throw UserError(
        "--exact-schedules: this search has one pipeline schedule, so the flag changes nothing; "
        "explore searches several only over multislice (compile_topology_num_slices > 1) with "
        "no pipeline key pinned and decoder layers of one kind");
  }
  SharedClasses shared{{}, ClassBounds(options.check_equivalent_meshes)};
  if (choices.size() == 1 && choices.front().stages == 1) {
    ExploreResult result = explore_one_schedule(config, options, shared, options.initial_bar);
    objectives_per_dollar(result, options);
    return result;
  }
  ExploreResult merged;
  std::vector<RankedCandidate> everything;
  std::optional<UserError> first_error;
  for (const ScheduleChoice& choice : choices) {
    const Config scheduled = with_schedule(config, choice);
    const double bar = std::max(top_bar(everything, options), options.initial_bar);
    ExploreResult part;
    try {
      part = explore_one_schedule(scheduled, options, shared, bar,
                                  schedule_stretch(scheduled, choice));
    } catch (const UserError& error) {
      // A schedule the batch or the layers cannot take (MaxText refuses it too) is skipped; the
      // error stands only when no schedule could be searched.
      if (!first_error) {
        first_error = error;
      }
      continue;
    }
    PipelineOption option = summarize_schedule(choice, scheduled, part);
    mark_bounded_out(option, part, bar);
    merged.pipeline_options.push_back(option);
    add_schedule(merged, part, everything);
  }
  if (merged.pipeline_options.empty()) {
    if (!first_error) {
      // pipeline_schedule_choices gives every pinned stage count a schedule; an empty list is a
      // broken invariant, not bad input (it used to dereference the empty error: SIGSEGV).
      throw std::logic_error("explore: no pipeline schedule was searched");
    }
    throw *first_error;
  }
  for (const std::string& key : schedule_keys) {
    merged.space.searched_keys.push_back(key);
  }
  sort_best_first(everything);
  if (everything.size() > static_cast<size_t>(options.top)) {
    everything.resize(static_cast<size_t>(options.top));
  }
  merged.top = std::move(everything);
  thin_samples(merged.samples, options.max_samples);
  merged.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  objectives_per_dollar(merged, options);
  return merged;
}

int ExploreResult::same_score_as(size_t index) const {
  for (size_t above = 0; above < index && index < top.size(); ++above) {
    if (tie_key(top[above].objective) == tie_key(top[index].objective)) {
      return static_cast<int>(above) + 1;
    }
  }
  return 0;
}

nlohmann::json ExploreResult::to_json() const {
  nlohmann::json json;
  json["candidates_in_space"] = candidates_in_space;
  json["candidates_evaluated"] = candidates_evaluated;
  json["pruned"] = nlohmann::json::object();
  for (const auto& [reason, count] : pruned) {
    json["pruned"][reason] = count;
  }
  json["programs_built"] = programs_built;
  json["phases"] = phases.to_json();
  json["elapsed_s"] = elapsed_s;
  json["threads"] = threads;
  json["ranks"] = ranks;
  json["candidates_per_s_per_core"] =
      elapsed_s > 0 ? static_cast<double>(candidates_evaluated) / elapsed_s / (threads * ranks) : 0;
  json["objective"] = objective_name(objective);
  json["searched_keys"] = space.searched_keys;
  json["meshes"] = space.meshes.size();
  json["usable_hbm_bytes_per_device"] = usable_hbm_bytes;
  json["smallest_peak_hbm_bytes_per_device"] = smallest_peak_hbm_bytes;
  if (!pipeline_options.empty()) {
    json["pipeline_options"] = nlohmann::json::array();
    for (const PipelineOption& option : pipeline_options) {
      json["pipeline_options"].push_back(pipeline_option_json(option));
    }
  }
  json["top"] = nlohmann::json::array();
  for (size_t index = 0; index < top.size(); ++index) {
    nlohmann::json item = ranked_json(top[index]);
    item["same_score_as_rank"] = same_score_as(index);
    json["top"].push_back(std::move(item));
  }
  return json;
}

}  // namespace tpusim
