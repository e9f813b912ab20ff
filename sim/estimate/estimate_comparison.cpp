#include "sim/estimate/estimate_comparison.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>
#include <utility>

namespace tpusim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

ComparedRun compared_run(const Estimate& estimate) {
  ComparedRun run;
  run.step_seconds = estimate.step_seconds;
  run.mfu = estimate.mfu;
  run.tflops_per_chip = estimate.tflops_per_chip;
  run.tokens_per_s_per_chip = estimate.tokens_per_s_per_chip;
  run.hbm_peak_bytes = estimate.memory.peak_bytes;
  run.hbm_capacity_bytes = estimate.memory.capacity_bytes;
  run.fits = estimate.memory.fits;
  run.breakdown = estimate.timing.breakdown;
  run.summary = estimate.json;
  return run;
}

// Every breakdown key of either run, in the breakdown's order, with A's and B's seconds.
std::vector<std::pair<BreakdownKey, std::pair<double, double>>> breakdown_rows(
    const EstimateComparison& comparison) {
  std::map<BreakdownKey, std::pair<double, double>, BreakdownKeyOrder> rows;
  for (const auto& [key, seconds] : comparison.a.breakdown) {
    rows[key].first = seconds;
  }
  for (const auto& [key, seconds] : comparison.b.breakdown) {
    rows[key].second = seconds;
  }
  return {rows.begin(), rows.end()};
}

