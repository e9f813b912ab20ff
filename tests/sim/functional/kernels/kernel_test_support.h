// tests/sim/functional/kernels/kernel_test_support.h: the method and helpers of the kernel tests,
// table-driven in the spirit of ggml's test-backend-ops: tiny one-op graphs built by hand
// (Case), random inputs from a fixed seed, and
//  (1) every forward op against a naive reference written here;
//  (2) every backward kernel against central finite differences of its forward op: for
//      L = sum(w * forward(inputs)) with random w, the VJP kernel fed w must give dL/d(input)
//      (error = max |analytic - numeric| / max |numeric|, required < 1e-3);
//  (3) split-dim semantics: a computation split over two simulated devices (statistics combined
//      here as the engine would) equals the unsplit one;
//  (4) AdamW against its formula;
//  (5) every op kind run_kernel executes has a test case in this folder (KernelCoverage).
// One file per op family beside it (<family>_test.cpp, as sim/functional/kernels/<family>.cpp);
// kernel_table_test.cpp fails when an op kind has a kernel but no test case.
//
// Example:
//   Case c;
//   const TensorId x = c.tensor("x", activation_dims());
//   const Op& op = c.op(OpKind::kRope, {x}, {c.tensor("y", activation_dims())});
//   expect_close(run(c.graph, op, {random_data(c.info(x), rng)})[0], expected);
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sharding/mesh.h"
#include "sim/functional/kernels.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernel_test {

inline constexpr double kFdTolerance = 1e-3;
inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

inline Dim dim(const std::string& name, int64_t size) {
  return Dim{name, size, ""};
}

// A dim split over mesh axis `axis`: `local` of `global` elements on each device.
inline Dim split(const std::string& name, int64_t local, int64_t global, const std::string& axis) {
  Dim result{name, local, ""};
  result.global_size = global;
  result.sharded_over = {axis};
  return result;
}

// A device at `coordinate` of `size` along mesh axis `axis` (every other axis of size 1).
inline DeviceContext device_on(const std::string& axis, int coordinate, int size) {
  DeviceContext device;
  device.sizes.fill(1);
  const auto index = static_cast<size_t>(mesh_axis_index(axis));
  device.coordinates[index] = coordinate;
  device.sizes[index] = size;
  return device;
}

// A graph holding the ops of one test, in a forward and a backward region.
struct Case {
  Graph graph;
  int forward = graph.add_region("forward", 1, Phase::kForward);
  int backward = graph.add_region("backward", 1, Phase::kBackward);

  TensorId tensor(const std::string& name, std::vector<Dim> dims,
                  TensorKind kind = TensorKind::kActivation) {
    return graph.add_tensor(name, std::move(dims), DType::kF32, kind, forward);
  }
  const Op& op(OpKind kind, std::vector<TensorId> inputs, std::vector<TensorId> outputs,
               OpAttrs attrs = {}, bool backward_phase = false) {
    const int id = graph.add_op(kind, op_kind_name(kind), std::move(inputs), std::move(outputs),
                                std::move(attrs), backward_phase ? backward : forward);
    return graph.ops()[static_cast<size_t>(id)];
  }
  const Tensor& info(TensorId id) const { return graph.tensor(id); }
};

inline std::vector<TensorData> run(const Graph& graph, const Op& op,
                                   const std::vector<TensorData>& inputs,
                                   const DeviceContext& device = {}) {
  std::vector<const TensorData*> in;
  for (const TensorData& data : inputs) {
    in.push_back(&data);
  }
  std::vector<TensorData> out;
  for (const TensorId id : op.outputs) {
    out.push_back(TensorData::zeros(graph.tensor(id)));
  }
  std::vector<TensorData*> out_pointers;
  for (TensorData& data : out) {
    out_pointers.push_back(&data);
  }
  run_kernel(graph, op, in, out_pointers, device);
  return out;
}

inline TensorData random_data(const Tensor& tensor, std::mt19937& rng, float low = -1,
                              float high = 1) {
  TensorData data = TensorData::zeros(tensor);
  std::uniform_real_distribution<float> uniform(low, high);
  for (float& value : data.values) {
    value = uniform(rng);
  }
  return data;
}

inline TensorData random_ints(const Tensor& tensor, std::mt19937& rng, int high) {
  TensorData data = TensorData::zeros(tensor);
  std::uniform_int_distribution<int> uniform(0, high - 1);
  for (float& value : data.values) {
    value = static_cast<float>(uniform(rng));
  }
  return data;
}

