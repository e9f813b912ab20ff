// tests/support/one_step.h: one training step of a sharded model, in global (unsharded) arrays,
// and the per-tensor relative L2 error between two such steps.
//
// For tests that compare two configs that should compute the same step (a tiled head against an
// untiled one, a sharded mesh against one device): each runs the same global batch, and its loss,
// gradients and updated weights (with Adam moments) come back by "<region>/<tensor>#<layer>".
// The error measure is docs/reference/numerics.md's: ||a - b|| / ||b|| per tensor.
//
// Example:
//   const OneStep tiled = run_one_step(Config::load("", {"model_name=tiny-llama",
//                                                         "num_vocab_tiling=4"}));
//   const OneStep whole = run_one_step(Config::load("", {"model_name=tiny-llama"}));
//   worst_relative_difference(tiled.gradients, whole.gradients);   // ~1e-7
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace tpusim::testing {

using GlobalArrays = std::map<std::string, std::vector<float>>;

struct OneStep {
  double loss = 0;
  GlobalArrays gradients;
  GlobalArrays state;  // parameters and Adam moments after the update
};

// Step 1 on the config's first training batch (learning rate 1e-3, the config's clipping).
OneStep run_one_step(const Config& config);

// Optional: a checkpoint directory to load the parameters from before the step.
OneStep run_one_step(const Config& config, const std::string& initial_checkpoint);

// The largest per-tensor relative L2 error of `actual` against `expected` (same names and sizes;
// a missing or differently sized tensor fails the calling test). `worst` receives its name.
double worst_relative_difference(const GlobalArrays& actual, const GlobalArrays& expected,
                                 std::string* worst = nullptr);

}  // namespace tpusim::testing
