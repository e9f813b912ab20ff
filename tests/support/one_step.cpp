#include "tests/support/one_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/builder/build_options.h"
#include "sim/functional/tensor_data.h"
#include "sim/train/checkpoint.h"
#include "sim/train/dataset.h"
#include "sim/train/trainer.h"

namespace tpusim::testing {

OneStep run_one_step(const Config& config) {
  return run_one_step(config, "");
}

OneStep run_one_step(const Config& config, const std::string& initial_checkpoint) {
  ShardedModel model(config);
  if (!initial_checkpoint.empty()) {
    model.restore(load_checkpoint(initial_checkpoint), /*with_optimizer=*/false);
  }
  const Dataset data = Dataset::from_config(config);
  std::vector<Batch> batches;
  for (int64_t micro = 0; micro < model.program().accumulation_steps; ++micro) {
    batches.push_back(data.train_batch(0, micro, model.program().microbatch));
  }
  const StepResult result = model.compute_gradients(batches);
  OneStep step;
  step.loss = result.loss;
  step.gradients = model.global_gradients();
  DeviceContext::Optimizer optimizer;
  optimizer.learning_rate = 1e-3;
  optimizer.step = 1;
  const double clip = config.get_float("gradient_clipping_threshold");
  optimizer.gradient_scale = clip > 0 ? clip / std::max(result.grad_norm, clip) : 1.0;
  // A router bias's update after AdamW (deepseek4 with routed_bias_update_rate), as train sets it.
  optimizer.bias_update_rate = routed_bias_update_rate_from_config(config);
  model.apply_update(optimizer);
  step.state = model.global_state();
  return step;
}

double worst_relative_difference(const GlobalArrays& actual, const GlobalArrays& expected,
                                 std::string* worst) {
  double largest = 0;
  EXPECT_EQ(actual.size(), expected.size());
  for (const auto& [name, values] : actual) {
    const auto found = expected.find(name);
    if (found == expected.end() || found->second.size() != values.size()) {
      ADD_FAILURE() << "no matching '" << name << "' in the expected arrays";
      continue;
    }
    const double relative = relative_l2(values, found->second);
    if (relative >= largest) {
      largest = relative;
      if (worst != nullptr) {
        *worst = name;
      }
    }
  }
  return largest;
}

}  // namespace tpusim::testing
