// sim/cli/validate_pairs.h: `tpusim validate --pairs FILE.csv`, the model judged on differences.
//
// Users act on the change tpusim predicts between two configurations (bf16 or fp8, 64 or 256
// chips, offload on or off). Each row of a pairs file is two runs, A and B, with both measured
// values; the prediction is judged on the ratio B / A:
//   error in points = 100 x (predicted ratio - measured ratio)
// and on its direction wherever the measured change is at least 3% (a smaller change is within
// run-to-run noise, so its sign proves nothing). Step-level pairs (whole training steps) and
// op-level pairs (one op alone, as `tpusim op` times it) are summarized apart.
//
// Columns: id, level (step | op), quantity (step_s | mfu for step pairs; seconds |
// percent_of_peak for op pairs), a, b, measured_a, measured_b, source, config_note.
// A step run is key=value overrides, or `published:ID` (the args of row ID of published.csv
// beside the pairs file), `gpu_published:ID` (the same of gpu_published.csv) or `recipe:ID` (the
// recipe of recipes_public.json beside it: its args, topology and XLA flags). An op run is `KIND
// key=value ...`, as `tpusim op` takes it.
//
// Example:
//   nlohmann::json result = validate_pairs("validation/pairs.csv", MechanismSet());
//   result["pairs"][0]["error_points"];  result["summary"]["step"]["median_abs_points"];
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/mechanisms.h"

namespace tpusim {

// Measured change below which a pair's direction is not judged (3%).
inline constexpr double kPairDirectionThreshold = 0.03;

// Every pair predicted (with `mechanisms` switched on) and compared; UserError naming the file,
// row and column of bad input.
nlohmann::json validate_pairs(const std::string& path, const MechanismSet& mechanisms);

// The text table of validate_pairs' result.
std::string pairs_table(const nlohmann::json& result);

}  // namespace tpusim
