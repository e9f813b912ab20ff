#include "sim/plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "hw/slice.h"
#include "model/config.h"
#include "sim/explore/search_space.h"
#include "sim/explore/worker_result.h"
#include "sim/plan/pareto_front.h"
#include "sim/plan/plan_settings.h"
#include "sim/plan/throughput_bound.h"

namespace tpusim {
namespace {

constexpr double kSecondsPerHour = 3600;
constexpr double kSecondsPerDay = 86400;
// The origin Config gives keys set on the command line: the slice plan sets is part of the
// command line that reproduces a point (RankedCandidate::args).
constexpr const char* kCommandLineOrigin = "command line";

double seconds_since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// One slice with everything plan needs to know before searching it.
struct Pending {
  SliceCandidate slice;
  Config config;
  ThroughputBound bound;
  std::optional<double> price;  // per chip-hour
  double optimistic = 0;        // the objective at the bound (smaller is better)
};

// The objective a slice would reach at `tokens_per_s_per_chip` (smaller is better).
double objective_at(PlanObjective objective, const PlanRequest& request, const Pending& pending,
                    double tokens_per_s_per_chip) {
  const double chip_hours = request.tokens / tokens_per_s_per_chip / kSecondsPerHour;
  switch (objective) {
    case PlanObjective::kTime:
      return chip_hours / static_cast<double>(pending.slice.chips) / 24;
    case PlanObjective::kCost:
      return chip_hours * pending.price.value_or(std::numeric_limits<double>::infinity());
    case PlanObjective::kChipHours:
      break;
  }
  return chip_hours;
}

// The tokens/s/chip at which `pending` reaches objective value `value` (objective_at inverted).
double tokens_per_s_per_chip_for(PlanObjective objective, const PlanRequest& request,
                                 const Pending& pending, double value) {
  const double chip_hours = objective == PlanObjective::kTime
                                ? value * 24 * static_cast<double>(pending.slice.chips)
                            : objective == PlanObjective::kCost ? value / pending.price.value_or(0)
                                                                : value;
  return request.tokens / (chip_hours * kSecondsPerHour);
}

// What the slice must exceed (tokens/s/chip), and why, from the deadline and the points found.
struct Bar {
  double tokens_per_s_per_chip = 0;
  std::string reason;
};

Bar bar_for(const PlanRequest& request, const Pending& pending,
            const std::vector<PlanPoint>& points, bool front_by_cost) {
  Bar bar;
  const auto chips = static_cast<double>(pending.slice.chips);
  if (request.deadline_days > 0) {
    bar = {request.tokens / (request.deadline_days * kSecondsPerDay * chips),
           "cannot finish within the deadline"};
  }
  const PlanObjective second = front_by_cost ? PlanObjective::kCost : PlanObjective::kChipHours;
  for (const PlanPoint& point : points) {
    double needed = 0;
    if (request.full_front) {
      // Off the front: no faster and no cheaper than `point`.
      needed = std::min(
          tokens_per_s_per_chip_for(PlanObjective::kTime, request, pending, point.days),
          tokens_per_s_per_chip_for(second, request, pending, objective_of(second, point)));
    } else {
      needed = tokens_per_s_per_chip_for(request.objective, request, pending,
                                         objective_of(request.objective, point));
    }
    if (needed > bar.tokens_per_s_per_chip) {
      bar = {needed, (request.full_front ? "dominated by " : "cannot beat ") + point.slice.label()};
    }
  }
  return bar;
}

void check_request(const Config& config, const PlanRequest& request) {
  if (!(request.tokens > 0) || !std::isfinite(request.tokens)) {
    throw UserError("--tokens: " + std::to_string(request.tokens) + " must be a positive number");
  }
  if (request.deadline_days < 0 || !std::isfinite(request.deadline_days)) {
    throw UserError("--deadline: must be positive");
  }
  // The slice and its count are what plan chooses. num_slices (MaxText's run-time count) must
  // equal compile_topology_num_slices, which plan varies (set in a config file, the slice check
  // refuses it on the first slice).
  for (const std::string key : {"compile_topology", "compile_topology_num_slices", "num_slices"}) {
    if (config.origin(key) == kCommandLineOrigin) {
      throw UserError("plan: " + key +
                          " is what plan chooses; name the hardware with --hardware (and "
                          "--max-chips, --max-slices), or run `tpusim explore` on one slice",
                      key);
    }
  }
  if (request.kinds.empty()) {
    throw UserError("--hardware: no hardware kind given (e.g. v5p,v6e,tpu7x)");
  }
  if (request.objective == PlanObjective::kCost && !request.prices) {
    throw UserError("--objective cost: needs --prices FILE (configs/prices.example.yml)");
  }
  // Refused here, not slice by slice: a limit out of range is the same mistake on every slice.
  check_explore_limits({.max_per_device_batch = request.max_per_device_batch,
                        .min_hbm_headroom = request.min_hbm_headroom});
}

std::vector<Pending> pending_slices(const Config& config, const PlanRequest& request) {
  std::vector<Pending> pending;
  for (const SliceCandidate& slice :
       enumerate_slice_candidates(request.kinds, request.max_chips, request.max_slices)) {
    Pending item{slice, config, {}, std::nullopt, 0};
    item.config.set("compile_topology", slice.slice_name, kCommandLineOrigin);
    item.config.set_int("compile_topology_num_slices", slice.num_slices, kCommandLineOrigin);
    // MaxText's `hardware` follows the kind: a GPU node runs hardware=gpu, a TPU slice tpu.
    const std::string hardware = PlanSettings::from_config(config).hardware;
    const bool gpu_hardware = hardware == "gpu" || hardware == "gpu_multiprocess";
    if (slice.kind.chip->is_gpu() != gpu_hardware) {
      item.config.set_string("hardware", slice.kind.chip->is_gpu() ? "gpu" : "tpu",
                             kCommandLineOrigin);
    }
    item.bound = throughput_upper_bound(item.config);
    if (request.prices) {
      item.price = request.prices->per_chip_hour(parse_slice(slice.slice_name, slice.num_slices),
                                                 request.consumption);
    }
    if (request.objective == PlanObjective::kCost && !item.price) {
      throw UserError("--objective cost: " + request.prices->origin() + " has no " +
                      consumption_name(request.consumption) + " price for " + slice.kind.name);
    }
    item.optimistic =
        objective_at(request.objective, request, item, item.bound.tokens_per_s_per_chip);
    pending.push_back(std::move(item));
  }
  // Best bound first: the incumbent then skips the most. Ties (chip-hours and cost do not depend
  // on the chip count) by fewer chips, the cheaper search.
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return a.optimistic < b.optimistic ||
           (a.optimistic == b.optimistic && a.slice.chips < b.slice.chips);
  });
  return pending;
}

