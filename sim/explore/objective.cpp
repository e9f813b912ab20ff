#include "sim/explore/objective.h"

#include "common/error.h"

namespace tpusim {

ExploreObjective parse_objective(const std::string& name) {
  if (name == "tokens_per_s_per_chip") {
    return ExploreObjective::kTokensPerSecondPerChip;
  }
  if (name == "mfu") {
    return ExploreObjective::kMfu;
  }
  if (name == "step_time") {
    return ExploreObjective::kStepTime;
  }
  if (name == "tokens_per_dollar") {
    return ExploreObjective::kTokensPerDollar;
  }
  throw UserError("--objective: unknown '" + name +
                  "' (tokens_per_s_per_chip, mfu, step_time, tokens_per_dollar)");
}

const char* objective_name(ExploreObjective objective) {
  switch (objective) {
    case ExploreObjective::kMfu:
      return "mfu";
    case ExploreObjective::kStepTime:
      return "step_time";
    case ExploreObjective::kTokensPerDollar:
      return "tokens_per_dollar";
    case ExploreObjective::kTokensPerSecondPerChip:
      break;
  }
  return "tokens_per_s_per_chip";
}

double objective_value(ExploreObjective objective, double step_seconds, double mfu,
                       double tokens_per_s_per_chip) {
  switch (objective) {
    case ExploreObjective::kMfu:
      return mfu;
    case ExploreObjective::kStepTime:
      return -step_seconds;
    case ExploreObjective::kTokensPerSecondPerChip:
    case ExploreObjective::kTokensPerDollar:
      break;
  }
  return tokens_per_s_per_chip;
}

double objective_upper_bound(ExploreObjective objective, double step_lower_bound,
                             double model_tflops, double mfu_peak, double tokens, double chips) {
  // Bounds summed in another order than the simulator's can exceed its time by a few ulp (and a
  // policy's bound from the none program its own bound likewise): give them that slack.
  step_lower_bound *= 1 - 1e-9;
  switch (objective) {
    case ExploreObjective::kMfu:
      return model_tflops / step_lower_bound / mfu_peak;
    case ExploreObjective::kStepTime:
      return -step_lower_bound;
    case ExploreObjective::kTokensPerSecondPerChip:
    case ExploreObjective::kTokensPerDollar:
      break;
  }
  return tokens / step_lower_bound / chips;
}

}  // namespace tpusim
