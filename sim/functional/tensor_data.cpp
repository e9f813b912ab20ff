#include "sim/functional/tensor_data.h"

#include <cmath>
#include <stdexcept>

namespace tpusim {

TensorData TensorData::zeros(const Tensor& tensor) {
  std::vector<int64_t> shape;
  for (const Dim& dim : tensor.dims) {
    shape.push_back(dim.size);
  }
  return zeros(std::move(shape));
}

TensorData TensorData::zeros(std::vector<int64_t> shape) {
  TensorData data;
  int64_t count = 1;
  for (const int64_t size : shape) {
    count *= size;
  }
  data.shape = std::move(shape);
  data.values.assign(static_cast<size_t>(count), 0.0f);
  return data;
}

int64_t TensorData::offset(const std::vector<int64_t>& index) const {
  if (index.size() != shape.size()) {
    throw std::logic_error("TensorData: index rank does not match the shape");
  }
  int64_t flat = 0;
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    flat = flat * shape[axis] + index[axis];
  }
  return flat;
}

double relative_l2(const std::vector<float>& actual, const std::vector<float>& reference) {
  double difference = 0;
  double norm = 0;
  for (size_t index = 0; index < actual.size(); ++index) {
    const double delta = static_cast<double>(actual[index]) - reference[index];
    difference += delta * delta;
    norm += static_cast<double>(reference[index]) * reference[index];
  }
  return norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference);
}

}  // namespace tpusim
