// sim/functional/kernels/context.h: what every kernel family shares (internal to the functional
// engine; the public entry point is sim/functional/kernels.h's run_kernel()).
//
// Conventions shared by every kernel:
//  - TensorData holds float32 values row-major over the tensor's LOCAL dims (Tensor::dims order).
//    Integer inputs (tokens, targets) hold their values as floats.
//  - Dims are matched BY NAME between the tensors of an op, never by position (the few positional
//    conventions are stated per op: the last dim of a norm statistics tensor, of RoPE's input, the
//    first dim of an embedding table).
//  - A split dim's slice on this device starts at device.offset(dim); its global size is
//    dim.global_size (0: the dim is not split and `size` is global).
//  - Reductions accumulate in double; outputs are rounded to float32 once. Einsum GEMMs too:
//    they run in double on the fp32 inputs, so the engine's error against exact (fp64) math is
//    that of its fp32 storage, not of a long fp32 accumulation, and shardings that split a
//    contraction differently agree more closely. (An fp32-accumulated gradient element whose
//    true value is ~1e-9 but whose terms are ~1e-4 carries ~1e-9 of rounding noise, and AdamW's
//    g / (|g| + eps) at eps = 1e-8 turns that into a visibly different update: measured 1.3e-5
//    rel-L2 on one updated weight of tiny-llama at tensor=4.) With device.bf16_matmul_inputs
//    the inputs of einsum and attention matmuls are rounded to bf16 (round-to-nearest-even) and
//    products accumulate in fp32, as on the MXU.
//  - Shape mismatches (wrong input/output counts, a TensorData whose shape differs from its
//    tensor's local dims, dims of the same name with different sizes, missing dims) throw
//    std::logic_error naming the op.
//
// Ctx is one op's view of the graph, its data and its device, with the checks every kernel
// shares; Space and for_each_index walk named dims by strides; round_bf16 is the MXU's rounding.
//
// Example (a family's entry point):
//   void run_copy(const Ctx& ctx) {
//     ctx.expect_counts(1, 1, 1, 1);
//     const Space space = space_without(ctx.out_tensor(0), {});
//     const std::array<std::vector<int64_t>, 2> strides = {
//         ctx.strides_in(ctx.in_tensor(0), space, true, true), strides_of(ctx.out_tensor(0))};
//     for_each_index(space.sizes, strides, [&](const std::array<int64_t, 2>& at) { ... });
//   }
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// GCC 12's AVX-512 intrinsics (-march=native on an AVX-512 host) initialize a dummy register
// with itself, which -Wmaybe-uninitialized reports inside Eigen's GEMM packing: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include "model/ir/graph.h"
#include "sim/functional/device_context.h"
#include "sim/functional/tensor_data.h"

namespace tpusim::kernels {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using DoubleMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Round-to-nearest-even to bfloat16, returned as the float it represents.
inline float round_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u) {
    return value;  // inf and NaN stay as they are
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  return std::bit_cast<float>(bits);
}

inline int64_t to_index(float value) {
  return static_cast<int64_t>(std::llround(value));
}

// Row-major strides of a tensor's local dims.
inline std::vector<int64_t> strides_of(const Tensor& tensor) {
  std::vector<int64_t> strides(tensor.dims.size(), 1);
  for (size_t index = tensor.dims.size(); index > 1; --index) {
    strides[index - 2] = strides[index - 1] * tensor.dims[index - 1].size;
  }
  return strides;
}

// An iteration space: named dims with their local sizes, row-major (last fastest).
struct Space {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;

  void add(const std::string& name, int64_t size) {
    names.push_back(name);
    sizes.push_back(size);
  }
  int64_t count() const {
    int64_t product = 1;
    for (const int64_t size : sizes) {
      product *= size;
    }
    return product;
  }
};

// Calls body(offsets) for every index of `sizes` (row-major), where offsets[t] is the dot product
// of the index with strides[t]. A stride of 0 broadcasts (the tensor lacks that dim).
template <size_t N, typename Body>
void for_each_index(const std::vector<int64_t>& sizes,
                    const std::array<std::vector<int64_t>, N>& strides, Body&& body) {
  for (const int64_t size : sizes) {
    if (size <= 0) {
      return;
    }
  }
  const size_t rank = sizes.size();
  std::vector<int64_t> index(rank, 0);
  std::array<int64_t, N> offsets{};
  for (;;) {
    body(offsets);
    size_t dim = rank;
    for (;;) {
      if (dim == 0) {
        return;
      }
      --dim;
      ++index[dim];
      for (size_t t = 0; t < N; ++t) {
        offsets[t] += strides[t][dim];
      }
      if (index[dim] < sizes[dim]) {
        break;
      }
      for (size_t t = 0; t < N; ++t) {
        offsets[t] -= strides[t][dim] * sizes[dim];
      }
      index[dim] = 0;
    }
  }
}

// What a kernel reads and writes, with the checks every kernel shares.
class Ctx {
 public:
  Ctx(const Graph& graph, const Op& op, const std::vector<const TensorData*>& inputs,
      const std::vector<TensorData*>& outputs, const DeviceContext& device)
      : graph_(graph), op_(op), inputs_(inputs), outputs_(outputs), device_(device) {}

  const Op& op() const { return op_; }
  const DeviceContext& device() const { return device_; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::logic_error(std::string(op_kind_name(op_.kind)) + " '" + op_.name + "': " + what);
  }