std::string fixed(double value, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

std::string signed_fixed(double value, int decimals) {
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

// "+3.8%": B against A; "-" when A is 0.
std::string percent_change(double a, double b) {
  return a > 0 ? signed_fixed(100 * (b / a - 1), 1) + "%" : "-";
}

void table_row(std::ostream& out, int width, const std::string& label, const std::string& a,
               const std::string& b, const std::string& change) {
  out << std::left << std::setw(width) << label << std::right << std::setw(13) << a << std::setw(13)
      << b << std::setw(13) << change << "\n";
}

}  // namespace

double ComparedRun::quantity(const std::string& name) const {
  return name == "mfu" ? mfu : step_seconds;
}

double EstimateComparison::ratio(const std::string& quantity) const {
  return b.quantity(quantity) / a.quantity(quantity);
}

EstimateComparison compare_estimates(const Estimate& a, const Estimate& b) {
  EstimateComparison comparison{compared_run(a), compared_run(b), {}};
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> ops;
  for (const OpProfile& op : a.timing.profile) {
    ops[{op.region, op.op}].first += op.seconds;
  }
  for (const OpProfile& op : b.timing.profile) {
    ops[{op.region, op.op}].second += op.seconds;
  }
  for (const auto& [where, seconds] : ops) {
    comparison.op_changes.push_back({where.first, where.second, seconds.first, seconds.second});
  }
  std::stable_sort(comparison.op_changes.begin(), comparison.op_changes.end(),
                   [](const OpChange& x, const OpChange& y) {
                     return std::abs(x.seconds_b - x.seconds_a) >
                            std::abs(y.seconds_b - y.seconds_a);
                   });
  return comparison;
}

nlohmann::json comparison_json(const EstimateComparison& comparison, const std::string& label_a,
                               const std::string& label_b, size_t top_ops) {
  nlohmann::json breakdown = nlohmann::json::array();
  for (const auto& [key, seconds] : breakdown_rows(comparison)) {
    breakdown.push_back({{"key", breakdown_name(key)},
                         {"label", breakdown_label(key)},
                         {"resource", breakdown_resource(key)},
                         {"a", seconds.first},
                         {"b", seconds.second}});
  }
  nlohmann::json ops = nlohmann::json::array();
  for (size_t index = 0; index < comparison.op_changes.size() && index < top_ops; ++index) {
    const OpChange& op = comparison.op_changes[index];
    ops.push_back({{"region", op.region}, {"op", op.op}, {"a", op.seconds_a}, {"b", op.seconds_b}});
  }
  return {{"a", {{"run", label_a}, {"estimate", comparison.a.summary}}},
          {"b", {{"run", label_b}, {"estimate", comparison.b.summary}}},
          {"step_time_ratio", comparison.ratio("step_s")},
          {"mfu_ratio", comparison.ratio("mfu")},
          {"breakdown", breakdown},
          {"op_changes", ops}};
}

std::vector<std::array<std::string, 4>> summary_rows(const EstimateComparison& comparison) {
  const ComparedRun& a = comparison.a;
  const ComparedRun& b = comparison.b;
  return {
      {"step time", fixed(a.step_seconds, 3) + " s", fixed(b.step_seconds, 3) + " s",
       percent_change(a.step_seconds, b.step_seconds)},
      {"MFU", fixed(100 * a.mfu, 1) + "%", fixed(100 * b.mfu, 1) + "%",
       signed_fixed(100 * (b.mfu - a.mfu), 1) + " pts"},
      {"TFLOP/s per chip", fixed(a.tflops_per_chip, 1), fixed(b.tflops_per_chip, 1),
       percent_change(a.tflops_per_chip, b.tflops_per_chip)},
      {"tokens/s per chip", fixed(a.tokens_per_s_per_chip, 1), fixed(b.tokens_per_s_per_chip, 1),
       percent_change(a.tokens_per_s_per_chip, b.tokens_per_s_per_chip)},
      {"HBM per device, peak", fixed(a.hbm_peak_bytes / kGiB, 2) + " GiB",
       fixed(b.hbm_peak_bytes / kGiB, 2) + " GiB",
       percent_change(a.hbm_peak_bytes, b.hbm_peak_bytes)},
      {"HBM per device, usable", fixed(a.hbm_capacity_bytes / kGiB, 2) + " GiB",
       fixed(b.hbm_capacity_bytes / kGiB, 2) + " GiB", ""},
      {"fits", a.fits ? "yes" : "OUT OF MEMORY", b.fits ? "yes" : "OUT OF MEMORY", ""}};
}

std::string comparison_table(const EstimateComparison& comparison, const std::string& label_a,
                             const std::string& label_b, size_t top_ops) {
  const ComparedRun& a = comparison.a;
  const ComparedRun& b = comparison.b;
  std::ostringstream out;
  if (!a.fits || !b.fits) {
    const char* which = !a.fits && !b.fits ? "A and B do" : (!a.fits ? "A does" : "B does");
    out << "OUT OF MEMORY: " << which << " not fit in HBM (peak HBM per device below)\n";
  }
  out << "A  " << label_a << "\nB  " << label_b << "\n";
  // The label column fits the longest label (an op's region and name are never cut).
  const auto rows = breakdown_rows(comparison);
  const size_t ops = std::min(top_ops, comparison.op_changes.size());
  size_t longest = 32;
  for (const auto& [key, seconds] : rows) {
    longest = std::max(longest, breakdown_label(key).size() + 2);
  }
  for (size_t index = 0; index < ops; ++index) {
    const OpChange& op = comparison.op_changes[index];
    longest = std::max(longest, op.region.size() + op.op.size() + 4);
  }
  const int width = static_cast<int>(longest) + 1;
  table_row(out, width, "", "A", "B", "B vs A");
  for (const auto& [label, value_a, value_b, change] : summary_rows(comparison)) {
    table_row(out, width, label, value_a, value_b, change);
  }
  out << "breakdown (s per step)\n";
  for (const auto& [key, seconds] : rows) {
    table_row(out, width, "  " + breakdown_label(key), fixed(seconds.first, 4),
              fixed(seconds.second, 4), signed_fixed(seconds.second - seconds.first, 4));
  }
  out << "compute ops whose time changed most (s per step)\n";
  for (size_t index = 0; index < ops; ++index) {
    const OpChange& op = comparison.op_changes[index];
    table_row(out, width, "  " + op.region + ": " + op.op, fixed(op.seconds_a, 4),
              fixed(op.seconds_b, 4), signed_fixed(op.seconds_b - op.seconds_a, 4));
  }
  return out.str();
}

}  // namespace tpusim
