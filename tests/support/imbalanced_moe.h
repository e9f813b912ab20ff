// tests/support/imbalanced_moe.h: a tiny-moe checkpoint whose router is deliberately unbalanced.
//
// Every token's residual stream gets a shared component (+3 on each embedding element), and the
// router's gate columns for experts 0 and 1 point along it (2.0 and 1.0 x the unit vector), so
// every token of every MoE layer picks experts 0 and 1: 100% of the tokens each, where balanced
// top-2 routing of 4 experts gives 50%. A capacity_factor=1 dispatch drops half of those choices;
// a dropless one must keep them all.
//
// Example:
//   const std::string path = write_imbalanced_moe_checkpoint(::testing::TempDir() + "moe");
//   Config config = Config::load("", {"model_name=tiny-moe", "load_parameters_path=" + path});
#pragma once

#include <string>

namespace tpusim::testing {

// Writes the checkpoint (parameters from init_weights_seed 0, then skewed) to `directory` and
// returns it.
std::string write_imbalanced_moe_checkpoint(const std::string& directory);

}  // namespace tpusim::testing