// Elements [begin, begin + count) of `axis`.
inline TensorData slice(const TensorData& data, size_t axis, int64_t begin, int64_t count) {
  std::vector<int64_t> shape = data.shape;
  shape[axis] = count;
  TensorData result = TensorData::zeros(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t flat = 0; flat < result.size(); ++flat) {
    std::vector<int64_t> source = index;
    source[axis] += begin;
    result.values[static_cast<size_t>(flat)] = data.at(source);
    for (size_t d = shape.size(); d > 0; --d) {
      if (++index[d - 1] < shape[d - 1]) {
        break;
      }
      index[d - 1] = 0;
    }
  }
  return result;
}

// max |a - b| / max(max |b|, floor).
inline double max_relative_error(const std::vector<float>& a, const std::vector<double>& b,
                                 double floor = 1e-6) {
  EXPECT_EQ(a.size(), b.size());
  double error = 0;
  double scale = floor;
  for (size_t index = 0; index < std::min(a.size(), b.size()); ++index) {
    error = std::max(error, std::abs(static_cast<double>(a[index]) - b[index]));
    scale = std::max(scale, std::abs(b[index]));
  }
  return error / scale;
}

inline std::vector<double> as_double(const TensorData& data) {
  return {data.values.begin(), data.values.end()};
}

inline void expect_close(const TensorData& actual, const std::vector<double>& expected,
                         double tolerance = 1e-5) {
  EXPECT_EQ(actual.size(), static_cast<int64_t>(expected.size()));
  EXPECT_LT(max_relative_error(actual.values, expected), tolerance);
}

inline void expect_close(const TensorData& actual, const TensorData& expected,
                         double tolerance = 1e-5) {
  EXPECT_EQ(actual.shape, expected.shape);
  expect_close(actual, as_double(expected), tolerance);
}

// --- finite differences ---------------------------------------------------------------------

// Largest finite-difference error seen per check name (printed at the end of the run).
inline std::map<std::string, double>& fd_errors() {
  static std::map<std::string, double> errors;
  return errors;
}

// Checks `analytic` = d/d inputs[which] of L = sum(weights * forward(inputs)) by central
// differences (double accumulation; each step is the float-rounded one actually taken). Only
// elements with perturbed(index) are checked.
inline void expect_fd(const std::string& name, const Graph& graph, const Op& forward,
                      std::vector<TensorData> inputs, const std::vector<TensorData>& weights,
                      size_t which, const TensorData& analytic, const DeviceContext& device = {},
                      double step = 1e-2, const std::function<bool(int64_t)>& perturbed = nullptr) {
  auto loss = [&](const std::vector<TensorData>& values) {
    const std::vector<TensorData> outputs = run(graph, forward, values, device);
    double total = 0;
    for (size_t out = 0; out < outputs.size(); ++out) {
      for (size_t index = 0; index < outputs[out].values.size(); ++index) {
        total += static_cast<double>(outputs[out].values[index]) * weights[out].values[index];
      }
    }
    return total;
  };
  ASSERT_EQ(analytic.shape, inputs[which].shape) << name;
  std::vector<float> checked;
  std::vector<double> numeric;
  for (int64_t index = 0; index < inputs[which].size(); ++index) {
    if (perturbed && !perturbed(index)) {
      continue;
    }
    float& value = inputs[which].values[static_cast<size_t>(index)];
    const float original = value;
    const auto plus = static_cast<float>(original + step);
    const auto minus = static_cast<float>(original - step);
    value = plus;
    const double up = loss(inputs);
    value = minus;
    const double down = loss(inputs);
    value = original;
    numeric.push_back((up - down) / (static_cast<double>(plus) - static_cast<double>(minus)));
    checked.push_back(analytic.values[static_cast<size_t>(index)]);
  }
  const double error = max_relative_error(checked, numeric);
  double& worst = fd_errors()[name];
  worst = std::max(worst, error);
  EXPECT_LT(error, kFdTolerance) << name;
}

inline std::vector<TensorData> random_weights(const Graph& graph, const Op& op, std::mt19937& rng) {
  std::vector<TensorData> weights;
  for (const TensorId id : op.outputs) {
    weights.push_back(random_data(graph.tensor(id), rng));
  }
  return weights;
}

inline float to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits = (bits + 0x7fffu + lsb) & 0xffff0000u;
  return std::bit_cast<float>(bits);
}

inline std::vector<Dim> activation_dims() {
  return {dim("batch", 2), dim("length", 3), dim("embed", 4)};
}

inline std::vector<Dim> token_dims() {
  return {dim("batch", 2), dim("length", 3)};
}

inline std::vector<TensorData> random_inputs(const Case& c, const std::vector<TensorId>& ids,
                                             std::mt19937& rng) {
  std::vector<TensorData> values;
  for (const TensorId id : ids) {
    values.push_back(random_data(c.info(id), rng));
  }
  return values;
}

}  // namespace tpusim::kernel_test
