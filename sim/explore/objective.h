// sim/explore/objective.h: what `tpusim explore` ranks candidates by, and the best value a
// candidate could still reach (for branch and bound).
//
// Every objective is "larger is better": step time is ranked by its negative.
//
// Example:
//   ExploreObjective objective = parse_objective("mfu");
//   objective_value(objective, /*step_seconds=*/2.0, /*mfu=*/0.41, /*tokens_per_s_per_chip=*/900);
//   // 0.41
//   objective_upper_bound(objective, /*step_lower_bound=*/1.5, model_tflops, peak, tokens, chips);
//   // the MFU of a step that took only 1.5 s: no candidate with that bound can do better
#pragma once

#include <string>

namespace tpusim {

enum class ExploreObjective { kTokensPerSecondPerChip, kMfu, kStepTime, kTokensPerDollar };

// "tokens_per_s_per_chip" (default), "mfu", "step_time", "tokens_per_dollar"; UserError else.
ExploreObjective parse_objective(const std::string& name);
const char* objective_name(ExploreObjective objective);

// The objective of a timed candidate.
double objective_value(ExploreObjective objective, double step_seconds, double mfu,
                       double tokens_per_s_per_chip);

// The best objective still open to a candidate whose step takes at least `step_lower_bound`.
double objective_upper_bound(ExploreObjective objective, double step_lower_bound,
                             double model_tflops, double mfu_peak, double tokens, double chips);

}  // namespace tpusim