PlanPoint point_of(const PlanRequest& request, const Pending& pending,
                   const ExploreResult& explored) {
  PlanPoint point;
  point.slice = pending.slice;
  point.best = explored.top.front();
  point.remat = explored.space.remats.at(static_cast<size_t>(point.best.candidate.remat)).label();
  const auto chips = static_cast<double>(pending.slice.chips);
  point.tokens_per_s = point.best.tokens_per_s_per_chip * chips;
  point.days = request.tokens / point.tokens_per_s / kSecondsPerDay;
  point.chip_hours = request.tokens / point.best.tokens_per_s_per_chip / kSecondsPerHour;
  if (pending.price) {
    point.cost = point.chip_hours * *pending.price;
  }
  point.energy_mwh = point.chip_hours * pending.slice.kind.chip->power_watts / 1e6;
  point.meets_deadline = request.deadline_days <= 0 || point.days <= request.deadline_days;
  point.explore_s = explored.elapsed_s;
  return point;
}

// Searches one slice with the bar; fills the record (and a point when it beats the bar).
void search_slice(const PlanRequest& request, const Pending& pending, int64_t sequences,
                  const Bar& bar, SliceRecord& record, std::vector<PlanPoint>& points) {
  ExploreOptions options;
  options.limits.global_batch_size = sequences;
  options.limits.max_per_device_batch = request.max_per_device_batch;
  options.limits.min_hbm_headroom = request.min_hbm_headroom;
  options.objective = ExploreObjective::kTokensPerSecondPerChip;
  options.top = 1;
  options.threads = request.threads;
  if (bar.tokens_per_s_per_chip > 0) {
    options.initial_bar = bar.tokens_per_s_per_chip;
  }
  ExploreResult explored;
  try {
    explored = explore(pending.config, options);
  } catch (const UserError& error) {
    record.outcome = SliceOutcome::kRefused;
    record.note = error.what();
    return;
  }
  record.programs_built = explored.programs_built;
  record.candidates_evaluated = explored.candidates_evaluated;
  const bool beats_bar = !explored.top.empty() &&
                         explored.top.front().tokens_per_s_per_chip > bar.tokens_per_s_per_chip;
  if (beats_bar) {
    record.point = points.size();
    points.push_back(point_of(request, pending, explored));
    return;
  }
  const auto pruned = explored.pruned.find(kPrunedCannotBeatTop);
  if (!explored.top.empty() || (pruned != explored.pruned.end() && pruned->second > 0)) {
    record.outcome = SliceOutcome::kBoundedOut;
    record.note = bar.reason;
    return;
  }
  record.outcome = SliceOutcome::kNothingFits;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  record.note = "smallest peak HBM " + std::to_string(explored.smallest_peak_hbm_bytes / kGiB) +
                " GiB per device against " + std::to_string(explored.usable_hbm_bytes / kGiB) +
                " GiB usable";
}

std::optional<size_t> best_by(const std::vector<PlanPoint>& points, PlanObjective objective,
                              bool deadline_only) {
  std::optional<size_t> best;
  for (size_t index = 0; index < points.size(); ++index) {
    if (deadline_only && !points[index].meets_deadline) {
      continue;
    }
    if (!best || objective_of(objective, points[index]) < objective_of(objective, points[*best])) {
      best = index;
    }
  }
  return best;
}

}  // namespace

