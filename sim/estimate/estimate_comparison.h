// sim/estimate/estimate_comparison.h: two estimates side by side, the one comparison behind
// `tpusim compare` (a text table, JSON and a page) and `validate --pairs` (the predicted ratio
// B / A of a step pair): step time, MFU, throughput, the breakdown by key, HBM, and the compute
// ops whose time per step changed most.
//
// Example:
//   const EstimateComparison comparison =
//       compare_estimates(estimate_config(config_a), estimate_config(config_b));
//   comparison.b.step_seconds / comparison.a.step_seconds;  // as comparison.ratio("step_s")
//   comparison_table(comparison, "A: ...", "B: ...", 10);   // what `tpusim compare` prints
#pragma once

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/estimate/estimate.h"

namespace tpusim {

// One side's figures, copied out of its Estimate.
struct ComparedRun {
  double step_seconds = 0;
  double mfu = 0;
  double tflops_per_chip = 0;
  double tokens_per_s_per_chip = 0;
  double hbm_peak_bytes = 0;
  double hbm_capacity_bytes = 0;
  bool fits = true;
  Breakdown breakdown;
  nlohmann::json summary;  // the estimate's JSON report

  // The quantity a step pair of validate --pairs names: "step_s" or "mfu".
  double quantity(const std::string& name) const;
};

// One compute op's seconds per step (all its calls) in A and in B; 0 where a run has no such op.
struct OpChange {
  std::string region;
  std::string op;
  double seconds_a = 0;
  double seconds_b = 0;
};

struct EstimateComparison {
  ComparedRun a;
  ComparedRun b;
  std::vector<OpChange> op_changes;  // every op of either run, largest |B - A| first

  // B / A of "step_s" or "mfu".
  double ratio(const std::string& quantity) const;
};

EstimateComparison compare_estimates(const Estimate& a, const Estimate& b);

// {"a": {...}, "b": {...}, "step_time_ratio", "mfu_ratio", "breakdown": [{key, label, resource,
// a, b}], "op_changes": [the `top_ops` largest]}; `label_a` and `label_b` say how each was run.
nlohmann::json comparison_json(const EstimateComparison& comparison, const std::string& label_a,
                               const std::string& label_b, size_t top_ops);

// The summary rows, formatted as the command line rounds them: {label, A, B, change} for step
// time, MFU, TFLOP/s and tokens/s per chip, peak and usable HBM per device, and whether it fits.
std::vector<std::array<std::string, 4>> summary_rows(const EstimateComparison& comparison);

// The same as a text table, A and B side by side with the change.
std::string comparison_table(const EstimateComparison& comparison, const std::string& label_a,
                             const std::string& label_b, size_t top_ops);

}  // namespace tpusim
