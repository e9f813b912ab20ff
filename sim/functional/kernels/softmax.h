// sim/functional/kernels/softmax.h: the max-shifted softmax the kernels take over a few entries
// in double (the compressors' pooling weights, the router's probabilities).
//
// Example: std::vector<double> w = {1.0, 2.0}; softmax_in_place(w);  // w = {0.269, 0.731}
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

namespace tpusim::kernels {

// Replaces `values` by exp(value - max) / sum of them, in order (bit for bit the same on every
// device and whatever the caller's loop).
inline void softmax_in_place(std::span<double> values) {
  double max = -std::numeric_limits<double>::infinity();
  for (const double value : values) {
    max = std::max(max, value);
  }
  double sum = 0;
  for (double& value : values) {
    value = std::exp(value - max);
    sum += value;
  }
  for (double& value : values) {
    value /= sum;
  }
}

}  // namespace tpusim::kernels
