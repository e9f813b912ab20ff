// sim/plan/plan_html.h: `tpusim plan --html`: a self-contained page with the recommendation, the
// searched slices plotted as days against chip-hours (or cost) with the Pareto front joined, and
// each point's configuration and reproduce commands (hover a point, or read the table).
//
// Example:
//   write_file_atomically("plan.html", plan_html(result, "tpusim plan model_name=..."));
#pragma once

#include <string>

#include "sim/plan/planner.h"

namespace tpusim {

std::string plan_html(const PlanResult& result, const std::string& command_line);

}  // namespace tpusim
