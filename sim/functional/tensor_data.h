// sim/functional/tensor_data.h: the values of one device-local tensor in the functional engine.
//
// Values are float32 (the engine computes in fp32; bf16 IR dtypes are executed in fp32, and
// functional_dtype=bfloat16_matmul rounds matmul inputs to bf16), stored row-major over the
// tensor's LOCAL dims in the order of Tensor::dims.
//
// Example:
//   TensorData x = TensorData::zeros(graph.tensor(id));   // shape from the local dims
//   x.at({b, l, e}) = 1.0f;
#pragma once

#include <cstdint>
#include <vector>

#include "model/ir/tensor.h"

namespace tpusim {

// ||actual - reference|| / ||reference|| (the absolute L2 difference when the reference is all
// zeros): the per-tensor comparison of docs/reference/numerics.md. Same sizes.
double relative_l2(const std::vector<float>& actual, const std::vector<float>& reference);

struct TensorData {
  std::vector<int64_t> shape;
  std::vector<float> values;

  static TensorData zeros(const Tensor& tensor);
  static TensorData zeros(std::vector<int64_t> shape);

  int64_t size() const { return static_cast<int64_t>(values.size()); }
  int64_t bytes() const { return size() * static_cast<int64_t>(sizeof(float)); }
  // Row-major flat index of a multi-index.
  int64_t offset(const std::vector<int64_t>& index) const;
  float& at(const std::vector<int64_t>& index) {
    return values[static_cast<size_t>(offset(index))];
  }
  float at(const std::vector<int64_t>& index) const {
    return values[static_cast<size_t>(offset(index))];
  }
};

}  // namespace tpusim
