#include "sim/plan/plan_output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace tpusim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

// A deadline as the user would write it: whole days, else hours (a deadline of 1h was "0
// days"); `adjective`: "30-day", "12-hour", else "30 days", "1 hour".
std::string deadline_text(double days, bool adjective) {
  constexpr double kHoursPerDay = 24;
  const bool whole_days = days >= 1 && std::abs(days - std::round(days)) < 1e-9;
  const double value = whole_days ? days : days * kHoursPerDay;
  std::ostringstream text;
  text << std::setprecision(4) << value << (adjective ? "-" : " ") << (whole_days ? "day" : "hour")
       << (adjective || value == 1 ? "" : "s");
  return text.str();
}

// 131k, 1.2M: chip-hours and costs at a glance.
std::string compact(double value) {
  char text[32];
  if (value >= 1e6) {
    std::snprintf(text, sizeof(text), "%.3gM", value / 1e6);
  } else if (value >= 1e4) {
    std::snprintf(text, sizeof(text), "%.0fk", value / 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.4g", value);
  }
  return text;
}

// "4.66e+10": a FLOP count.
std::string significant(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", value);
  return text;
}

// Days with one decimal, or three significant digits below 10 (a toy budget takes minutes).
std::string days_text(double days) {
  if (days >= 10) {
    return fixed(days, 1);
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", days);
  return text;
}

std::string cost_text(const PlanResult& result, double cost) {
  return compact(cost) + " " + result.request.prices->currency();
}

// "fsdp=128 tensor=2, batch 8 x 4 accumulation, remat full, flash"
std::string configuration_text(const PlanPoint& point) {
  const RankedCandidate& best = point.best;
  std::ostringstream text;
  text << best.estimate.value("mesh", std::string("?")) << ", per_device_batch_size "
       << best.candidate.batch.per_device_batch_size << " x "
       << best.candidate.batch.accumulation_steps << " accumulation, remat " << point.remat
       << ", attention " << best.candidate.attention;
  return text.str();
}

std::string point_summary(const PlanResult& result, const PlanPoint& point) {
  std::string text = point.slice.label() + " (" + std::to_string(point.slice.chips) + " chips), " +
                     configuration_text(point) + ": " + days_text(point.days) + " days, " +
                     compact(point.chip_hours) + " chip-hours";
  if (point.cost) {
    text +=
        ", " + cost_text(result, *point.cost) + " " + consumption_name(result.request.consumption);
  }
  return text;
}

nlohmann::json point_json(const PlanPoint& point, bool on_front) {
  nlohmann::json item;
  item["slice"] = point.slice.label();
  item["hardware"] = point.slice.kind.name;
  item["compile_topology"] = point.slice.slice_name;
  item["num_slices"] = point.slice.num_slices;
  item["chips"] = point.slice.chips;
  item["on_front"] = on_front;
  item["days"] = point.days;
  item["chip_hours"] = point.chip_hours;
  item["cost"] = point.cost ? nlohmann::json(*point.cost) : nlohmann::json(nullptr);
  item["energy_mwh_estimate"] = point.energy_mwh;
  item["meets_deadline"] = point.meets_deadline;
  item["tokens_per_s"] = point.tokens_per_s;
  item["tokens_per_s_per_chip"] = point.best.tokens_per_s_per_chip;
  item["step_time_s"] = point.best.step_time_s;
  item["mfu"] = point.best.mfu;
  item["mesh"] = point.best.estimate.value("mesh", std::string());
  item["per_device_batch_size"] = point.best.candidate.batch.per_device_batch_size;
  item["gradient_accumulation_steps"] = point.best.candidate.batch.accumulation_steps;
  item["remat"] = point.remat;
  item["attention"] = point.best.candidate.attention;
  item["hbm_peak_bytes_per_device"] = point.best.hbm_peak_bytes_per_device;
  item["hbm_capacity_bytes"] = point.best.hbm_capacity_bytes;
  item["hbm_headroom_fraction"] = 1 - point.best.hbm_used_fraction();
  item["args"] = point.best.args;
  item["estimate_command"] = "tpusim estimate " + point.best.args;
  item["maxtext_command"] = maxtext_command(point);
  item["libtpu_init_args"] = point.best.libtpu_init_args;
  item["explore_s"] = point.explore_s;
  return item;
}

std::string outcome_text(const SliceRecord& record) {
  switch (record.outcome) {
    case SliceOutcome::kSearched:
      return "searched";
    case SliceOutcome::kSkippedByBound:
      return "skipped by the FLOPs bound (" + fixed(record.bound_tokens_per_s_per_chip, 0) +
             " <= " + fixed(record.bar_tokens_per_s_per_chip, 0) +
             " tokens/s/chip): " + record.note;
    case SliceOutcome::kBoundedOut:
      return "searched, no configuration above " + fixed(record.bar_tokens_per_s_per_chip, 0) +
             " tokens/s/chip: " + record.note;
    case SliceOutcome::kNothingFits:
      return "nothing fits: " + record.note;
    case SliceOutcome::kRefused:
      return "refused: " + record.note;
  }
  return "";
}

bool on_front(const PlanResult& result, size_t index) {
  return std::find(result.front.begin(), result.front.end(), index) != result.front.end();
}

}  // namespace

std::string maxtext_command(const PlanPoint& point) {
  std::string command;
  if (!point.best.libtpu_init_args.empty()) {
    command += "LIBTPU_INIT_ARGS=\"" + point.best.libtpu_init_args + "\" ";
  }
  command += "python3 -m MaxText.train MaxText/configs/base.yml";
  for (const std::string& item : point.best.maxtext_overrides) {
    command += " " + item;
  }
  return command;
}

std::string plan_recommendation(const PlanResult& result) {
  const PlanRequest& request = result.request;
  std::string text;
  if (!result.pick) {
    text = "No slice of " + std::to_string(result.request.kinds.size()) +
           " hardware kind(s) up to " + std::to_string(request.max_chips) + " chips";
    text += request.deadline_days > 0
                ? " trains " + tokens_text(request.tokens) + " tokens within " +
                      deadline_text(request.deadline_days, false) +
                      " (raise --max-chips or --max-slices, or relax the deadline)."
                : " fits (see the slices below).";
    return text;
  }
  const PlanPoint& pick = result.points[*result.pick];
  text = "Recommendation (least " + std::string(plan_objective_name(request.objective)) +
         (request.deadline_days > 0
              ? " within the " + deadline_text(request.deadline_days, true) + " deadline"
              : std::string()) +
         "): " + point_summary(result, pick) + ".";
  if (!result.near_pick.empty()) {
    text += " Within " + fixed(kNearPick * 100, 0) + "% of its " +
            plan_objective_name(request.objective) +
            " among the slices searched, a difference tpusim does not resolve:";
    for (size_t at = 0; at < result.near_pick.size(); ++at) {
      const PlanPoint& near = result.points[result.near_pick[at]];
      text += std::string(at == 0 ? " " : ", ") + near.slice.label() + " (" + days_text(near.days) +
              " days)";
    }
    text += ".";
  }
  if (result.fastest && *result.fastest != *result.pick) {
    const PlanPoint& fastest = result.points[*result.fastest];
    text += " The fastest found: " + fastest.slice.label() + ", " + days_text(fastest.days) +
            " days for " + compact(fastest.chip_hours) + " chip-hours.";
  }
  text += " Global batch " +
          tokens_text(static_cast<double>(result.global_batch_sequences) *
                      static_cast<double>(result.max_target_length)) +
          " tokens (" + std::to_string(result.global_batch_sequences) + " x " +
          std::to_string(result.max_target_length) + "), from " + request.global_batch.source +
          ": " + tokens_text(request.global_batch.min_tokens) + "-" +
          tokens_text(request.global_batch.max_tokens) + " tokens.";
  return text;
}

void print_plan_text(const PlanResult& result, std::ostream& out) {
  const PlanRequest& request = result.request;
  out << plan_recommendation(result) << "\n\n";
  out << "Pareto front, days against " << (result.front_by_cost ? "cost" : "chip-hours") << " ("
      << result.front.size() << " of " << result.points.size() << " slices searched; "
      << result.points.size() - result.front.size() << " dominated left out"
      << (request.full_front ? "" : "; --full-front searches every slice not proven dominated")
      << "):\n";
  out << std::left << std::setw(16) << "slice" << std::right << std::setw(7) << "chips"
      << std::setw(9) << "days" << std::setw(12) << "chip-hours" << std::setw(12) << "cost"
      << std::setw(12) << "tok/s/chip" << std::setw(8) << "step s" << std::setw(7) << "MFU"
      << std::setw(9) << "HBM free" << std::setw(11) << "MWh (est)"
      << "\n";
  for (const size_t index : result.front) {
    const PlanPoint& point = result.points[index];
    out << std::left << std::setw(16) << point.slice.label() << std::right << std::setw(7)
        << point.slice.chips << std::setw(9) << days_text(point.days) << std::setw(12)
        << compact(point.chip_hours) << std::setw(12)
        << (point.cost ? compact(*point.cost) : std::string("-")) << std::setw(12)
        << fixed(point.best.tokens_per_s_per_chip, 0) << std::setw(8)
        << fixed(point.best.step_time_s, 2) << std::setw(6) << fixed(100 * point.best.mfu, 1) << "%"
        << std::setw(8) << fixed(100 * (1 - point.best.hbm_used_fraction()), 0) << "%"
        << std::setw(11) << fixed(point.energy_mwh, 0)
        << (point.meets_deadline ? "" : "  (misses the deadline)") << "\n";
  }
  out << "(cost: "
      << (request.prices ? request.prices->origin() + ", " + consumption_name(request.consumption) +
                               ", " + request.prices->currency()
                         : std::string("no --prices given"))
      << "; MWh: an estimate from the catalog's per-chip power, configs/hw, not measured)\n";
  for (const size_t index : result.front) {
    const PlanPoint& point = result.points[index];
    out << "\n" << point.slice.label() << ": " << configuration_text(point) << "\n";
    out << "    HBM " << fixed(point.best.hbm_peak_bytes_per_device / kGiB, 1) << " of "
        << fixed(point.best.hbm_capacity_bytes / kGiB, 1) << " GiB per device\n";
    out << "    tpusim estimate " << point.best.args << "\n";
    out << "    MaxText: " << maxtext_command(point) << "\n";
  }
  out << "\nSlices (" << result.slices.size() << ", best bound first; FLOPs bound "
      << significant(result.flops_per_token) << " FLOPs/token at each chip's MXU rate):\n";
  for (const SliceRecord& record : result.slices) {
    out << "  " << std::left << std::setw(16) << record.slice.label() << std::right << std::setw(8)
        << fixed(record.elapsed_s, 1) << " s  " << outcome_text(record) << "\n";
  }
  out << "planned in " << fixed(result.elapsed_s, 1) << " s\n";
}

void print_plan_csv(const PlanResult& result, std::ostream& out) {
  out << "slice,hardware,chips,days,chip_hours,cost,meets_deadline,tokens_per_s_per_chip,"
         "step_time_s,mfu,hbm_headroom_fraction,energy_mwh_estimate,mesh,args,libtpu_init_args\n";
  for (const size_t index : result.front) {
    const PlanPoint& point = result.points[index];
    out << point.slice.label() << "," << point.slice.kind.name << "," << point.slice.chips << ","
        << point.days << "," << point.chip_hours << ","
        << (point.cost ? std::to_string(*point.cost) : std::string()) << ","
        << (point.meets_deadline ? "true" : "false") << "," << point.best.tokens_per_s_per_chip
        << "," << point.best.step_time_s << "," << point.best.mfu << ","
        << 1 - point.best.hbm_used_fraction() << "," << point.energy_mwh << ","
        << point.best.estimate.value("mesh", std::string()) << ",\"" << point.best.args << "\",\""
        << point.best.libtpu_init_args << "\"\n";
  }
}

nlohmann::json plan_json(const PlanResult& result) {
  const PlanRequest& request = result.request;
  nlohmann::json json;
  json["model_name"] = result.model_name;
  json["recommendation"] = plan_recommendation(result);
  nlohmann::json near = nlohmann::json::array();
  for (const size_t index : result.near_pick) {
    near.push_back(result.points[index].slice.label());
  }
  json["near_pick"] = near;
  json["tokens"] = request.tokens;
  json["deadline_days"] =
      request.deadline_days > 0 ? nlohmann::json(request.deadline_days) : nlohmann::json(nullptr);
  json["objective"] = plan_objective_name(request.objective);
  json["hardware"] = nlohmann::json::array();
  for (const HardwareKind& kind : request.kinds) {
    json["hardware"].push_back(kind.name);
  }
  json["max_chips"] = request.max_chips;
  json["max_slices"] = request.max_slices;
  json["full_front"] = request.full_front;
  json["global_batch"] = {
      {"sequences", result.global_batch_sequences},
      {"tokens", result.global_batch_sequences * result.max_target_length},
      {"range_tokens", {request.global_batch.min_tokens, request.global_batch.max_tokens}},
      {"source", request.global_batch.source}};
  json["prices"] = request.prices
                       ? nlohmann::json{{"file", request.prices->origin()},
                                        {"currency", request.prices->currency()},
                                        {"consumption", consumption_name(request.consumption)}}
                       : nlohmann::json(nullptr);
  json["front_against"] = result.front_by_cost ? "cost" : "chip_hours";
  json["flops_per_token"] = result.flops_per_token;
  json["points"] = nlohmann::json::array();
  for (size_t index = 0; index < result.points.size(); ++index) {
    json["points"].push_back(point_json(result.points[index], on_front(result, index)));
  }
  json["front"] = result.front;
  json["pick"] = result.pick ? nlohmann::json(*result.pick) : nlohmann::json(nullptr);
  json["fastest"] = result.fastest ? nlohmann::json(*result.fastest) : nlohmann::json(nullptr);
  json["slices"] = nlohmann::json::array();
  for (const SliceRecord& record : result.slices) {
    json["slices"].push_back(
        {{"slice", record.slice.label()},
         {"chips", record.slice.chips},
         {"outcome", slice_outcome_name(record.outcome)},
         {"bound_tokens_per_s_per_chip", record.bound_tokens_per_s_per_chip},
         {"bar_tokens_per_s_per_chip", record.bar_tokens_per_s_per_chip},
         {"point", record.point ? nlohmann::json(*record.point) : nlohmann::json(nullptr)},
         {"note", record.note},
         {"elapsed_s", record.elapsed_s},
         {"programs_built", record.programs_built},
         {"candidates_evaluated", record.candidates_evaluated}});
  }
  json["elapsed_s"] = result.elapsed_s;
  return json;
}

}  // namespace tpusim
