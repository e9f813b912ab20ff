#include "model/ir/tensor.h"

namespace tpusim {

const char* tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::kParameter:
      return "parameter";
    case TensorKind::kInput:
      return "input";
    case TensorKind::kActivation:
      return "activation";
    case TensorKind::kGradient:
      return "gradient";
    case TensorKind::kParameterGrad:
      return "parameter_grad";
    case TensorKind::kOptimizerState:
      return "optimizer_state";
    case TensorKind::kScalar:
      return "scalar";
  }
  return "?";
}

int64_t Tensor::num_elements() const {
  int64_t count = 1;
  for (const Dim& dim : dims) {
    count *= dim.size;
  }
  return count;
}

int64_t Tensor::bytes() const {
  return num_elements() * dtype_bytes(dtype);
}

int Tensor::dim_index(std::string_view dim_name) const {
  for (size_t index = 0; index < dims.size(); ++index) {
    if (dims[index].name == dim_name) {
      return static_cast<int>(index);
    }
  }
  return -1;
}

int Tensor::dim_index(const Name& dim_name) const {
  for (size_t index = 0; index < dims.size(); ++index) {
    if (dims[index].name == dim_name) {
      return static_cast<int>(index);
    }
  }
  return -1;
}

std::string Tensor::describe() const {
  std::string text = name + "[";
  for (size_t index = 0; index < dims.size(); ++index) {
    const Dim& dim = dims[index];
    text += (index == 0 ? "" : ",") + dim.name + ":" + std::to_string(dim.size);
    for (size_t axis = 0; axis < dim.sharded_over.size(); ++axis) {
      text += (axis == 0 ? "@" : "+") + dim.sharded_over[axis];
    }
  }
  return text + "] " + dtype_name(dtype);
}

}  // namespace tpusim
