// tests/sim/functional/kernels/optimizer_test.cpp: the optimizer kernels
// (sim/functional/kernels/optimizer.cpp). The AdamW update against its formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

TEST(KernelAdam, OneStepMatchesFormula) {
  std::mt19937 rng(23);
  Case c;
  const std::vector<Dim> dims = {dim("embed", 3), dim("mlp", 4)};
  std::vector<TensorId> in;
  std::vector<TensorId> out;
  for (const char* name : {"param", "grad", "mu", "nu"}) {
    in.push_back(c.tensor(name, dims));
  }
  for (const char* name : {"param'", "mu'", "nu'"}) {
    out.push_back(c.tensor(name, dims));
  }
  const Op& op = c.op(OpKind::kAdamUpdate, in, out);
  std::vector<TensorData> values = random_inputs(c, in, rng);
  for (float& value : values[3].values) {
    value = std::abs(value);  // nu >= 0
  }
  DeviceContext device;
  device.optimizer.learning_rate = 0.01;
  device.optimizer.step = 3;
  device.optimizer.b1 = 0.9;
  device.optimizer.b2 = 0.95;
  device.optimizer.eps = 1e-8;
  device.optimizer.eps_root = 1e-10;
  device.optimizer.weight_decay = 0.1;
  device.optimizer.gradient_scale = 0.5;
  const std::vector<TensorData> result = run(c.graph, op, values, device);
  std::vector<double> param;
  std::vector<double> mu;
  std::vector<double> nu;
  for (size_t i = 0; i < values[0].values.size(); ++i) {
    const double g = values[1].values[i] * 0.5;
    const double m = 0.9 * values[2].values[i] + 0.1 * g;
    const double v = 0.95 * values[3].values[i] + 0.05 * g * g;
    const double mhat = m / (1 - std::pow(0.9, 3));
    const double vhat = v / (1 - std::pow(0.95, 3));
    param.push_back(values[0].values[i] -
                    0.01 * (mhat / (std::sqrt(vhat + 1e-10) + 1e-8) + 0.1 * values[0].values[i]));
    mu.push_back(m);
    nu.push_back(v);
  }
  expect_close(result[0], param, 1e-6);
  expect_close(result[1], mu, 1e-6);
  expect_close(result[2], nu, 1e-6);
}

// A router bias with MaxText's routed_bias_update_rate r: after AdamW, bias[e] += r sign(sum(load)
// / E - load[e]). Worked by hand: loads (3, 1, 2, 2) over 4 experts balance at 8 / 4 = 2, so at
// r = 0.001 the bias moves by (-0.001, +0.001, 0, 0) beyond its AdamW step; from zero gradients
// and moments that step is the weight decay alone, param (1 - lr weight_decay).
TEST(KernelAdam, RouterBiasMovesTowardItsBalancedLoadAfterTheStep) {
  for (const bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast" : "reference");
    Case c;
    const std::vector<Dim> dims = {dim("experts", 4)};
    std::vector<TensorId> in;
    std::vector<TensorId> out;
    for (const char* name : {"bias", "grad", "mu", "nu", "load"}) {
      in.push_back(c.tensor(name, dims));
    }
    for (const char* name : {"bias'", "mu'", "nu'"}) {
      out.push_back(c.tensor(name, dims));
    }
    const Op& op = c.op(OpKind::kAdamUpdate, in, out);
    std::vector<TensorData> values;
    for (const TensorId id : in) {
      values.push_back(TensorData::zeros(c.info(id)));
    }
    values[0].values = {0.5f, -0.25f, 0.125f, 0.0f};
    values[4].values = {3.0f, 1.0f, 2.0f, 2.0f};
    DeviceContext device;
    device.fast_kernels = fast;
    device.optimizer.learning_rate = 0.01;
    device.optimizer.weight_decay = 0.1;
    device.optimizer.bias_update_rate = 0.001;
    const std::vector<TensorData> result = run(c.graph, op, values, device);
    const double decay = 1 - 0.01 * 0.1;
    expect_close(result[0], {0.5 * decay - 0.001, -0.25 * decay + 0.001, 0.125 * decay, 0.0}, 1e-7);
    EXPECT_EQ(result[1].values, std::vector<float>(4, 0.0f));
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
