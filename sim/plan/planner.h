// sim/plan/planner.h: `tpusim plan`: from a model and a token budget to the slice, the
// configuration, the time and the cost.
//
// For each hardware kind and slice size (slice_candidates.h) it runs the explorer's search
// (sim/explore/explorer.h) with the global batch fixed (global_batch.h) and keeps the best
// configuration of the slice. Slices are taken best bound first, and a slice is searched only
// when it can still beat the incumbent:
//   - first by the FLOPs bound of throughput_bound.h (no search at all: skipped_by_bound);
//   - then inside the explorer, whose own bounds skip every candidate that cannot exceed the bar
//     (ExploreOptions::initial_bar; a slice none of whose candidates can: bounded_out).
// The bar is a tokens/s/chip the slice must exceed: to finish by the deadline (tokens / (deadline
// x chips)), and to beat the incumbent on the objective (time: tokens / (its days x chips);
// chip-hours: tokens / (its chip-hours x 3600 s), whatever the chip count; cost: the same times
// the slice's price). With `full_front`, the bar is instead to leave the Pareto front of days
// against chip-hours (or cost): a slice is skipped only when every point it could reach is
// dominated by one found, so the front listed is exact; otherwise the front is that of the
// slices searched.
//
// Example:
//   PlanRequest request;
//   request.tokens = 1e12;
//   request.deadline_days = 60;
//   request.kinds = parse_hardware_kinds("v5p,v6e,tpu7x");
//   PlanResult result = plan(Config::load("", {"model_name=llama3.1-70b"}), request);
//   result.points[*result.pick].slice.label();  // the recommended slice
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/explore/explorer.h"
#include "sim/plan/global_batch.h"
#include "sim/plan/prices.h"
#include "sim/plan/slice_candidates.h"

namespace tpusim {

class Config;

enum class PlanObjective { kTime, kChipHours, kCost };

// "time", "chip_hours", "cost"; UserError naming the value.
PlanObjective parse_plan_objective(const std::string& name);
const char* plan_objective_name(PlanObjective objective);

struct PlanRequest {
  double tokens = 0;         // the token budget
  double deadline_days = 0;  // 0: none
  std::vector<HardwareKind> kinds;
  int64_t max_chips = 16384;
  int max_slices = 64;
  PlanObjective objective = PlanObjective::kChipHours;
  std::optional<PriceTable> prices;
  Consumption consumption = Consumption::kOnDemand;
  GlobalBatchRange global_batch;  // empty source: the default for the model
  bool full_front = false;
  // The explorer's limits and threads (the batch is set from global_batch).
  double max_per_device_batch = 16;
  double min_hbm_headroom = 0;
  int threads = 0;
  // Called before each slice's search with (slice, index, count), for a progress line.
  std::function<void(const SliceCandidate&, size_t, size_t)> progress;
};

// What became of one slice.
enum class SliceOutcome {
  kSearched,        // its best configuration is a point
  kSkippedByBound,  // throughput_bound.h: cannot reach the bar (no search)
  kBoundedOut,      // the explorer's bounds: no configuration reaches the bar
  kNothingFits,     // searched, nothing fits HBM
  kRefused,         // the explorer refused the slice (e.g. the global batch cannot split)
};
const char* slice_outcome_name(SliceOutcome outcome);

// A searched slice's best configuration and what it gives over the token budget.
struct PlanPoint {
  SliceCandidate slice;
  RankedCandidate best;     // explore's #1 on the slice (args, step time, MaxText, libtpu flags)
  std::string remat;        // the remat policy's label
  double tokens_per_s = 0;  // over all chips
  double days = 0;          // to the token budget
  double chip_hours = 0;
  std::optional<double> cost;  // with a price for the kind
  double energy_mwh = 0;       // estimate: chip-hours x the catalog's power
  bool meets_deadline = true;
  double explore_s = 0;  // the slice's search
};

struct SliceRecord {
  SliceCandidate slice;
  SliceOutcome outcome = SliceOutcome::kSearched;
  double bound_tokens_per_s_per_chip = 0;  // throughput_bound.h
  double bar_tokens_per_s_per_chip = 0;    // what it had to exceed (0: nothing yet)
  std::optional<size_t> point;             // into PlanResult::points
  std::string note;                        // why refused, or the smallest peak when none fits
  double elapsed_s = 0;
  // What the slice's search cost (0 when skipped by the FLOPs bound): per-device programs
  // partitioned (explorer.h: mostly remat_policy=none programs built only to bound a batch) and
  // candidates evaluated (ExploreResult::candidates_evaluated). A bounded-out slice with none
  // evaluated was ruled out by the TensorCore bound of every program, each still built.
  int64_t programs_built = 0;
  int64_t candidates_evaluated = 0;
};

struct PlanResult {
  std::string model_name;
  PlanRequest request;
  int64_t global_batch_sequences = 0;
  int64_t max_target_length = 0;
  std::vector<SliceRecord> slices;  // in the order taken
  std::vector<PlanPoint> points;
  std::vector<size_t> front;   // indices into points: days against chip-hours (or cost)
  std::optional<size_t> pick;  // best on the objective among those meeting the deadline
  std::optional<size_t> fastest;
  // Other points meeting the deadline whose objective is within kNearPick of the pick's: a
  // difference tpusim does not resolve (its predicted A/B differences err by several points,
  // reports/validation.md), so the recommendation names them, with their days.
  std::vector<size_t> near_pick;
  double flops_per_token = 0;
  double elapsed_s = 0;
  bool front_by_cost = false;  // every point has a cost: the front is days against cost
};

// Relative distance on the objective within which another point is named beside the pick.
constexpr double kNearPick = 0.01;

// A point's value on `objective` (days, chip-hours or cost; smaller is better).
double objective_of(PlanObjective objective, const PlanPoint& point);

// The points other than `pick` meeting the deadline within kNearPick of it on `objective`, in
// order (PlanResult::near_pick).
std::vector<size_t> points_near_pick(const std::vector<PlanPoint>& points, size_t pick,
                                     PlanObjective objective);

// UserError for bad requests (tokens <= 0, a negative deadline, --objective cost without prices
// for some kind, compile_topology given: plan chooses the slice).
PlanResult plan(const Config& config, const PlanRequest& request);

}  // namespace tpusim
