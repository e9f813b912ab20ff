// sim/plan/plan_output.h: what `tpusim plan` prints: a one-paragraph recommendation, the Pareto
// front as a table (every point listed is on it; dominated points are left out and counted),
// each front point's configuration and the commands that reproduce it, and what became of every
// slice; or the same as JSON or CSV.
//
// Example:
//   const PlanResult result = plan(config, request);
//   std::cout << plan_recommendation(result);  // "Recommendation: tpusim7x-256 ... days ..."
//   print_plan_text(result, std::cout);
//   plan_json(result).dump(2);
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/plan/planner.h"

namespace tpusim {

std::string plan_recommendation(const PlanResult& result);

void print_plan_text(const PlanResult& result, std::ostream& out);

// One row per front point: slice, chips, days, chip-hours, cost, tokens/s, step time, mesh, args.
void print_plan_csv(const PlanResult& result, std::ostream& out);

nlohmann::json plan_json(const PlanResult& result);

// "python3 -m MaxText.train ..." with LIBTPU_INIT_ARGS when the point needs flags.
std::string maxtext_command(const PlanPoint& point);

}  // namespace tpusim