double objective_of(PlanObjective objective, const PlanPoint& point) {
  switch (objective) {
    case PlanObjective::kTime:
      return point.days;
    case PlanObjective::kCost:
      return point.cost.value_or(std::numeric_limits<double>::infinity());
    case PlanObjective::kChipHours:
      break;
  }
  return point.chip_hours;
}

std::vector<size_t> points_near_pick(const std::vector<PlanPoint>& points, size_t pick,
                                     PlanObjective objective) {
  const double picked = objective_of(objective, points.at(pick));
  std::vector<size_t> near;
  for (size_t index = 0; index < points.size(); ++index) {
    if (index != pick && points[index].meets_deadline &&
        objective_of(objective, points[index]) <= picked * (1 + kNearPick)) {
      near.push_back(index);
    }
  }
  return near;
}

PlanObjective parse_plan_objective(const std::string& name) {
  if (name == "time") {
    return PlanObjective::kTime;
  }
  if (name == "chip_hours") {
    return PlanObjective::kChipHours;
  }
  if (name == "cost") {
    return PlanObjective::kCost;
  }
  throw UserError("--objective: unknown '" + name + "' (time, chip_hours, cost)");
}

const char* plan_objective_name(PlanObjective objective) {
  switch (objective) {
    case PlanObjective::kTime:
      return "time";
    case PlanObjective::kCost:
      return "cost";
    case PlanObjective::kChipHours:
      break;
  }
  return "chip_hours";
}

const char* slice_outcome_name(SliceOutcome outcome) {
  switch (outcome) {
    case SliceOutcome::kSkippedByBound:
      return "skipped_by_bound";
    case SliceOutcome::kBoundedOut:
      return "bounded_out";
    case SliceOutcome::kNothingFits:
      return "nothing_fits";
    case SliceOutcome::kRefused:
      return "refused";
    case SliceOutcome::kSearched:
      break;
  }
  return "searched";
}

PlanResult plan(const Config& config, const PlanRequest& request) {
  const auto started = std::chrono::steady_clock::now();
  check_request(config, request);
  PlanResult result;
  result.request = request;
  const PlanSettings settings = PlanSettings::from_config(config);
  result.model_name = settings.model_name;
  result.max_target_length = settings.max_target_length;
  if (result.request.global_batch.source.empty()) {
    result.request.global_batch = default_global_batch_range(result.model_name);
  }
  result.global_batch_sequences =
      global_batch_sequences(result.request.global_batch, result.max_target_length);
  // Fewer tokens than one optimizer step takes: the plan's days and chip-hours were those of a
  // fraction of a step (tiny-llama, --tokens 1e6: 5.9e-07 days for 1/8 of an 8.39M-token batch).
  if (const double batch_tokens = static_cast<double>(result.global_batch_sequences) *
                                  static_cast<double>(result.max_target_length);
      request.tokens < batch_tokens) {
    throw UserError("--tokens: " + tokens_text(request.tokens) +
                    " is less than one global batch (" + tokens_text(batch_tokens) + " tokens, " +
                    result.request.global_batch.source +
                    "); give more tokens or a smaller --global-batch-tokens");
  }
  std::vector<Pending> pending = pending_slices(config, request);
  result.front_by_cost =
      request.prices && std::all_of(pending.begin(), pending.end(),
                                    [](const Pending& item) { return item.price.has_value(); });
  for (size_t index = 0; index < pending.size(); ++index) {
    const Pending& item = pending[index];
    const auto slice_started = std::chrono::steady_clock::now();
    SliceRecord record;
    record.slice = item.slice;
    record.bound_tokens_per_s_per_chip = item.bound.tokens_per_s_per_chip;
    result.flops_per_token = item.bound.flops_per_token;
    const Bar bar = bar_for(request, item, result.points, result.front_by_cost);
    record.bar_tokens_per_s_per_chip = bar.tokens_per_s_per_chip;
    if (item.bound.tokens_per_s_per_chip <= bar.tokens_per_s_per_chip) {
      record.outcome = SliceOutcome::kSkippedByBound;
      record.note = bar.reason;
    } else {
      if (request.progress) {
        request.progress(item.slice, index, pending.size());
      }
      search_slice(request, item, result.global_batch_sequences, bar, record, result.points);
    }
    record.elapsed_s = seconds_since(slice_started);
    result.slices.push_back(std::move(record));
  }
  std::vector<std::pair<double, double>> costs;
  for (const PlanPoint& point : result.points) {
    costs.emplace_back(point.days, result.front_by_cost ? *point.cost : point.chip_hours);
  }
  result.front = pareto_front(costs);
  result.pick = best_by(result.points, request.objective, true);
  result.fastest = best_by(result.points, PlanObjective::kTime, false);
  if (result.pick) {
    result.near_pick = points_near_pick(result.points, *result.pick, request.objective);
  }
  result.elapsed_s = seconds_since(started);
  return result;
}

}  // namespace tpusim