  // Checks the data against the graph: counts and every shape.
  void check_shapes() const {
    if (inputs_.size() != op_.inputs.size() || outputs_.size() != op_.outputs.size()) {
      fail("expected " + std::to_string(op_.inputs.size()) + " inputs and " +
           std::to_string(op_.outputs.size()) + " outputs, got " + std::to_string(inputs_.size()) +
           " and " + std::to_string(outputs_.size()));
    }
    for (size_t index = 0; index < inputs_.size(); ++index) {
      check_data(graph_.tensor(op_.inputs[index]), inputs_[index], "input");
    }
    for (size_t index = 0; index < outputs_.size(); ++index) {
      check_data(graph_.tensor(op_.outputs[index]), outputs_[index], "output");
    }
  }

  void expect_counts(size_t min_inputs, size_t max_inputs, size_t min_outputs,
                     size_t max_outputs) const {
    if (inputs_.size() < min_inputs || inputs_.size() > max_inputs ||
        outputs_.size() < min_outputs || outputs_.size() > max_outputs) {
      fail("unexpected number of inputs (" + std::to_string(inputs_.size()) + ") or outputs (" +
           std::to_string(outputs_.size()) + ")");
    }
  }

  const Tensor& in_tensor(size_t index) const { return graph_.tensor(op_.inputs.at(index)); }
  const Tensor& out_tensor(size_t index) const { return graph_.tensor(op_.outputs.at(index)); }
  const float* in(size_t index) const { return inputs_.at(index)->values.data(); }
  // The output, not cleared (for kernels that write every element).
  float* out_unfilled(size_t index) const { return outputs_.at(index)->values.data(); }
  // The output, zero-filled (kernels accumulate into it or leave gaps at zero).
  float* out(size_t index) const {
    std::vector<float>& values = outputs_.at(index)->values;
    std::fill(values.begin(), values.end(), 0.0f);
    return values.data();
  }

  const Dim& dim(const Tensor& tensor, const std::string& name) const {
    const int index = tensor.dim_index(name);
    if (index < 0) {
      fail("tensor '" + tensor.name + "' has no dim '" + name + "'");
    }
    return tensor.dims[static_cast<size_t>(index)];
  }
  int64_t stride(const Tensor& tensor, const std::string& name) const {
    const int index = tensor.dim_index(name);
    if (index < 0) {
      fail("tensor '" + tensor.name + "' has no dim '" + name + "'");
    }
    return strides_of(tensor)[static_cast<size_t>(index)];
  }

  // Strides of `tensor` over `space` by dim name (0 for dims it lacks; with `all`, lacking one
  // fails). Dims it shares with the space must have the same size, and with `exact` it may have
  // no other dims.
  std::vector<int64_t> strides_in(const Tensor& tensor, const Space& space, bool all,
                                  bool exact) const {
    const std::vector<int64_t> own = strides_of(tensor);
    std::vector<int64_t> result(space.names.size(), 0);
    size_t found = 0;
    for (size_t index = 0; index < space.names.size(); ++index) {
      const int dim = tensor.dim_index(space.names[index]);
      if (dim < 0) {
        if (all) {
          fail("tensor '" + tensor.name + "' has no dim '" + space.names[index] + "'");
        }
        continue;
      }
      if (tensor.dims[static_cast<size_t>(dim)].size != space.sizes[index]) {
        fail("dim '" + space.names[index] + "' of '" + tensor.name + "' has size " +
             std::to_string(tensor.dims[static_cast<size_t>(dim)].size) + ", expected " +
             std::to_string(space.sizes[index]));
      }
      result[index] = own[static_cast<size_t>(dim)];
      ++found;
    }
    if (exact && found != tensor.dims.size()) {
      fail("tensor '" + tensor.name + "' has dims the op does not expect");
    }
    return result;
  }

  float load(float value) const { return device_.bf16_matmul_inputs ? round_bf16(value) : value; }

 private:
  void check_data(const Tensor& tensor, const TensorData* data, const char* what) const {
    if (data == nullptr) {
      fail(std::string("missing ") + what + " '" + tensor.name + "'");
    }
    bool same = data->shape.size() == tensor.dims.size();
    int64_t count = 1;
    for (size_t index = 0; same && index < tensor.dims.size(); ++index) {
      same = data->shape[index] == tensor.dims[index].size;
      count *= tensor.dims[index].size;
    }
    if (!same || data->size() != count) {
      fail(std::string(what) + " '" + tensor.name + "' data does not match its local dims");
    }
  }

  const Graph& graph_;
  const Op& op_;
  const std::vector<const TensorData*>& inputs_;
  const std::vector<TensorData*>& outputs_;
  const DeviceContext& device_;
};

// The dims of `tensor` except `skipped`, in its order.
inline Space space_without(const Tensor& tensor, const std::vector<std::string>& skipped) {
  Space space;
  for (const Dim& dim : tensor.dims) {
    if (std::find(skipped.begin(), skipped.end(), dim.name) == skipped.end()) {
      space.add(dim.name, dim.size);
    }
  }
  return space;
}

inline bool has_dim(const Tensor& tensor, const std::string& name) {
  return tensor.dim_index(name) >= 0;
}

// Same dim names and local sizes in the same order.
inline bool same_dims(const Tensor& a, const Tensor& b) {
  if (a.dims.size() != b.dims.size()) {
    return false;
  }
  for (size_t index = 0; index < a.dims.size(); ++index) {
    if (a.dims[index].name != b.dims[index].name || a.dims[index].size != b.dims[index].size) {
      return false;
    }
  }
  return true;
}

// The offset in `tensor` of every index of `space` (row-major; dims matched by name, all present).
inline std::vector<int64_t> offsets_of(const Ctx& ctx, const Tensor& tensor, const Space& space) {
  std::vector<int64_t> offsets;
  const std::array<std::vector<int64_t>, 1> strides = {ctx.strides_in(tensor, space, true, false)};
  for_each_index(space.sizes, strides,
                 [&](const std::array<int64_t, 1>& at) { offsets.push_back(at[0]); });
  return offsets;
}

}  // namespace tpusim::kernels
