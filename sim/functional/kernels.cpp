// sim/functional/kernels.cpp: the numerics of every compute op, on one device's local shards.
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
#include "sim/functional/kernels.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// GCC 12's AVX-512 intrinsics (-march=native on an AVX-512 host) initialize a dummy register
// with itself, which -Wmaybe-uninitialized reports inside Eigen's GEMM packing: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

namespace tpusim {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using DoubleMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Round-to-nearest-even to bfloat16, returned as the float it represents.
float round_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u) {
    return value;  // inf and NaN stay as they are
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  return std::bit_cast<float>(bits);
}

int64_t to_index(float value) {
  return static_cast<int64_t>(std::llround(value));
}

// Row-major strides of a tensor's local dims.
std::vector<int64_t> strides_of(const Tensor& tensor) {
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
Space space_without(const Tensor& tensor, const std::vector<std::string>& skipped) {
  Space space;
  for (const Dim& dim : tensor.dims) {
    if (std::find(skipped.begin(), skipped.end(), dim.name) == skipped.end()) {
      space.add(dim.name, dim.size);
    }
  }
  return space;
}

bool has_dim(const Tensor& tensor, const std::string& name) {
  return tensor.dim_index(name) >= 0;
}

// Same dim names and local sizes in the same order.
bool same_dims(const Tensor& a, const Tensor& b) {
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

// ------------------------------------------------------------------------------------------------
// kEinsum(A, B) -> C
//   C[out dims] = sum over the dims named in attrs.contracted of A * B. Every other dim passes
//   through by name: a dim of A, B and C is a batch dim; of A and C only, a row dim (M); of B and
//   C only, a column dim (N). A contracted dim present in both operands is a K dim; one present in
//   only one operand is summed out of that operand first. Any other dim (in C but in neither
//   operand, in an operand but neither in C nor contracted) is a shape error. Split contracted
//   dims give partial sums (the engine reduces them). Computed as per-batch Eigen GEMMs of the
//   operands packed to [batch, M, K] x [batch, K, N], accumulated in double (in fp32 with
//   bf16_matmul_inputs).
// ------------------------------------------------------------------------------------------------
// The offset in `tensor` of every index of `space` (row-major; dims matched by name, all present).
std::vector<int64_t> offsets_of(const Ctx& ctx, const Tensor& tensor, const Space& space) {
  std::vector<int64_t> offsets;
  const std::array<std::vector<int64_t>, 1> strides = {ctx.strides_in(tensor, space, true, false)};
  for_each_index(space.sizes, strides,
                 [&](const std::array<int64_t, 1>& at) { offsets.push_back(at[0]); });
  return offsets;
}

// ------------------------------------------------------------------------------------------------
// kEinsum(A, B, row_experts) -> C: a grouped matmul over the rows of a dropless MoE buffer
//   (model/ir/op.h). row_experts[experts, expert_tokens] names the ROW dims and holds each row's
//   expert (-1: an empty row). Of A, B and C exactly one lacks expert_tokens: the expert tensor,
//   whose experts dim IS the expert index (global = local + device.offset). Either
//   (a) C and one operand X are row tensors, the other operand W the expert tensor: each row r of
//       expert e: C[r] = sum over attrs.contracted of X[r] W[e]; empty rows give 0; or
//   (b) C is the expert tensor, A and B row tensors: C[e] = sum over the rows r of expert e of
//       A[r] (x) B[r] (outer product of their non-row dims; attrs.contracted = {expert_tokens}).
//   A row of an expert this device does not hold is an error. Per expert one GEMM of its rows,
//   accumulated in double (float with bf16_matmul_inputs), like the dense einsum.
// ------------------------------------------------------------------------------------------------
template <typename Scalar>
void run_grouped_einsum(const Ctx& ctx) {
  using Rows = std::vector<int64_t>;
  const Tensor& rows_tensor = ctx.in_tensor(2);
  if (rows_tensor.dims.size() != 2 || !has_dim(rows_tensor, "experts") ||
      !has_dim(rows_tensor, "expert_tokens")) {
    ctx.fail("row_experts '" + rows_tensor.name + "' must be [experts, expert_tokens]");
  }
  const Space rows = space_without(rows_tensor, {});
  const std::array<const Tensor*, 3> tensors = {&ctx.in_tensor(0), &ctx.in_tensor(1),
                                                &ctx.out_tensor(0)};
  int expert_side = -1;
  for (int index = 0; index < 3; ++index) {
    if (!has_dim(*tensors[static_cast<size_t>(index)], "expert_tokens")) {
      if (expert_side >= 0) {
        ctx.fail("a grouped matmul has one expert tensor (without expert_tokens)");
      }
      expert_side = index;
    }
  }
  if (expert_side < 0) {
    ctx.fail("a grouped matmul needs an expert tensor (without expert_tokens)");
  }
  const Tensor& expert_tensor = *tensors[static_cast<size_t>(expert_side)];
  const Dim& experts = ctx.dim(expert_tensor, "experts");
  const int64_t expert_offset = ctx.device().offset(experts);
  const int64_t expert_stride = ctx.stride(expert_tensor, "experts");
  // The rows of each of this device's experts, as indices row-major over `rows`.
  std::vector<Rows> members(static_cast<size_t>(experts.size));
  {
    const float* ids = ctx.in(2);
    int64_t row = 0;
    const std::array<std::vector<int64_t>, 1> strides = {
        ctx.strides_in(rows_tensor, rows, true, true)};
    for_each_index(rows.sizes, strides, [&](const std::array<int64_t, 1>& at) {
      const int64_t expert = to_index(ids[at[0]]);
      if (expert >= 0) {
        const int64_t local = expert - expert_offset;
        if (local < 0 || local >= experts.size) {
          ctx.fail("row of expert " + std::to_string(expert) + " on a device holding experts [" +
                   std::to_string(expert_offset) + ", " +
                   std::to_string(expert_offset + experts.size) + ")");
        }
        members[static_cast<size_t>(local)].push_back(row);
      }
      ++row;
    });
  }
  const std::vector<std::string> row_names = {"experts", "expert_tokens"};
  const auto offsets = [&](const Tensor& tensor, const Space& space) {
    return offsets_of(ctx, tensor, space);
  };
  const auto count_dims = [&](const Tensor& tensor, size_t expected) {
    if (tensor.dims.size() != expected) {
      ctx.fail("tensor '" + tensor.name + "' has dims the grouped matmul does not expect");
    }
  };
  float* out = ctx.out(0);
  if (expert_side == 2) {
    // (b) C[e] = sum over e's rows of A[r] (x) B[r].
    const Tensor& a = ctx.in_tensor(0);
    const Tensor& b = ctx.in_tensor(1);
    const Tensor& c = ctx.out_tensor(0);
    const Space p = space_without(a, row_names);
    const Space q = space_without(b, row_names);
    count_dims(c, 1 + p.names.size() + q.names.size());
    const Rows a_rows = offsets(a, rows);
    const Rows b_rows = offsets(b, rows);
    const Rows a_features = offsets(a, p);
    const Rows b_features = offsets(b, q);
    const Rows c_p = offsets(c, p);
    const Rows c_q = offsets(c, q);
    const float* a_values = ctx.in(0);
    const float* b_values = ctx.in(1);
    for (int64_t e = 0; e < experts.size; ++e) {
      const Rows& members_e = members[static_cast<size_t>(e)];
      const auto n = static_cast<int64_t>(members_e.size());
      Matrix<Scalar> lhs(n, static_cast<int64_t>(a_features.size()));
      Matrix<Scalar> rhs(n, static_cast<int64_t>(b_features.size()));
      for (int64_t i = 0; i < n; ++i) {
        const auto row = static_cast<size_t>(members_e[static_cast<size_t>(i)]);
        for (size_t j = 0; j < a_features.size(); ++j) {
          lhs(i, static_cast<int64_t>(j)) =
              static_cast<Scalar>(ctx.load(a_values[a_rows[row] + a_features[j]]));
        }
        for (size_t j = 0; j < b_features.size(); ++j) {
          rhs(i, static_cast<int64_t>(j)) =
              static_cast<Scalar>(ctx.load(b_values[b_rows[row] + b_features[j]]));
        }
      }
      const Matrix<Scalar> product = lhs.transpose() * rhs;
      for (size_t i = 0; i < c_p.size(); ++i) {
        for (size_t j = 0; j < c_q.size(); ++j) {
          out[e * expert_stride + c_p[i] + c_q[j]] =
              static_cast<float>(product(static_cast<int64_t>(i), static_cast<int64_t>(j)));
        }
      }
    }
    return;
  }
  // (a) C[r] = X[r] W[e] over the contracted dims.
  const size_t x_side = expert_side == 0 ? 1 : 0;
  const Tensor& x = ctx.in_tensor(x_side);
  const Tensor& w = expert_tensor;
  const Tensor& c = ctx.out_tensor(0);
  Space k;
  for (const std::string& name : ctx.op().attrs.contracted) {
    k.add(name, ctx.dim(w, name).size);
  }
  std::vector<std::string> not_n = ctx.op().attrs.contracted;
  not_n.emplace_back("experts");
  const Space n = space_without(w, not_n);
  count_dims(x, 2 + k.names.size());
  count_dims(c, 2 + n.names.size());
  const Rows x_rows = offsets(x, rows);
  const Rows c_rows = offsets(c, rows);
  const Rows x_k = offsets(x, k);
  const Rows w_k = offsets(w, k);
  const Rows w_n = offsets(w, n);
  const Rows c_n = offsets(c, n);
  const float* x_values = ctx.in(x_side);
  const float* w_values = ctx.in(static_cast<size_t>(expert_side));
  for (int64_t e = 0; e < experts.size; ++e) {
    const Rows& members_e = members[static_cast<size_t>(e)];
    if (members_e.empty()) {
      continue;
    }
    const auto m = static_cast<int64_t>(members_e.size());
    Matrix<Scalar> lhs(m, static_cast<int64_t>(x_k.size()));
    for (int64_t i = 0; i < m; ++i) {
      const auto row = static_cast<size_t>(members_e[static_cast<size_t>(i)]);
      for (size_t j = 0; j < x_k.size(); ++j) {
        lhs(i, static_cast<int64_t>(j)) =
            static_cast<Scalar>(ctx.load(x_values[x_rows[row] + x_k[j]]));
      }
    }
    Matrix<Scalar> rhs(static_cast<int64_t>(w_k.size()), static_cast<int64_t>(w_n.size()));
    for (size_t i = 0; i < w_k.size(); ++i) {
      for (size_t j = 0; j < w_n.size(); ++j) {
        rhs(static_cast<int64_t>(i), static_cast<int64_t>(j)) =
            static_cast<Scalar>(ctx.load(w_values[e * expert_stride + w_k[i] + w_n[j]]));
      }
    }
    const Matrix<Scalar> product = lhs * rhs;
    for (int64_t i = 0; i < m; ++i) {
      const auto row = static_cast<size_t>(members_e[static_cast<size_t>(i)]);
      for (size_t j = 0; j < c_n.size(); ++j) {
        out[c_rows[row] + c_n[j]] = static_cast<float>(product(i, static_cast<int64_t>(j)));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The fast einsum (functional_precision=fast): fp32 GEMMs on operands used in place where their
// layout allows, the work cut into items by the shapes alone (never by the thread count), so the
// result is bitwise the same on any number of kernel threads.
// ------------------------------------------------------------------------------------------------
// Row-major strides of a packed iteration space.
std::vector<int64_t> strides_of_space(const Space& space) {
  std::vector<int64_t> strides(space.names.size(), 1);
  for (size_t index = space.names.size(); index > 1; --index) {
    strides[index - 2] = strides[index - 1] * space.sizes[index - 1];
  }
  return strides;
}

// Whether `tensor`'s dims are exactly the dims of `parts`, in that order.
bool laid_out_as(const Tensor& tensor, std::initializer_list<const Space*> parts) {
  size_t at = 0;
  for (const Space* part : parts) {
    for (const std::string& name : part->names) {
      if (at >= tensor.dims.size() || tensor.dims[at].name != name) {
        return false;
      }
      ++at;
    }
  }
  return at == tensor.dims.size();
}

// A [batch, rows, cols] matrix per batch index: row-major, or (transposed) stored as
// [batch, cols, rows] row-major, i.e. column-major.
struct EinsumOperand {
  const float* data;
  bool transposed;
};

using ColMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// C[i] = A[i] B[i] for every batch index i; A is m x k, B k x n, C m x n.
void fast_gemms(const Ctx& ctx, const EinsumOperand& a, const EinsumOperand& b,
                const EinsumOperand& c, int64_t nb, int64_t m, int64_t n, int64_t k) {
  // Items: each batch index's product, cut into blocks of rows (or of columns when they are
  // fewer) of at least kMinBlock, at most kMaxBlocks per product.
  constexpr int64_t kMinBlock = 128;
  constexpr int64_t kMaxBlocks = 8;
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  int64_t block = std::max(kMinBlock, (extent + kMaxBlocks - 1) / kMaxBlocks);
  block = (block + 15) / 16 * 16;
  const int64_t blocks = std::max<int64_t>(1, (extent + block - 1) / block);
  float* c_data = const_cast<float*>(c.data);
  const auto item = [&](int64_t index) {
    const int64_t batch = index / blocks;
    const int64_t start = (index % blocks) * block;
    const int64_t size = std::min(block, extent - start);
    if (size <= 0) {
      return;
    }
    const float* a_data = a.data + batch * m * k;
    const float* b_data = b.data + batch * k * n;
    float* out = c_data + batch * m * n;
    const auto multiply = [&](const auto& lhs, const auto& rhs) {
      const auto assign = [&](auto& product) {
        if (by_rows) {
          product.middleRows(start, size).noalias() = lhs.middleRows(start, size) * rhs;
        } else {
          product.middleCols(start, size).noalias() = lhs * rhs.middleCols(start, size);
        }
      };
      if (c.transposed) {
        Eigen::Map<ColMatrix> product(out, m, n);
        assign(product);
      } else {
        Eigen::Map<RowMatrix> product(out, m, n);
        assign(product);
      }
    };
    const auto with_rhs = [&](const auto& lhs) {
      if (b.transposed) {
        multiply(lhs, Eigen::Map<const ColMatrix>(b_data, k, n));
      } else {
        multiply(lhs, Eigen::Map<const RowMatrix>(b_data, k, n));
      }
    };
    if (a.transposed) {
      with_rhs(Eigen::Map<const ColMatrix>(a_data, m, k));
    } else {
      with_rhs(Eigen::Map<const RowMatrix>(a_data, m, k));
    }
  };
  if (m == 0 || n == 0) {
    return;
  }
  parallel_for(ctx.device().threads, nb * blocks, item);
}

void run_einsum(const Ctx& ctx) {
  ctx.expect_counts(2, 3, 1, 1);
  if (ctx.num_inputs() == 3) {
    if (ctx.device().bf16_matmul_inputs) {
      run_grouped_einsum<float>(ctx);
    } else {
      run_grouped_einsum<double>(ctx);
    }
    return;
  }
  const Tensor& a = ctx.in_tensor(0);
  const Tensor& b = ctx.in_tensor(1);
  const Tensor& c = ctx.out_tensor(0);
  const std::vector<std::string>& contracted = ctx.op().attrs.contracted;
  auto is_contracted = [&](const std::string& name) {
    return std::find(contracted.begin(), contracted.end(), name) != contracted.end();
  };
  // Same-named dims must agree in size.
  for (const Dim& dim : a.dims) {
    for (const Tensor* other : {&b, &c}) {
      const int index = other->dim_index(dim.name);
      if (index >= 0 && other->dims[static_cast<size_t>(index)].size != dim.size) {
        ctx.fail("dim '" + dim.name + "' has different sizes in '" + a.name + "' and '" +
                 other->name + "'");
      }
    }
  }
  for (const Dim& dim : b.dims) {
    const int index = c.dim_index(dim.name);
    if (index >= 0 && c.dims[static_cast<size_t>(index)].size != dim.size) {
      ctx.fail("dim '" + dim.name + "' has different sizes in '" + b.name + "' and '" + c.name +
               "'");
    }
  }
  Space batch;
  Space rows;
  Space cols;
  for (const Dim& dim : c.dims) {
    if (is_contracted(dim.name)) {
      ctx.fail("contracted dim '" + dim.name + "' appears in the output");
    }
    const bool in_a = has_dim(a, dim.name);
    const bool in_b = has_dim(b, dim.name);
    if (in_a && in_b) {
      batch.add(dim.name, dim.size);
    } else if (in_a) {
      rows.add(dim.name, dim.size);
    } else if (in_b) {
      cols.add(dim.name, dim.size);
    } else {
      ctx.fail("output dim '" + dim.name + "' is in neither operand");
    }
  }
  Space inner;
  Space a_only;
  Space b_only;
  for (const std::string& name : contracted) {
    const bool in_a = has_dim(a, name);
    const bool in_b = has_dim(b, name);
    if (in_a && in_b) {
      inner.add(name, ctx.dim(a, name).size);
    } else if (in_a) {
      a_only.add(name, ctx.dim(a, name).size);
    } else if (in_b) {
      b_only.add(name, ctx.dim(b, name).size);
    } else {
      ctx.fail("contracted dim '" + name + "' is in neither operand");
    }
  }
  for (const Tensor* operand : {&a, &b}) {
    for (const Dim& dim : operand->dims) {
      if (!has_dim(c, dim.name) && !is_contracted(dim.name)) {
        ctx.fail("dim '" + dim.name + "' of '" + operand->name +
                 "' is neither contracted nor in the output");
      }
    }
  }
  const int64_t nb = batch.count();
  const int64_t m = rows.count();
  const int64_t n = cols.count();
  const int64_t k = inner.count();
  // Packs an operand as [batch..., first..., second...] row-major (A: [batch, M, K]; B:
  // [batch, K, N]), summing its operand-only contracted dims onto the same packed element.
  auto pack = [&](const Tensor& tensor, const float* values, const Space& first,
                  const Space& second, const Space& summed) {
    Space loop;
    for (const Space* part :
         std::initializer_list<const Space*>{&batch, &first, &second, &summed}) {
      for (size_t index = 0; index < part->names.size(); ++index) {
        loop.add(part->names[index], part->sizes[index]);
      }
    }
    const size_t packed_rank = loop.names.size() - summed.names.size();
    std::vector<int64_t> packed(loop.names.size(), 0);
    int64_t running = 1;
    for (size_t index = packed_rank; index > 0; --index) {
      packed[index - 1] = running;
      running *= loop.sizes[index - 1];
    }
    std::vector<float> result(static_cast<size_t>(running), 0.0f);
    const std::array<std::vector<int64_t>, 2> strides = {ctx.strides_in(tensor, loop, true, true),
                                                         packed};
    for_each_index(loop.sizes, strides, [&](const std::array<int64_t, 2>& at) {
      result[static_cast<size_t>(at[1])] += ctx.load(values[at[0]]);
    });
    return result;
  };
  if (ctx.device().fast_kernels && !ctx.device().bf16_matmul_inputs) {
    // functional_precision=fast: an operand laid out as [batch, X, Y] or [batch, Y, X] is used
    // in place (a row- or column-major matrix per batch index), others are packed; fp32 GEMMs.
    const auto operand = [&](const Tensor& tensor, const float* values, const Space& first,
                             const Space& second, const Space& summed,
                             std::vector<float>& storage) {
      if (summed.names.empty() && laid_out_as(tensor, {&batch, &first, &second})) {
        return EinsumOperand{values, false};
      }
      if (summed.names.empty() && laid_out_as(tensor, {&batch, &second, &first})) {
        return EinsumOperand{values, true};
      }
      storage = pack(tensor, values, first, second, summed);
      return EinsumOperand{storage.data(), false};
    };
    std::vector<float> a_storage;
    std::vector<float> b_storage;
    const EinsumOperand lhs = operand(a, ctx.in(0), rows, inner, a_only, a_storage);
    const EinsumOperand rhs = operand(b, ctx.in(1), inner, cols, b_only, b_storage);
    float* out = ctx.out_unfilled(0);  // every element is written below
    if (laid_out_as(c, {&batch, &rows, &cols})) {
      fast_gemms(ctx, lhs, rhs, EinsumOperand{out, false}, nb, m, n, k);
      return;
    }
    if (laid_out_as(c, {&batch, &cols, &rows})) {
      fast_gemms(ctx, lhs, rhs, EinsumOperand{out, true}, nb, m, n, k);
      return;
    }
    std::vector<float> packed(static_cast<size_t>(nb * m * n), 0.0f);
    fast_gemms(ctx, lhs, rhs, EinsumOperand{packed.data(), false}, nb, m, n, k);
    Space loop;
    for (const Space* part : {&batch, &rows, &cols}) {
      for (size_t index = 0; index < part->names.size(); ++index) {
        loop.add(part->names[index], part->sizes[index]);
      }
    }
    const std::array<std::vector<int64_t>, 2> all = {ctx.strides_in(c, loop, true, true),
                                                     strides_of_space(loop)};
    for_each_index(loop.sizes, all, [&](const std::array<int64_t, 2>& at) {
      out[at[0]] = packed[static_cast<size_t>(at[1])];
    });
    return;
  }
  const std::vector<float> packed_a = pack(a, ctx.in(0), rows, inner, a_only);
  const std::vector<float> packed_b = pack(b, ctx.in(1), inner, cols, b_only);
  std::vector<float> packed_c(static_cast<size_t>(nb * m * n), 0.0f);
  for (int64_t index = 0; index < nb; ++index) {
    const Eigen::Map<const RowMatrix> lhs(packed_a.data() + index * m * k, m, k);
    const Eigen::Map<const RowMatrix> rhs(packed_b.data() + index * k * n, k, n);
    Eigen::Map<RowMatrix> product(packed_c.data() + index * m * n, m, n);
    if (ctx.device().bf16_matmul_inputs) {
      product.noalias() = lhs * rhs;  // the MXU: bf16 products, fp32 accumulation
    } else {
      const DoubleMatrix wide = lhs.cast<double>() * rhs.cast<double>();
      product = wide.cast<float>();
    }
  }
  Space loop;
  for (const Space* part : {&batch, &rows, &cols}) {
    for (size_t index = 0; index < part->names.size(); ++index) {
      loop.add(part->names[index], part->sizes[index]);
    }
  }
  std::vector<int64_t> packed_strides(loop.names.size(), 1);
  for (size_t index = loop.names.size(); index > 1; --index) {
    packed_strides[index - 2] = packed_strides[index - 1] * loop.sizes[index - 1];
  }
  float* out = ctx.out(0);
  const std::array<std::vector<int64_t>, 2> all = {ctx.strides_in(c, loop, true, true),
                                                   packed_strides};
  for_each_index(loop.sizes, all, [&](const std::array<int64_t, 2>& at) {
    out[at[0]] = packed_c[static_cast<size_t>(at[1])];
  });
}

// ------------------------------------------------------------------------------------------------
// kElementwise by attrs.function, over the output's dims; an input lacking some of the output's
//   dims broadcasts along them (matched by name; an input may not have dims the output lacks).
//   kAdd(a, b) = a + b; kMul(a, b) = a * b;
//   kSilu(x) = x * sigmoid(x); kGelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   (the tanh approximation, flax nn.gelu's default); kRelu(x) = max(x, 0);
//   kSigmoid(x) = 1 / (1 + exp(-x)); kScale and kCast copy their FIRST input (kScale is the
//   identity; its VJP op is kScale(dy, x) = dy, and kCast's VJP is kCast(dy)).
//   Gradients take (dy, x) and give dy * f'(x): kSiluGrad f' = s (1 + x (1 - s)) with
//   s = sigmoid(x); kGeluGrad f' = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
//   with t = tanh(...) as above; kReluGrad f' = [x > 0]; kSigmoidGrad f' = s (1 - s).
// ------------------------------------------------------------------------------------------------
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
}

double gelu_derivative(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * x * x);
}

double apply_elementwise(ElementwiseFn fn, double a, double b) {
  switch (fn) {
    case ElementwiseFn::kAdd:
      return a + b;
    case ElementwiseFn::kMul:
      return a * b;
    case ElementwiseFn::kSilu:
      return a * sigmoid(a);
    case ElementwiseFn::kGelu:
      return gelu(a);
    case ElementwiseFn::kRelu:
      return a > 0 ? a : 0.0;
    case ElementwiseFn::kSigmoid:
      return sigmoid(a);
    case ElementwiseFn::kScale:
    case ElementwiseFn::kCast:
      return a;
    case ElementwiseFn::kSiluGrad: {
      const double s = sigmoid(b);
      return a * s * (1.0 + b * (1.0 - s));
    }
    case ElementwiseFn::kGeluGrad:
      return a * gelu_derivative(b);
    case ElementwiseFn::kReluGrad:
      return b > 0 ? a : 0.0;
    case ElementwiseFn::kSigmoidGrad: {
      const double s = sigmoid(b);
      return a * s * (1.0 - s);
    }
  }
  return 0.0;
}

void run_elementwise(const Ctx& ctx) {
  const ElementwiseFn fn = ctx.op().attrs.function;
  size_t arity = 1;
  switch (fn) {
    case ElementwiseFn::kAdd:
    case ElementwiseFn::kMul:
    case ElementwiseFn::kSiluGrad:
    case ElementwiseFn::kGeluGrad:
    case ElementwiseFn::kReluGrad:
    case ElementwiseFn::kSigmoidGrad:
      arity = 2;
      ctx.expect_counts(2, 2, 1, 1);
      break;
    case ElementwiseFn::kScale:
    case ElementwiseFn::kCast:
      ctx.expect_counts(1, 2, 1, 1);  // kScale's VJP form passes (dy, x)
      break;
    default:
      ctx.expect_counts(1, 1, 1, 1);
      break;
  }
  const Tensor& out_tensor = ctx.out_tensor(0);
  Space space;
  for (const Dim& dim : out_tensor.dims) {
    space.add(dim.name, dim.size);
  }
  const std::vector<int64_t> a_strides = ctx.strides_in(ctx.in_tensor(0), space, false, true);
  const std::vector<int64_t> b_strides = arity == 2
                                             ? ctx.strides_in(ctx.in_tensor(1), space, false, true)
                                             : std::vector<int64_t>(space.names.size(), 0);
  const float* a = ctx.in(0);
  const float* b = arity == 2 ? ctx.in(1) : ctx.in(0);
  const std::vector<int64_t> out_strides = strides_of(out_tensor);
  if (ctx.device().fast_kernels && a_strides == out_strides &&
      (arity == 1 || b_strides == out_strides)) {
    // functional_precision=fast, no broadcasting: one flat loop in fp32.
    float* out = ctx.out_unfilled(0);
    const int64_t count = space.count();
    const auto flat = [&](auto&& f) {
      // Pieces of a fixed size (each element's value does not depend on the split).
      constexpr int64_t kPiece = 1 << 15;
      parallel_for(ctx.device().threads, (count + kPiece - 1) / kPiece, [&](int64_t piece) {
        const int64_t end = std::min(count, (piece + 1) * kPiece);
        for (int64_t index = piece * kPiece; index < end; ++index) {
          out[index] = f(a[index], b[index]);
        }
      });
    };
    const auto sigmoid_f = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
    switch (fn) {
      case ElementwiseFn::kAdd:
        flat([](float x, float y) { return x + y; });
        return;
      case ElementwiseFn::kMul:
        flat([](float x, float y) { return x * y; });
        return;
      case ElementwiseFn::kScale:
      case ElementwiseFn::kCast:
        std::copy(a, a + count, out);
        return;
      case ElementwiseFn::kSilu:
        flat([&](float x, float) { return x * sigmoid_f(x); });
        return;
      case ElementwiseFn::kSiluGrad:
        flat([&](float dy, float x) {
          const float s = sigmoid_f(x);
          return dy * s * (1.0f + x * (1.0f - s));
        });
        return;
      default:
        flat([&](float x, float y) { return static_cast<float>(apply_elementwise(fn, x, y)); });
        return;
    }
  }
  float* out = ctx.out(0);
  const std::array<std::vector<int64_t>, 3> all = {out_strides, a_strides, b_strides};
  for_each_index(space.sizes, all, [&](const std::array<int64_t, 3>& at) {
    out[at[0]] = static_cast<float>(apply_elementwise(fn, a[at[1]], b[at[2]]));
  });
}

// kReduceSum(x) -> y: y sums x over the dims y lacks (attrs.contracted names them), in x's
// row-major order with a double accumulator (bias gradients: dbias = sum of dy over the tokens).
void run_reduce_sum(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& in_tensor = ctx.in_tensor(0);
  const Tensor& out_tensor = ctx.out_tensor(0);
  Space space;
  for (const Dim& dim : in_tensor.dims) {
    space.add(dim.name, dim.size);
  }
  const std::array<std::vector<int64_t>, 2> all = {strides_of(in_tensor),
                                                   ctx.strides_in(out_tensor, space, false, true)};
  std::vector<double> sums(static_cast<size_t>(out_tensor.num_elements()), 0.0);
  const float* in = ctx.in(0);
  for_each_index(space.sizes, all, [&](const std::array<int64_t, 2>& at) {
    sums[static_cast<size_t>(at[1])] += in[at[0]];
  });
  float* out = ctx.out(0);
  for (size_t index = 0; index < sums.size(); ++index) {
    out[index] = static_cast<float>(sums[index]);
  }
}

// ------------------------------------------------------------------------------------------------
// Norms. The reduced dim r is attrs.contracted[0] (the last dim of x when attrs.contracted is
// empty); a row is one index of x's other dims; N is r's size: its LOCAL size without statistics
// (r is whole), its GLOBAL size with a statistics input (r is split and the statistics are the
// all-reduced sums). scale (and bias) are 1-D over r, the same slice as x. g = dy * scale.
//
// kRmsNorm(x, scale[, stats]) -> y = x * rsqrt(mean(x^2) + eps) * scale, eps = attrs.epsilon.
// kLayerNorm(x, scale, bias[, stats]) -> y = (x - mu) * rsqrt(var + eps) * scale + bias, with
//   the biased variance var = mean(x^2) - mu^2 (computed two-pass when local).
// kNormStatistics: per-row sums over the LOCAL part of r (the engine all-reduces them), in the
//   statistics tensor [x's dims without r..., values] (values = its LAST dim). Which norm it
//   serves follows from its inputs and value count:
//     RMS forward   (x, scale)           1 value : [sum x^2]
//     Layer forward (x, scale, bias)     2 values: [sum x, sum x^2]
//     RMS grad      (dy, x, scale)       2 values: [sum x^2, sum g x]
//     Layer grad    (dy, x, scale, bias) 4 values: [sum x, sum x^2, sum g, sum g x]
//   (Layer forward and RMS grad both have 3 inputs and 2 values: the grad form's second input has
//   x's dims, a scale has only r; when x is 1-D itself, op.phase == kBackward decides.)
// kNormGrad(dy, x, scale[, bias][, stats]) -> dx, dscale[, dbias]: exact VJP of the forward norm
//   (LayerNorm when there are 3 outputs). With rstd = rsqrt(ms + eps) (RMS, ms = mean x^2):
//     RMS:   dx = rstd g - x rstd^3 mean(g x);            dscale = sum_rows dy x rstd
//   With xhat = (x - mu) rstd, rstd = rsqrt(var + eps) (Layer):
//     Layer: dx = rstd (g - mean(g) - xhat mean(g xhat)), where
//            mean(g xhat) = (sum g x - mu sum g) rstd / N; dscale = sum_rows dy xhat;
//            dbias = sum_rows dy.
//   The means use the statistics input (the sums above, global) when given. dscale/dbias sum
//   over this device's rows only (partial sums the engine reduces).
// ------------------------------------------------------------------------------------------------
enum class NormForm { kRms, kLayer, kRmsGrad, kLayerGrad };

size_t norm_values(NormForm form) {
  switch (form) {
    case NormForm::kRms:
      return 1;
    case NormForm::kLayer:
    case NormForm::kRmsGrad:
      return 2;
    case NormForm::kLayerGrad:
      return 4;
  }
  return 0;
}

bool norm_is_grad(NormForm form) {
  return form == NormForm::kRmsGrad || form == NormForm::kLayerGrad;
}
bool norm_is_layer(NormForm form) {
  return form == NormForm::kLayer || form == NormForm::kLayerGrad;
}

// Per-row moments a norm (or its gradient) needs.
struct RowMoments {
  double mu = 0;       // Layer: mean of x
  double rstd = 0;     // rsqrt(var + eps) (Layer) or rsqrt(mean x^2 + eps) (RMS)
  double mean_g = 0;   // Layer grad: mean of g
  double mean_gx = 0;  // RMS grad: mean of g x; Layer grad: mean of g xhat
};

class NormKernel {
 public:
  NormKernel(const Ctx& ctx, NormForm form, bool statistics_op) : ctx_(ctx), form_(form) {
    const bool grad = norm_is_grad(form);
    const size_t base = grad ? 1 : 0;  // index of x
    x_index_ = base;
    scale_index_ = base + 1;
    const size_t forward_inputs = base + (norm_is_layer(form) ? 3 : 2);
    if (statistics_op) {
      ctx.expect_counts(forward_inputs, forward_inputs, 1, 1);
    } else {
      ctx.expect_counts(forward_inputs, forward_inputs + 1, 1, 3);
      has_stats_ = ctx.num_inputs() == forward_inputs + 1;
    }
    const Tensor& x = ctx.in_tensor(x_index_);
    if (x.dims.empty()) {
      ctx.fail("normalizes a scalar");
    }
    reduced_ =
        ctx.op().attrs.contracted.empty() ? x.dims.back().name : ctx.op().attrs.contracted.front();
    const Dim& reduced = ctx.dim(x, reduced_);
    n_local_ = reduced.size;
    rows_ = space_without(x, {reduced_});
    Space all = rows_;
    all.add(reduced_, n_local_);
    x_strides_ = ctx.strides_in(x, rows_, true, false);
    x_step_ = ctx.stride(x, reduced_);
    if (grad) {
      dy_strides_ = ctx.strides_in(ctx.in_tensor(0), rows_, true, false);
      dy_step_ = ctx.stride(ctx.in_tensor(0), reduced_);
      ctx.strides_in(ctx.in_tensor(0), all, true, true);
    }
    ctx.strides_in(x, all, true, true);
    Space scale_space;
    scale_space.add(reduced_, n_local_);
    for (size_t index = scale_index_; index < forward_inputs; ++index) {
      ctx.strides_in(ctx.in_tensor(index), scale_space, true, true);  // scale, bias: [r]
    }
    if (has_stats_) {
      const Tensor& stats = ctx.in_tensor(forward_inputs);
      check_stats_tensor(stats);
      stats_strides_ = ctx.strides_in(stats, rows_, true, false);
      n_global_ = reduced.whole_size();
    } else {
      n_global_ = n_local_;
    }
  }

  // kNormStatistics: the local sums.
  void statistics() const {
    const Tensor& out = ctx_.out_tensor(0);
    check_stats_tensor(out);
    const std::vector<int64_t> out_strides = ctx_.strides_in(out, rows_, true, false);
    const int64_t value_stride = strides_of(out).back();
    float* values = ctx_.out(0);
    for_each_rows(out_strides, [&](int64_t x_at, int64_t dy_at, int64_t, int64_t stats_at) {
      const std::array<double, 4> sums = local_sums(x_at, dy_at);
      for (size_t value = 0; value < norm_values(form_); ++value) {
        values[stats_at + static_cast<int64_t>(value) * value_stride] =
            static_cast<float>(sums[value]);
      }
    });
  }

  // kRmsNorm / kLayerNorm.
  void forward() const {
    if (ctx_.num_outputs() != 1) {
      ctx_.fail("a norm has one output");
    }
    const Tensor& y_tensor = ctx_.out_tensor(0);
    const std::vector<int64_t> y_strides = ctx_.strides_in(y_tensor, rows_, true, false);
    const int64_t y_step = ctx_.stride(y_tensor, reduced_);
    Space all = rows_;
    all.add(reduced_, n_local_);
    ctx_.strides_in(y_tensor, all, true, true);
    const float* x = ctx_.in(x_index_);
    const float* scale = ctx_.in(scale_index_);
    const float* bias = norm_is_layer(form_) ? ctx_.in(scale_index_ + 1) : nullptr;
    float* y = ctx_.out(0);
    for_each_rows(y_strides, [&](int64_t x_at, int64_t, int64_t stats_at, int64_t y_at) {
      const RowMoments row = moments(x_at, 0, stats_at);
      for (int64_t index = 0; index < n_local_; ++index) {
        const double value = x[x_at + index * x_step_];
        const double normalized = bias ? (value - row.mu) * row.rstd : value * row.rstd;
        y[y_at + index * y_step] =
            static_cast<float>(normalized * scale[index] + (bias ? bias[index] : 0.0));
      }
    });
  }

  // kNormGrad.
  void backward() const {
    const bool layer = norm_is_layer(form_);
    if (ctx_.num_outputs() != (layer ? 3u : 2u)) {
      ctx_.fail("a norm gradient has outputs dx, dscale[, dbias]");
    }
    const Tensor& dx_tensor = ctx_.out_tensor(0);
    const std::vector<int64_t> dx_strides = ctx_.strides_in(dx_tensor, rows_, true, false);
    const int64_t dx_step = ctx_.stride(dx_tensor, reduced_);
    Space all = rows_;
    all.add(reduced_, n_local_);
    ctx_.strides_in(dx_tensor, all, true, true);
    Space scale_space;
    scale_space.add(reduced_, n_local_);
    for (size_t index = 1; index < ctx_.num_outputs(); ++index) {
      ctx_.strides_in(ctx_.out_tensor(index), scale_space, true, true);
    }
    const float* dy = ctx_.in(0);
    const float* x = ctx_.in(x_index_);
    const float* scale = ctx_.in(scale_index_);
    float* dx = ctx_.out(0);
    std::vector<double> dscale(static_cast<size_t>(n_local_), 0.0);
    std::vector<double> dbias(static_cast<size_t>(n_local_), 0.0);
    for_each_rows(dx_strides, [&](int64_t x_at, int64_t dy_at, int64_t stats_at, int64_t dx_at) {
      const RowMoments row = moments(x_at, dy_at, stats_at);
      for (int64_t index = 0; index < n_local_; ++index) {
        const double value = x[x_at + index * x_step_];
        const double d = dy[dy_at + index * dy_step_];
        const double g = d * scale[index];
        double grad = 0;
        if (layer) {
          const double xhat = (value - row.mu) * row.rstd;
          grad = row.rstd * (g - row.mean_g - xhat * row.mean_gx);
          dscale[static_cast<size_t>(index)] += d * xhat;
          dbias[static_cast<size_t>(index)] += d;
        } else {
          grad = row.rstd * g - value * row.rstd * row.rstd * row.rstd * row.mean_gx;
          dscale[static_cast<size_t>(index)] += d * value * row.rstd;
        }
        dx[dx_at + index * dx_step] = static_cast<float>(grad);
      }
    });
    float* dscale_out = ctx_.out(1);
    for (int64_t index = 0; index < n_local_; ++index) {
      dscale_out[index] = static_cast<float>(dscale[static_cast<size_t>(index)]);
    }
    if (layer) {
      float* dbias_out = ctx_.out(2);
      for (int64_t index = 0; index < n_local_; ++index) {
        dbias_out[index] = static_cast<float>(dbias[static_cast<size_t>(index)]);
      }
    }
  }

 private:
  void check_stats_tensor(const Tensor& stats) const {
    if (stats.dims.size() != rows_.names.size() + 1 ||
        stats.dims.back().size != static_cast<int64_t>(norm_values(form_))) {
      ctx_.fail("statistics tensor '" + stats.name + "' must be [rows..., " +
                std::to_string(norm_values(form_)) + "]");
    }
    Space all = rows_;
    all.add(stats.dims.back().name, stats.dims.back().size);
    ctx_.strides_in(stats, all, true, true);
  }

  // body(x offset, dy offset, statistics offset, other offset) per row; `other` follows
  // `other_strides` (dy and statistics offsets are 0 when the op has none).
  template <typename Body>
  void for_each_rows(const std::vector<int64_t>& other_strides, Body&& body) const {
    const std::vector<int64_t> none(rows_.names.size(), 0);
    const std::array<std::vector<int64_t>, 4> all = {
        x_strides_, dy_strides_.empty() ? none : dy_strides_,
        stats_strides_.empty() ? none : stats_strides_, other_strides};
    for_each_index(rows_.sizes, all,
                   [&](const std::array<int64_t, 4>& at) { body(at[0], at[1], at[2], at[3]); });
  }

  std::array<double, 4> local_sums(int64_t x_at, int64_t dy_at) const {
    const float* x = ctx_.in(x_index_);
    const float* scale = ctx_.in(scale_index_);
    const float* dy = norm_is_grad(form_) ? ctx_.in(0) : nullptr;
    double sum_x = 0;
    double sum_xx = 0;
    double sum_g = 0;
    double sum_gx = 0;
    for (int64_t index = 0; index < n_local_; ++index) {
      const double value = x[x_at + index * x_step_];
      sum_x += value;
      sum_xx += value * value;
      if (dy != nullptr) {
        const double g = static_cast<double>(dy[dy_at + index * dy_step_]) * scale[index];
        sum_g += g;
        sum_gx += g * value;
      }
    }
    switch (form_) {
      case NormForm::kRms:
        return {sum_xx, 0, 0, 0};
      case NormForm::kLayer:
        return {sum_x, sum_xx, 0, 0};
      case NormForm::kRmsGrad:
        return {sum_xx, sum_gx, 0, 0};
      case NormForm::kLayerGrad:
        return {sum_x, sum_xx, sum_g, sum_gx};
    }
    return {};
  }

  RowMoments moments(int64_t x_at, int64_t dy_at, int64_t stats_at) const {
    const double n = static_cast<double>(n_global_);
    const double eps = ctx_.op().attrs.epsilon;
    RowMoments row;
    if (!has_stats_ && norm_is_layer(form_)) {
      // Local LayerNorm: two passes for an accurate variance and mean(g xhat).
      const float* x = ctx_.in(x_index_);
      double sum = 0;
      for (int64_t index = 0; index < n_local_; ++index) {
        sum += x[x_at + index * x_step_];
      }
      row.mu = sum / n;
      double var = 0;
      for (int64_t index = 0; index < n_local_; ++index) {
        const double centered = x[x_at + index * x_step_] - row.mu;
        var += centered * centered;
      }
      row.rstd = 1.0 / std::sqrt(var / n + eps);
      if (norm_is_grad(form_)) {
        const float* dy = ctx_.in(0);
        const float* scale = ctx_.in(scale_index_);
        double sum_g = 0;
        double sum_gxhat = 0;
        for (int64_t index = 0; index < n_local_; ++index) {
          const double g = static_cast<double>(dy[dy_at + index * dy_step_]) * scale[index];
          sum_g += g;
          sum_gxhat += g * (x[x_at + index * x_step_] - row.mu) * row.rstd;
        }
        row.mean_g = sum_g / n;
        row.mean_gx = sum_gxhat / n;
      }
      return row;
    }
    const std::array<double, 4> sums = has_stats_ ? stats_row(stats_at) : local_sums(x_at, dy_at);
    switch (form_) {
      case NormForm::kRms:
        row.rstd = 1.0 / std::sqrt(sums[0] / n + eps);
        break;
      case NormForm::kRmsGrad:
        row.rstd = 1.0 / std::sqrt(sums[0] / n + eps);
        row.mean_gx = sums[1] / n;
        break;
      case NormForm::kLayer:
      case NormForm::kLayerGrad: {
        row.mu = sums[0] / n;
        const double var = std::max(sums[1] / n - row.mu * row.mu, 0.0);
        row.rstd = 1.0 / std::sqrt(var + eps);
        row.mean_g = sums[2] / n;
        row.mean_gx = (sums[3] - row.mu * sums[2]) * row.rstd / n;
        break;
      }
    }
    return row;
  }

  // The statistics input's values at row offset stats_at.
  std::array<double, 4> stats_row(int64_t stats_at) const {
    const Tensor& stats = ctx_.in_tensor(ctx_.num_inputs() - 1);
    const int64_t value_stride = strides_of(stats).back();
    const float* values = ctx_.in(ctx_.num_inputs() - 1);
    std::array<double, 4> sums{};
    for (size_t value = 0; value < norm_values(form_); ++value) {
      sums[value] = values[stats_at + static_cast<int64_t>(value) * value_stride];
    }
    return sums;
  }

  const Ctx& ctx_;
  NormForm form_;
  size_t x_index_ = 0;
  size_t scale_index_ = 1;
  bool has_stats_ = false;
  std::string reduced_;
  int64_t n_local_ = 0;
  int64_t n_global_ = 0;
  Space rows_;
  std::vector<int64_t> x_strides_;
  int64_t x_step_ = 0;
  std::vector<int64_t> dy_strides_;
  int64_t dy_step_ = 0;
  std::vector<int64_t> stats_strides_;
};

NormForm statistics_form(const Ctx& ctx) {
  const Tensor& out = ctx.out_tensor(0);
  if (out.dims.empty()) {
    ctx.fail("statistics output has no values dim");
  }
  switch (out.dims.back().size) {
    case 1:
      return NormForm::kRms;
    case 4:
      return NormForm::kLayerGrad;
    case 2: {
      if (ctx.num_inputs() != 3) {
        ctx.fail("2 statistics values need 3 inputs");
      }
      const Tensor& first = ctx.in_tensor(0);
      const Tensor& second = ctx.in_tensor(1);
      if (first.dims.size() != second.dims.size()) {
        return NormForm::kLayer;
      }
      if (first.dims.size() > 1) {
        return NormForm::kRmsGrad;
      }
      return ctx.op().phase == Phase::kBackward ? NormForm::kRmsGrad : NormForm::kLayer;
    }
    default:
      ctx.fail("statistics output must hold 1, 2 or 4 values per row");
  }
}

// ------------------------------------------------------------------------------------------------
// kRope(x) -> y, rotary embedding on x's LAST dim d (must be whole and even), pairs split in
//   halves as MaxText's RotaryEmbedding: first = x[..., :d/2], second = x[..., d/2:];
//   timescale_i = attrs.rope_max_timescale^(2i/d) (min timescale 1), angle = position /
//   timescale_i, with position the GLOBAL index along the dim named "length"
//   (device.offset + local index):
//     y_first = first cos - second sin;  y_second = second cos + first sin.
//   op.phase == kBackward: the VJP, i.e. the rotation by -angle.
// ------------------------------------------------------------------------------------------------
void run_rope(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& x = ctx.in_tensor(0);
  const Tensor& y = ctx.out_tensor(0);
  if (x.dims.empty()) {
    ctx.fail("rope of a scalar");
  }
  const Dim& last = x.dims.back();
  const int64_t d = last.size;
  if (last.whole_size() != d || d % 2 != 0) {
    ctx.fail("rope's last dim '" + last.name + "' must be whole and even");
  }
  if (y.dims.empty() || y.dims.back().name != last.name) {
    ctx.fail("rope's output must end with '" + last.name + "'");
  }
  const Dim& length = ctx.dim(x, "length");
  const int64_t half = d / 2;
  Space rows = space_without(x, {last.name});
  Space all = rows;
  all.add(last.name, d);
  ctx.strides_in(y, all, true, true);
  std::vector<int64_t> position_strides(rows.names.size(), 0);
  for (size_t index = 0; index < rows.names.size(); ++index) {
    if (rows.names[index] == "length") {
      position_strides[index] = 1;
    }
  }
  const double sign = ctx.op().phase == Phase::kBackward ? -1.0 : 1.0;
  const int64_t first_position = ctx.device().offset(length);
  // cos/sin per (local position, i).
  std::vector<double> cosines(static_cast<size_t>(length.size * half));
  std::vector<double> sines(cosines.size());
  for (int64_t position = 0; position < length.size; ++position) {
    for (int64_t i = 0; i < half; ++i) {
      const double timescale = std::pow(ctx.op().attrs.rope_max_timescale,
                                        2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double angle = sign * static_cast<double>(first_position + position) / timescale;
      cosines[static_cast<size_t>(position * half + i)] = std::cos(angle);
      sines[static_cast<size_t>(position * half + i)] = std::sin(angle);
    }
  }
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  const int64_t x_step = strides_of(x).back();
  const int64_t y_step = strides_of(y).back();
  const std::array<std::vector<int64_t>, 3> strides = {
      ctx.strides_in(x, rows, true, false), ctx.strides_in(y, rows, true, false), position_strides};
  for_each_index(rows.sizes, strides, [&](const std::array<int64_t, 3>& at) {
    const double* cos_row = cosines.data() + at[2] * half;
    const double* sin_row = sines.data() + at[2] * half;
    for (int64_t i = 0; i < half; ++i) {
      const double first = in[at[0] + i * x_step];
      const double second = in[at[0] + (i + half) * x_step];
      out[at[1] + i * y_step] = static_cast<float>(first * cos_row[i] - second * sin_row[i]);
      out[at[1] + (i + half) * y_step] =
          static_cast<float>(second * cos_row[i] + first * sin_row[i]);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// kAttention(q, k, v[, k_rope]) -> out
//   Dims by name: q (batch, length, heads, D_qk), k (batch, length, kv_heads or heads, D_k),
//   v (batch, length, kv_heads or heads, D_v), out (batch, length, heads, D_v), k_rope (batch,
//   length, R); the feature dim of each is its one dim that is none of those names.
//   GQA: GLOBAL query head h uses global kv head h / (H / K) (H, K global head counts); it must be
//   in this device's kv head slice (query heads at or past H, the padding of an uneven split, get
//   zeros). Scores: scale * q.k with scale = attrs.attention_scale (1 for MaxText's default
//   Attention, which folds 1/sqrt(D) into the query's initializer), then cap tanh(scores / cap)
//   when cap = attrs.logit_soft_cap > 0; MLA form (4 inputs): q.k =
//   q[..., :D_k].k + q[..., D_k:].k_rope (requires D_qk = D_k + R). Query positions are GLOBAL
//   (device.offset of q's length dim), key positions likewise (offset of k's length dim; it is
//   normally whole). Mask attrs.mask: kCausal allows key j iff j <= query position p;
//   kSlidingWindow also needs p - j < attrs.window; kChunked needs j / attrs.window == p /
//   attrs.window (llama4's chunks); kNone allows all. Softmax in fp32 over the allowed keys (a row
//   with none gives zeros); out = P v. With bf16_matmul_inputs, q, k, v, k_rope and P are rounded
//   to bf16 before their matmuls.
// kAttentionGrad(dout, q, k, v, [k_rope], out) -> dq, dk, dv, [dk_rope]: exact VJP. P is
//   recomputed from q and k; D_i = sum(dout_i * out_i); dS = P * (dout v^T - D) (times
//   1 - tanh^2(scaled scores / cap) under a soft cap); dq = scale dS k
//   (and scale dS k_rope for q's rope part); dk = scale dS^T q; dv = P^T dout; dk_rope = scale
//   sum over heads of dS^T q_rope. dk, dv, dk_rope hold the contribution of THIS device's queries
//   (partial sums the engine reduces). With bf16_matmul_inputs, dout, q, k, v, k_rope, P and dS
//   are rounded to bf16 before their matmuls.
// ------------------------------------------------------------------------------------------------
struct AttentionView {
  int64_t batch = 1, length = 1, heads = 1, features = 1;
  int64_t batch_stride = 0, length_stride = 0, head_stride = 0, feature_stride = 0;
  const Dim* length_dim = nullptr;
  const Dim* heads_dim = nullptr;
  const Dim* feature_dim = nullptr;
};

AttentionView attention_view(const Ctx& ctx, const Tensor& tensor, bool kv_side, bool has_heads) {
  AttentionView view;
  const std::vector<int64_t> strides = strides_of(tensor);
  std::string heads_name = "heads";
  if (kv_side && has_dim(tensor, "kv_heads")) {
    heads_name = "kv_heads";
  }
  bool seen_batch = false;
  bool seen_length = false;
  for (size_t index = 0; index < tensor.dims.size(); ++index) {
    const Dim& dim = tensor.dims[index];
    if (dim.name == "batch") {
      view.batch = dim.size;
      view.batch_stride = strides[index];
      seen_batch = true;
    } else if (dim.name == "length") {
      view.length = dim.size;
      view.length_stride = strides[index];
      view.length_dim = &dim;
      seen_length = true;
    } else if (has_heads && dim.name == heads_name) {
      view.heads = dim.size;
      view.head_stride = strides[index];
      view.heads_dim = &dim;
    } else if (view.feature_dim == nullptr) {
      view.features = dim.size;
      view.feature_stride = strides[index];
      view.feature_dim = &dim;
    } else {
      ctx.fail("attention tensor '" + tensor.name + "' has an unexpected dim '" + dim.name + "'");
    }
  }
  if (!seen_batch || !seen_length || view.feature_dim == nullptr ||
      (has_heads && view.heads_dim == nullptr)) {
    ctx.fail("attention tensor '" + tensor.name + "' must have batch, length," +
             (has_heads ? " heads," : "") + " and one feature dim");
  }
  return view;
}

template <typename Scalar>
Matrix<Scalar> gather(const Ctx& ctx, const float* base, const AttentionView& view, int64_t b,
                      int64_t h, bool round) {
  Matrix<Scalar> matrix(view.length, view.features);
  const float* start = base + b * view.batch_stride + h * view.head_stride;
  for (int64_t row = 0; row < view.length; ++row) {
    for (int64_t col = 0; col < view.features; ++col) {
      const float value = start[row * view.length_stride + col * view.feature_stride];
      matrix(row, col) = static_cast<Scalar>(round ? ctx.load(value) : value);
    }
  }
  return matrix;
}

template <typename Scalar>
void scatter(float* base, const AttentionView& view, int64_t b, int64_t h,
             const Matrix<Scalar>& matrix, bool accumulate) {
  float* start = base + b * view.batch_stride + h * view.head_stride;
  for (int64_t row = 0; row < view.length; ++row) {
    for (int64_t col = 0; col < view.features; ++col) {
      float& slot = start[row * view.length_stride + col * view.feature_stride];
      slot = static_cast<float>(accumulate ? slot + matrix(row, col) : matrix(row, col));
    }
  }
}

template <typename Scalar>
Matrix<Scalar> round_matrix(const Ctx& ctx, Matrix<Scalar> matrix) {
  if (ctx.device().bf16_matmul_inputs) {
    matrix = matrix.unaryExpr(
        [](Scalar value) { return static_cast<Scalar>(round_bf16(static_cast<float>(value))); });
  }
  return matrix;
}

// Computes in `Scalar`: double for the fp32 reference, float with bf16_matmul_inputs (the MXU's
// fp32 accumulation) or functional_precision=fast.
template <typename Scalar>
class AttentionKernel {
 public:
  using RowMatrix = Matrix<Scalar>;

  AttentionKernel(const Ctx& ctx, bool gradient) : ctx_(ctx) {
    const size_t first = gradient ? 1 : 0;
    if (gradient) {
      ctx.expect_counts(5, 6, 3, 4);
      mla_ = ctx.num_inputs() == 6;
      if (ctx.num_outputs() != (mla_ ? 4u : 3u)) {
        ctx.fail("attention gradient outputs are dq, dk, dv[, dk_rope]");
      }
    } else {
      ctx.expect_counts(3, 4, 1, 1);
      mla_ = ctx.num_inputs() == 4;
    }
    q_ = attention_view(ctx, ctx.in_tensor(first), false, true);
    k_ = attention_view(ctx, ctx.in_tensor(first + 1), true, true);
    v_ = attention_view(ctx, ctx.in_tensor(first + 2), true, true);
    if (mla_) {
      kr_ = attention_view(ctx, ctx.in_tensor(first + 3), true, false);
    }
    if (q_.heads_dim->name != "heads") {
      ctx.fail("the query's heads dim must be named 'heads'");
    }
    if (k_.heads_dim->name != v_.heads_dim->name || k_.heads != v_.heads) {
      ctx.fail("key and value heads differ");
    }
    for (const AttentionView* view : {&k_, &v_}) {
      if (view->batch != q_.batch) {
        ctx.fail("batch sizes differ between query and key/value");
      }
      if (view != &k_ && view->length != k_.length) {
        ctx.fail("key and value lengths differ");
      }
    }
    d_k_ = k_.features;
    if (mla_) {
      if (kr_.batch != q_.batch || kr_.length != k_.length) {
        ctx.fail("k_rope must match the key's batch and length");
      }
      if (q_.features != d_k_ + kr_.features) {
        ctx.fail("MLA query features must be key features + rope features");
      }
    } else if (q_.features != d_k_) {
      ctx.fail("query and key feature sizes differ");
    }
    scale_ = static_cast<Scalar>(ctx.op().attrs.attention_scale);
    soft_cap_ = static_cast<Scalar>(ctx.op().attrs.logit_soft_cap);
    // GQA mapping on global head indices.
    const int64_t query_heads = q_.heads_dim->whole_size();
    const int64_t kv_heads = k_.heads_dim->whole_size();
    if (kv_heads <= 0 || query_heads % kv_heads != 0) {
      ctx.fail("query heads must be a multiple of kv heads");
    }
    const int64_t group = query_heads / kv_heads;
    const int64_t q_offset = ctx.device().offset(*q_.heads_dim);
    const int64_t kv_offset = ctx.device().offset(*k_.heads_dim);
    for (int64_t h = 0; h < q_.heads; ++h) {
      if (q_offset + h >= query_heads) {
        kv_of_.push_back(-1);  // a padding head (uneven split): zero output and gradients
        continue;
      }
      const int64_t kv = (q_offset + h) / group - kv_offset;
      if (kv < 0 || kv >= k_.heads) {
        ctx.fail("query head " + std::to_string(q_offset + h) +
                 " needs a kv head outside this device's slice");
      }
      kv_of_.push_back(kv);
    }
    q_position_ = ctx.device().offset(*q_.length_dim);
    k_position_ = ctx.device().offset(*k_.length_dim);
    const OpAttrs& attrs = ctx.op().attrs;
    if ((attrs.mask == AttentionMask::kSlidingWindow || attrs.mask == AttentionMask::kChunked) &&
        attrs.window <= 0) {
      ctx.fail("sliding-window and chunked attention need attrs.window > 0");
    }
    const Tensor& out_tensor = gradient ? ctx.in_tensor(ctx.num_inputs() - 1) : ctx.out_tensor(0);
    o_ = attention_view(ctx, out_tensor, false, true);
    check_same(o_, q_.batch, q_.length, q_.heads, v_.features, "output");
    if (gradient) {
      const AttentionView dout = attention_view(ctx, ctx.in_tensor(0), false, true);
      check_same(dout, q_.batch, q_.length, q_.heads, v_.features, "dout");
      dout_ = dout;
      dq_ = attention_view(ctx, ctx.out_tensor(0), false, true);
      check_same(dq_, q_.batch, q_.length, q_.heads, q_.features, "dq");
      dk_ = attention_view(ctx, ctx.out_tensor(1), true, true);
      check_same(dk_, k_.batch, k_.length, k_.heads, k_.features, "dk");
      dv_ = attention_view(ctx, ctx.out_tensor(2), true, true);
      check_same(dv_, v_.batch, v_.length, v_.heads, v_.features, "dv");
      if (mla_) {
        dkr_ = attention_view(ctx, ctx.out_tensor(3), true, false);
        check_same(dkr_, kr_.batch, kr_.length, 1, kr_.features, "dk_rope");
      }
    }
  }

  void forward() const {
    const float* q = ctx_.in(0);
    const float* k = ctx_.in(1);
    const float* v = ctx_.in(2);
    const float* kr = mla_ ? ctx_.in(3) : nullptr;
    float* out = ctx_.out(0);
    // One item per (batch, query head): each writes its own block of the output.
    parallel_for(ctx_.device().threads, q_.batch * q_.heads, [&](int64_t item) {
      const int64_t b = item / q_.heads;
      const int64_t h = item % q_.heads;
      const int64_t kv = kv_of_[static_cast<size_t>(h)];
      if (kv < 0) {
        return;
      }
      const RowMatrix k_rope = mla_ ? gather<Scalar>(ctx_, kr, kr_, b, 0, true) : RowMatrix();
      const RowMatrix q_matrix = gather<Scalar>(ctx_, q, q_, b, h, true);
      const RowMatrix k_matrix = gather<Scalar>(ctx_, k, k_, b, kv, true);
      const RowMatrix v_matrix = gather<Scalar>(ctx_, v, v_, b, kv, true);
      const RowMatrix probabilities = softmax(q_matrix, k_matrix, k_rope);
      const RowMatrix result = round_matrix(ctx_, probabilities) * v_matrix;
      scatter(out, o_, b, h, result, false);
    });
  }

  void backward() const {
    const float* dout = ctx_.in(0);
    const float* q = ctx_.in(1);
    const float* k = ctx_.in(2);
    const float* v = ctx_.in(3);
    const float* kr = mla_ ? ctx_.in(4) : nullptr;
    const float* out = ctx_.in(ctx_.num_inputs() - 1);
    float* dq = ctx_.out(0);
    float* dk = ctx_.out(1);
    float* dv = ctx_.out(2);
    float* dkr = mla_ ? ctx_.out(3) : nullptr;
    // One item per (batch, kv head) (per batch index with MLA, whose dk_rope sums over every
    // head): each sums its query heads in ascending order and writes its own blocks.
    const int64_t groups = mla_ ? 1 : k_.heads;
    parallel_for(ctx_.device().threads, q_.batch * groups, [&](int64_t item) {
      const int64_t b = item / groups;
      const int64_t group = item % groups;
      const RowMatrix k_rope = mla_ ? gather<Scalar>(ctx_, kr, kr_, b, 0, true) : RowMatrix();
      RowMatrix dk_rope = RowMatrix::Zero(k_.length, mla_ ? kr_.features : 0);
      // dk, dv of each kv head: summed over the query heads that share it, then written once.
      std::vector<RowMatrix> dk_sum(static_cast<size_t>(k_.heads));
      std::vector<RowMatrix> dv_sum(static_cast<size_t>(k_.heads));
      for (int64_t kv = 0; kv < k_.heads; ++kv) {
        if (mla_ || kv == group) {
          dk_sum[static_cast<size_t>(kv)] = RowMatrix::Zero(k_.length, k_.features);
          dv_sum[static_cast<size_t>(kv)] = RowMatrix::Zero(v_.length, v_.features);
        }
      }
      for (int64_t h = 0; h < q_.heads; ++h) {
        const int64_t kv = kv_of_[static_cast<size_t>(h)];
        if (kv < 0 || (!mla_ && kv != group)) {
          continue;
        }
        const RowMatrix q_matrix = gather<Scalar>(ctx_, q, q_, b, h, true);
        const RowMatrix k_matrix = gather<Scalar>(ctx_, k, k_, b, kv, true);
        const RowMatrix v_matrix = gather<Scalar>(ctx_, v, v_, b, kv, true);
        const RowMatrix dout_matrix = gather<Scalar>(ctx_, dout, dout_, b, h, true);
        const RowMatrix out_matrix = gather<Scalar>(ctx_, out, o_, b, h, false);
        RowMatrix cap_slope;
        const RowMatrix probabilities = softmax(q_matrix, k_matrix, k_rope, &cap_slope);
        const RowMatrix dv_matrix = round_matrix(ctx_, probabilities).transpose() * dout_matrix;
        const RowMatrix dp = dout_matrix * v_matrix.transpose();
        // D_i = sum_j dout_ij out_ij (= sum_j P_ij dP_ij for the exact output).
        const Eigen::Matrix<Scalar, Eigen::Dynamic, 1> delta =
            dout_matrix.cwiseProduct(out_matrix).rowwise().sum();
        RowMatrix ds = probabilities.cwiseProduct(dp.colwise() - delta) * scale_;
        if (soft_cap_ > 0) {
          ds = ds.cwiseProduct(cap_slope);
        }
        ds = round_matrix(ctx_, ds);
        RowMatrix dq_matrix(q_.length, q_.features);
        dq_matrix.leftCols(d_k_) = ds * k_matrix;
        const RowMatrix dk_matrix = ds.transpose() * q_matrix.leftCols(d_k_);
        if (mla_) {
          dq_matrix.rightCols(kr_.features) = ds * k_rope;
          dk_rope += ds.transpose() * q_matrix.rightCols(kr_.features);
        }
        scatter(dq, dq_, b, h, dq_matrix, false);
        dk_sum[static_cast<size_t>(kv)] += dk_matrix;
        dv_sum[static_cast<size_t>(kv)] += dv_matrix;
      }
      for (int64_t kv = 0; kv < k_.heads; ++kv) {
        if (mla_ || kv == group) {
          scatter(dk, dk_, b, kv, dk_sum[static_cast<size_t>(kv)], false);
          scatter(dv, dv_, b, kv, dv_sum[static_cast<size_t>(kv)], false);
        }
      }
      if (mla_) {
        scatter(dkr, dkr_, b, 0, dk_rope, false);
      }
    });
  }

 private:
  void check_same(const AttentionView& view, int64_t batch, int64_t length, int64_t heads,
                  int64_t features, const char* what) const {
    if (view.batch != batch || view.length != length || view.heads != heads ||
        view.features != features) {
      ctx_.fail(std::string("attention ") + what + " has the wrong shape");
    }
  }

  // The global key positions [first, last) that query position `query` may attend to:
  // kCausal key <= query; kSlidingWindow also query - key < window; kChunked also
  // key / window == query / window; kNone every key.
  std::pair<int64_t, int64_t> allowed_keys(int64_t query) const {
    const OpAttrs& attrs = ctx_.op().attrs;
    constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;  // no overflow below
    switch (attrs.mask) {
      case AttentionMask::kNone:
        return {-kUnbounded, kUnbounded};
      case AttentionMask::kCausal:
        return {-kUnbounded, query + 1};
      case AttentionMask::kSlidingWindow:
        return {query - attrs.window + 1, query + 1};
      case AttentionMask::kChunked:
        return {query / attrs.window * attrs.window, query + 1};
    }
    return {0, 0};
  }

  // Masked softmax(scale q k^T) in Scalar, soft-capped first when soft_cap_ > 0; masked entries
  // are 0. `cap_slope` (when given) receives d capped / d uncapped = 1 - tanh^2(s / cap).
  RowMatrix softmax(const RowMatrix& q, const RowMatrix& k, const RowMatrix& k_rope,
                    RowMatrix* cap_slope = nullptr) const {
    RowMatrix scores = q.leftCols(d_k_) * k.transpose();
    if (mla_) {
      scores.noalias() += q.rightCols(kr_.features) * k_rope.transpose();
    }
    scores *= scale_;
    if (soft_cap_ > 0) {
      // MaxText's attn_logits_soft_cap (attention_op.py, the dot-product path, and the splash
      // kernel's soft cap): after the query scaling and before the mask, logits -> cap tanh(
      // logits / cap), which bounds them to (-cap, cap).
      const RowMatrix tanh = (scores / soft_cap_).array().tanh().matrix();
      scores = tanh * soft_cap_;
      if (cap_slope != nullptr) {
        *cap_slope = (Scalar(1) - tanh.array().square()).matrix();
      }
    }
    for (int64_t i = 0; i < scores.rows(); ++i) {
      // Every mask allows one contiguous range of keys [first, last).
      const auto [first_key, last_key] = allowed_keys(q_position_ + i);
      const int64_t first = std::clamp<int64_t>(first_key - k_position_, 0, scores.cols());
      const int64_t last = std::clamp<int64_t>(last_key - k_position_, first, scores.cols());
      Scalar max = -std::numeric_limits<Scalar>::infinity();
      for (int64_t j = first; j < last; ++j) {
        max = std::max(max, scores(i, j));
      }
      Scalar sum = 0;
      for (int64_t j = 0; j < first; ++j) {
        scores(i, j) = 0;
      }
      for (int64_t j = first; j < last; ++j) {
        scores(i, j) = std::exp(scores(i, j) - max);
        sum += scores(i, j);
      }
      for (int64_t j = last; j < scores.cols(); ++j) {
        scores(i, j) = 0;
      }
      if (sum > 0) {
        scores.row(i) /= sum;
      }
    }
    return scores;
  }

  const Ctx& ctx_;
  bool mla_ = false;
  AttentionView q_, k_, v_, kr_, o_, dout_, dq_, dk_, dv_, dkr_;
  int64_t d_k_ = 0;
  Scalar scale_ = 1;
  Scalar soft_cap_ = 0;
  std::vector<int64_t> kv_of_;
  int64_t q_position_ = 0;
  int64_t k_position_ = 0;
};

// ------------------------------------------------------------------------------------------------
// kEmbeddingLookup(tokens[token dims], table[V, embed dims]) -> x[token dims, embed dims]:
//   x[t] = table[tokens[t] - offset] where the table's FIRST dim (vocab or position) holds the
//   global rows [offset, offset + V) on this device (offset = device.offset(table.dims[0])); a
//   token outside that range gives zeros (the engine all-reduces the vocab shards). Token and
//   embed dims are matched by name (the output's embed dims are the table's slice).
// kEmbeddingGrad(dx, tokens) -> dtable: dtable[tokens[t] - offset] += dx[t] for the tokens in the
//   local range (scatter-add); other rows 0.
// ------------------------------------------------------------------------------------------------
struct EmbeddingLayout {
  Space tokens;
  Space embed;
  std::vector<int64_t> token_strides;    // in the tokens tensor
  std::vector<int64_t> x_token_strides;  // in x / dx
  std::vector<int64_t> table_embed_strides;
  std::vector<int64_t> x_embed_strides;
  int64_t row_stride = 0;
  int64_t rows = 0;
  int64_t offset = 0;
};

EmbeddingLayout embedding_layout(const Ctx& ctx, const Tensor& tokens, const Tensor& table,
                                 const Tensor& x) {
  if (table.dims.empty()) {
    ctx.fail("embedding table has no dims");
  }
  EmbeddingLayout layout;
  layout.tokens = space_without(tokens, {});
  for (size_t index = 1; index < table.dims.size(); ++index) {
    layout.embed.add(table.dims[index].name, table.dims[index].size);
  }
  layout.token_strides = ctx.strides_in(tokens, layout.tokens, true, true);
  layout.x_token_strides = ctx.strides_in(x, layout.tokens, true, false);
  layout.table_embed_strides = ctx.strides_in(table, layout.embed, true, false);
  layout.x_embed_strides = ctx.strides_in(x, layout.embed, true, false);
  if (x.dims.size() != layout.tokens.names.size() + layout.embed.names.size()) {
    ctx.fail("embedding output must have the token dims and the table's embed dims");
  }
  layout.row_stride = strides_of(table).front();
  layout.rows = table.dims.front().size;
  layout.offset = ctx.device().offset(table.dims.front());
  return layout;
}

// (table offset within a row, x offset within a token) of every embed element.
std::vector<std::pair<int64_t, int64_t>> embed_offsets(const EmbeddingLayout& layout) {
  std::vector<std::pair<int64_t, int64_t>> offsets;
  const std::array<std::vector<int64_t>, 2> strides = {layout.table_embed_strides,
                                                       layout.x_embed_strides};
  for_each_index(layout.embed.sizes, strides,
                 [&](const std::array<int64_t, 2>& at) { offsets.emplace_back(at[0], at[1]); });
  return offsets;
}

void run_embedding(const Ctx& ctx, bool gradient) {
  ctx.expect_counts(2, 2, 1, 1);
  const Tensor& tokens = ctx.in_tensor(gradient ? 1 : 0);
  const Tensor& table = gradient ? ctx.out_tensor(0) : ctx.in_tensor(1);
  const Tensor& x = gradient ? ctx.in_tensor(0) : ctx.out_tensor(0);
  const EmbeddingLayout layout = embedding_layout(ctx, tokens, table, x);
  const std::vector<std::pair<int64_t, int64_t>> pairs = embed_offsets(layout);
  const float* token_values = ctx.in(gradient ? 1 : 0);
  const std::array<std::vector<int64_t>, 2> strides = {layout.token_strides,
                                                       layout.x_token_strides};
  if (gradient) {
    const float* dx = ctx.in(0);
    float* dtable = ctx.out(0);
    std::vector<double> sums(static_cast<size_t>(layout.rows * layout.row_stride), 0.0);
    for_each_index(layout.tokens.sizes, strides, [&](const std::array<int64_t, 2>& at) {
      const int64_t row = to_index(token_values[at[0]]) - layout.offset;
      if (row < 0 || row >= layout.rows) {
        return;
      }
      for (const auto& [table_at, x_at] : pairs) {
        sums[static_cast<size_t>(row * layout.row_stride + table_at)] += dx[at[1] + x_at];
      }
    });
    for (size_t index = 0; index < sums.size(); ++index) {
      dtable[index] = static_cast<float>(sums[index]);
    }
    return;
  }
  const float* table_values = ctx.in(1);
  float* out = ctx.out(0);
  for_each_index(layout.tokens.sizes, strides, [&](const std::array<int64_t, 2>& at) {
    const int64_t row = to_index(token_values[at[0]]) - layout.offset;
    if (row < 0 || row >= layout.rows) {
      return;
    }
    for (const auto& [table_at, x_at] : pairs) {
      out[at[1] + x_at] = table_values[row * layout.row_stride + table_at];
    }
  });
}

// ------------------------------------------------------------------------------------------------
// Cross-entropy over the dim named "vocab" of logits[token dims, vocab]; targets[token dims].
//   Local vocab entries past the dim's global size (padding of an uneven split) are ignored, and
//   a target t is local iff offset <= t < offset + valid local size (offset =
//   device.offset(vocab)). The global token count T is the product of the GLOBAL sizes of the
//   logits' non-vocab dims times attrs.token_chunks (a chunked head, num_vocab_tiling: each
//   chunk's loss and gradient are its share of the mean over all chunks' tokens).
// kCrossEntropy(logits, targets[, stats]) -> loss (shape {}): sum over local tokens of
//   (lse - logit[target]) / T. Without stats the vocab dim is whole; with stats [token dims, 3]
//   = globally combined (max, sum exp(logit - max), target logit): lse = max + log(sum).
// kCrossEntropyStatistics(logits, targets) -> [token dims, 3]: the local max, the local
//   sum exp(logit - local max), and the target's logit if local else 0. (The engine combines
//   them: max' = max(m1, m2), sum' = s1 exp(m1 - max') + s2 exp(m2 - max'), targets summed.) With
//   no valid local entries the max is the lowest float and the sum 0.
// kCrossEntropyGrad(logits, targets[, stats]) -> dlogits = (softmax - onehot(target)) / T, the
//   softmax over the global vocab from the stats when given (padding entries get 0).
// Logit transform (MaxText's tied output head, decoders.py: normalize_embedding_logits divides
//   the logits by sqrt(emb_dim), then final_logits_soft_cap c maps them to c tanh(logits / c)):
//   every op above reads each logit x as z = c tanh(m x / c) (z = m x when c = attrs.
//   logit_soft_cap is 0; m = attrs.logit_multiplier), and the gradient is taken through it:
//   dlogits = (softmax(z) - onehot) / T x m (1 - tanh^2(m x / c)) (x m when c is 0).
// ------------------------------------------------------------------------------------------------
class CrossEntropyKernel {
 public:
  explicit CrossEntropyKernel(const Ctx& ctx) : ctx_(ctx) {
    const Tensor& logits = ctx.in_tensor(0);
    const Dim& vocab = ctx.dim(logits, "vocab");
    tokens_ = space_without(logits, {"vocab"});
    vocab_size_ = vocab.size;
    vocab_offset_ = ctx.device().offset(vocab);
    valid_ = std::clamp<int64_t>(vocab.whole_size() - vocab_offset_, 0, vocab_size_);
    vocab_stride_ = ctx.stride(logits, "vocab");
    logits_strides_ = ctx.strides_in(logits, tokens_, true, false);
    targets_strides_ = ctx.strides_in(ctx.in_tensor(1), tokens_, true, true);
    token_count_ = std::max<int64_t>(1, ctx.op().attrs.token_chunks);
    soft_cap_ = ctx.op().attrs.logit_soft_cap;
    multiplier_ = ctx.op().attrs.logit_multiplier;
    for (const Dim& dim : logits.dims) {
      if (dim.name != "vocab") {
        token_count_ *= dim.whole_size();
      }
    }
  }

  // Strides of a [token dims, 3] statistics tensor.
  std::pair<std::vector<int64_t>, int64_t> stats_strides(const Tensor& stats) const {
    if (stats.dims.size() != tokens_.names.size() + 1 || stats.dims.back().size != 3) {
      ctx_.fail("cross-entropy statistics '" + stats.name + "' must be [tokens..., 3]");
    }
    Space all = tokens_;
    all.add(stats.dims.back().name, 3);
    ctx_.strides_in(stats, all, true, true);
    return {ctx_.strides_in(stats, tokens_, true, false), strides_of(stats).back()};
  }

  struct Row {
    double max = 0;
    double sum = 0;
    double target = 0;
  };

  template <typename Body>
  void for_each_token(const std::vector<int64_t>& other, Body&& body) const {
    const std::array<std::vector<int64_t>, 3> strides = {logits_strides_, targets_strides_, other};
    for_each_index(tokens_.sizes, strides,
                   [&](const std::array<int64_t, 3>& at) { body(at[0], at[1], at[2]); });
  }

  // The logit the loss sees: z = cap tanh(m x / cap), or m x without a cap.
  double transformed(float logit) const {
    const double scaled = multiplier_ * static_cast<double>(logit);
    return soft_cap_ > 0 ? soft_cap_ * std::tanh(scaled / soft_cap_) : scaled;
  }
  // dz / dx.
  double slope(float logit) const {
    if (soft_cap_ <= 0) {
      return multiplier_;
    }
    const double t = std::tanh(multiplier_ * static_cast<double>(logit) / soft_cap_);
    return multiplier_ * (1.0 - t * t);
  }

  // Local statistics of one token's (transformed) logits.
  Row local_row(const float* logits, int64_t target_local) const {
    Row row;
    row.max = std::numeric_limits<float>::lowest();
    for (int64_t j = 0; j < valid_; ++j) {
      row.max = std::max(row.max, transformed(logits[j * vocab_stride_]));
    }
    for (int64_t j = 0; j < valid_; ++j) {
      row.sum += std::exp(transformed(logits[j * vocab_stride_]) - row.max);
    }
    if (target_local >= 0 && target_local < valid_) {
      row.target = transformed(logits[target_local * vocab_stride_]);
    }
    return row;
  }

  void loss() const {
    ctx_.expect_counts(2, 3, 1, 1);
    if (!ctx_.out_tensor(0).dims.empty()) {
      ctx_.fail("the loss is a scalar");
    }
    const bool with_stats = ctx_.num_inputs() == 3;
    std::vector<int64_t> stats_tokens(tokens_.names.size(), 0);
    int64_t value_stride = 0;
    if (with_stats) {
      std::tie(stats_tokens, value_stride) = stats_strides(ctx_.in_tensor(2));
    }
    const float* logits = ctx_.in(0);
    const float* targets = ctx_.in(1);
    const float* stats = with_stats ? ctx_.in(2) : nullptr;
    TokenLogProbs* sink = ctx_.device().token_log_probs;
    const bool record = sink != nullptr && sink->current_microbatch == sink->microbatch;
    // By the targets' local element: -(lse - target logit).
    std::vector<float> log_probs(record ? static_cast<size_t>(ctx_.in_tensor(1).num_elements())
                                        : 0);
    double total = 0;
    for_each_token(stats_tokens, [&](int64_t logits_at, int64_t target_at, int64_t stats_at) {
      Row row;
      if (with_stats) {
        row.max = stats[stats_at];
        row.sum = stats[stats_at + value_stride];
        row.target = stats[stats_at + 2 * value_stride];
      } else {
        row = local_row(logits + logits_at, to_index(targets[target_at]) - vocab_offset_);
      }
      const double token_loss = row.max + std::log(row.sum) - row.target;
      total += token_loss;
      if (record) {
        log_probs[static_cast<size_t>(target_at)] = static_cast<float>(-token_loss);
      }
    });
    ctx_.out(0)[0] = static_cast<float>(total / static_cast<double>(token_count_));
    if (record) {
      record_log_probs(*sink, log_probs);
    }
  }

  // Places this device's per-token log-probabilities at their global [sequence, position].
  void record_log_probs(TokenLogProbs& sink, const std::vector<float>& log_probs) const {
    const Tensor& targets = ctx_.in_tensor(1);
    if (targets.dims.size() != 2) {
      ctx_.fail("the token probability view needs [batch, length] targets");
    }
    const int64_t chunk_length = targets.dims[1].whole_size();
    sink.values.resize(static_cast<size_t>(sink.sequences * sink.length),
                       std::numeric_limits<float>::quiet_NaN());
    ctx_.device().for_each_global_element(targets, [&](int64_t local, int64_t global) {
      if (global < 0) {
        return;
      }
      const int64_t sequence = global / chunk_length;
      const int64_t position = sink.chunk * chunk_length + global % chunk_length;
      if (sequence < sink.sequences && position < sink.length) {
        sink.values[static_cast<size_t>(sequence * sink.length + position)] =
            log_probs[static_cast<size_t>(local)];
      }
    });
  }

  void statistics() const {
    ctx_.expect_counts(2, 2, 1, 1);
    std::vector<int64_t> out_tokens;
    int64_t value_stride = 0;
    std::tie(out_tokens, value_stride) = stats_strides(ctx_.out_tensor(0));
    const float* logits = ctx_.in(0);
    const float* targets = ctx_.in(1);
    float* out = ctx_.out(0);
    for_each_token(out_tokens, [&](int64_t logits_at, int64_t target_at, int64_t out_at) {
      const Row row = local_row(logits + logits_at, to_index(targets[target_at]) - vocab_offset_);
      out[out_at] = static_cast<float>(row.max);
      out[out_at + value_stride] = static_cast<float>(row.sum);
      out[out_at + 2 * value_stride] = static_cast<float>(row.target);
    });
  }

  void gradient() const {
    ctx_.expect_counts(2, 3, 1, 1);
    const Tensor& dlogits_tensor = ctx_.out_tensor(0);
    Space all = tokens_;
    all.add("vocab", vocab_size_);
    ctx_.strides_in(dlogits_tensor, all, true, true);
    const std::vector<int64_t> d_tokens = ctx_.strides_in(dlogits_tensor, tokens_, true, false);
    const int64_t d_step = ctx_.stride(dlogits_tensor, "vocab");
    const bool with_stats = ctx_.num_inputs() == 3;
    std::vector<int64_t> stats_tokens(tokens_.names.size(), 0);
    int64_t value_stride = 0;
    if (with_stats) {
      std::tie(stats_tokens, value_stride) = stats_strides(ctx_.in_tensor(2));
    }
    const float* logits = ctx_.in(0);
    const float* targets = ctx_.in(1);
    const float* stats = with_stats ? ctx_.in(2) : nullptr;
    float* dlogits = ctx_.out(0);
    const double inverse_count = 1.0 / static_cast<double>(token_count_);
    const std::array<std::vector<int64_t>, 4> strides = {logits_strides_, targets_strides_,
                                                         stats_tokens, d_tokens};
    for_each_index(tokens_.sizes, strides, [&](const std::array<int64_t, 4>& at) {
      const int64_t target = to_index(targets[at[1]]) - vocab_offset_;
      double max = 0;
      double sum = 0;
      if (with_stats) {
        max = stats[at[2]];
        sum = stats[at[2] + value_stride];
      } else {
        const Row row = local_row(logits + at[0], target);
        max = row.max;
        sum = row.sum;
      }
      for (int64_t j = 0; j < valid_; ++j) {
        const float logit = logits[at[0] + j * vocab_stride_];
        const double p = std::exp(transformed(logit) - max) / sum;
        dlogits[at[3] + j * d_step] =
            static_cast<float>((p - (j == target ? 1.0 : 0.0)) * inverse_count * slope(logit));
      }
    });
  }

 private:
  const Ctx& ctx_;
  Space tokens_;
  int64_t vocab_size_ = 0;
  int64_t vocab_offset_ = 0;
  int64_t valid_ = 0;
  int64_t vocab_stride_ = 0;
  std::vector<int64_t> logits_strides_;
  std::vector<int64_t> targets_strides_;
  int64_t token_count_ = 1;
  double soft_cap_ = 0;
  double multiplier_ = 1;
};

// ------------------------------------------------------------------------------------------------
// MoE. routing[token dims, top_k, route=2] (dims "top_k" and "route" by name; the token dims are
// its other dims): routing[t, c, 0] = expert index (as float), routing[t, c, 1] = weight.
// kMoeRouter(router_logits[token dims, experts]) -> routing: softmax over "experts" (whole), the
//   attrs.top_k largest probabilities in descending order (ties: lower index first).
// kRouterGrad, by input count:
//   (d_routing, router_logits) -> d_router_logits: VJP through the softmax of the picked
//     probabilities (the selection is piecewise constant; the index channel's gradient is
//     ignored): dp_e = sum of d_routing[t, c, 1] over the choices c of expert e;
//     dlogits = p * (dp - sum(p dp)).
//   (d_combined[token dims, embed], expert_out[experts, expert_tokens, embed], routing) ->
//     d_routing: channel 1 = sum over embed of d_combined[t] * expert_out[e, slot] for each kept
//     choice (0 for dropped ones), channel 0 = 0.
// Slot assignment (dispatch, combine and their gradients; deterministic): tokens in row-major
//   order of routing's LOCAL token dims, choices c = 0..top_k-1. The grouped tensor's "experts"
//   dim must be whole (size E = number of experts); C = its local expert_tokens.
//   - Capacity (attrs.capacity_factor > 0): a token-choice of expert e takes the next free slot
//     (e, s) of e, s in [0, C); when e is full it is dropped (contributes nothing).
//   - Dropless (capacity_factor <= 0): the E x C slots read row-major are rows, in
//     S = attrs.expert_shards blocks of E/S x C rows, block b for experts [b E/S, (b+1) E/S).
//     Block b holds the choices of its experts sorted by expert (then token, then choice) from
//     its first row; the rest of it is empty. Nothing is dropped: more choices than a block holds
//     is an error (the partitioner sizes C for the worst case), unless
//     attrs.ragged_buffer_factor > 0 bounded the block: then the choices past its end (the last
//     in that order) are dropped.
// kMoeDispatch(x[token dims, embed], routing) -> grouped[experts, expert_tokens, embed]
//   [, row_experts[experts, expert_tokens]]: grouped[slot] = x[t]; unused slots 0; row_experts
//   (dropless) = the expert of each slot, -1 when empty. op.phase == kBackward (VJP of combine):
//   inputs are (d_combined, routing) and grouped[slot] = weight * d_combined[t].
// kMoeCombine(expert_out, routing) -> y[token dims, embed] = sum over choices of
//   weight * expert_out[e, slot]. op.phase == kBackward (VJP of dispatch): inputs (d_grouped,
//   routing) and y = sum over choices of d_grouped[e, slot] (no weight).
// The non-token dims of the token tensor (embed) and of the grouped tensor other than experts and
// expert_tokens are matched by name.
// ------------------------------------------------------------------------------------------------
struct RoutingLayout {
  Space tokens;
  std::vector<int64_t> token_offsets;  // per token (row-major over `tokens`): routing offset
  int64_t top_k = 0;
  int64_t choice_stride = 0;
  int64_t route_stride = 0;
};

RoutingLayout routing_layout(const Ctx& ctx, const Tensor& routing) {
  RoutingLayout layout;
  layout.tokens = space_without(routing, {"top_k", "route"});
  const Dim& route = ctx.dim(routing, "route");
  if (route.size != 2) {
    ctx.fail("routing's route dim must have 2 channels");
  }
  layout.top_k = ctx.dim(routing, "top_k").size;
  layout.choice_stride = ctx.stride(routing, "top_k");
  layout.route_stride = ctx.stride(routing, "route");
  const std::array<std::vector<int64_t>, 1> strides = {
      ctx.strides_in(routing, layout.tokens, true, false)};
  for_each_index(layout.tokens.sizes, strides,
                 [&](const std::array<int64_t, 1>& at) { layout.token_offsets.push_back(at[0]); });
  return layout;
}

struct Assignment {
  int64_t expert = 0;
  int64_t position = 0;  // index in the grouped tensor's experts dim (capacity: the expert)
  int64_t slot = -1;     // index in its expert_tokens dim; -1: dropped
  float weight = 0;
};

class MoeKernel {
 public:
  // `token_tensor` / `grouped_tensor`: the [token dims, embed] and [experts, expert_tokens, embed]
  // tensors of the op; `routing_tensor` with its data.
  MoeKernel(const Ctx& ctx, const Tensor& token_tensor, const Tensor& grouped_tensor,
            const Tensor& routing_tensor, const float* routing)
      : layout_(routing_layout(ctx, routing_tensor)) {
    token_at_ = offsets_of(ctx, token_tensor, layout_.tokens);
    const Dim& experts = ctx.dim(grouped_tensor, "experts");
    if (experts.whole_size() != experts.size) {
      ctx.fail("the grouped tensor's experts dim must be whole");
    }
    experts_ = experts.size;
    capacity_ = ctx.dim(grouped_tensor, "expert_tokens").size;
    expert_stride_ = ctx.stride(grouped_tensor, "experts");
    slot_stride_ = ctx.stride(grouped_tensor, "expert_tokens");
    const Space features = space_without(grouped_tensor, {"experts", "expert_tokens"});
    if (token_tensor.dims.size() != layout_.tokens.names.size() + features.names.size()) {
      ctx.fail("token tensor '" + token_tensor.name +
               "' must have the routing's token dims and the grouped feature dims");
    }
    const std::array<std::vector<int64_t>, 2> strides = {
        ctx.strides_in(token_tensor, features, true, false),
        ctx.strides_in(grouped_tensor, features, true, false)};
    for_each_index(features.sizes, strides,
                   [&](const std::array<int64_t, 2>& at) { features_.emplace_back(at[0], at[1]); });
    // Slots.
    std::vector<int64_t> used(static_cast<size_t>(experts_), 0);
    for (const int64_t at : layout_.token_offsets) {
      for (int64_t c = 0; c < layout_.top_k; ++c) {
        const int64_t base = at + c * layout_.choice_stride;
        Assignment assignment;
        assignment.expert = to_index(routing[base]);
        assignment.position = assignment.expert;
        assignment.weight = routing[base + layout_.route_stride];
        if (assignment.expert < 0 || assignment.expert >= experts_) {
          ctx.fail("routing names expert " + std::to_string(assignment.expert) + " of " +
                   std::to_string(experts_));
        }
        int64_t& count = used[static_cast<size_t>(assignment.expert)];
        if (count < capacity_) {
          assignment.slot = count;
        }
        ++count;
        assignments_.push_back(assignment);
      }
    }
    if (ctx.op().attrs.capacity_factor <= 0) {
      place_dropless(ctx, used);
    }
  }

  // The dropless rows (see the slot assignment above); `counts` = choices per expert.
  void place_dropless(const Ctx& ctx, const std::vector<int64_t>& counts) {
    const int64_t shards = std::max<int64_t>(1, ctx.op().attrs.expert_shards);
    if (experts_ % shards != 0) {
      ctx.fail("the " + std::to_string(experts_) + " experts do not split into " +
               std::to_string(shards) + " expert shards");
    }
    const int64_t shard_experts = experts_ / shards;
    const int64_t block_rows = shard_experts * capacity_;
    // First row of each expert within its block.
    std::vector<int64_t> next(static_cast<size_t>(experts_), 0);
    for (int64_t shard = 0; shard < shards; ++shard) {
      int64_t rows = 0;
      for (int64_t e = shard * shard_experts; e < (shard + 1) * shard_experts; ++e) {
        next[static_cast<size_t>(e)] = rows;
        rows += counts[static_cast<size_t>(e)];
      }
      if (rows > block_rows && ctx.op().attrs.ragged_buffer_factor <= 0) {
        ctx.fail("dropless MoE: " + std::to_string(rows) + " token choices for expert shard " +
                 std::to_string(shard) + " exceed its " + std::to_string(block_rows) + " rows");
      }
    }
    for (Assignment& assignment : assignments_) {
      const int64_t shard = assignment.expert / shard_experts;
      const int64_t rank = next[static_cast<size_t>(assignment.expert)]++;
      if (rank >= block_rows) {
        assignment.slot = -1;  // beyond a bounded buffer (ragged_buffer_factor): dropped
        continue;
      }
      const int64_t row = shard * block_rows + rank;
      assignment.position = row / capacity_;
      assignment.slot = row % capacity_;
    }
  }

  // row_experts[position, slot] = the expert of each used row, -1 elsewhere.
  void row_experts(const Ctx& ctx, const Tensor& rows_tensor, float* rows) const {
    Space space;
    space.add("experts", experts_);
    space.add("expert_tokens", capacity_);
    const std::vector<int64_t> strides = ctx.strides_in(rows_tensor, space, true, true);
    for (int64_t position = 0; position < experts_; ++position) {
      for (int64_t slot = 0; slot < capacity_; ++slot) {
        rows[position * strides[0] + slot * strides[1]] = -1.0f;
      }
    }
    for (const Assignment& assignment : assignments_) {
      if (assignment.slot >= 0) {
        rows[assignment.position * strides[0] + assignment.slot * strides[1]] =
            static_cast<float>(assignment.expert);
      }
    }
  }

  // grouped[e, slot] = (weighted ? weight : 1) * tokens[t].
  void dispatch(const float* tokens, float* grouped, bool weighted) const {
    for_each_kept([&](int64_t token_at, int64_t grouped_at, const Assignment& assignment) {
      const float factor = weighted ? assignment.weight : 1.0f;
      for (const auto& [t, g] : features_) {
        grouped[grouped_at + g] = factor * tokens[token_at + t];
      }
    });
  }

  // tokens[t] += (weighted ? weight : 1) * grouped[e, slot].
  void combine(const float* grouped, float* tokens, bool weighted) const {
    for_each_kept([&](int64_t token_at, int64_t grouped_at, const Assignment& assignment) {
      const float factor = weighted ? assignment.weight : 1.0f;
      for (const auto& [t, g] : features_) {
        tokens[token_at + t] += factor * grouped[grouped_at + g];
      }
    });
  }

  // d_routing channel 1 = <d_combined[t], expert_out[e, slot]>.
  void weight_grad(const float* d_combined, const float* expert_out, float* d_routing) const {
    size_t index = 0;
    for (size_t token = 0; token < token_at_.size(); ++token) {
      for (int64_t c = 0; c < layout_.top_k; ++c, ++index) {
        const Assignment& assignment = assignments_[index];
        if (assignment.slot < 0) {
          continue;
        }
        const int64_t grouped_at =
            assignment.position * expert_stride_ + assignment.slot * slot_stride_;
        double dot = 0;
        for (const auto& [t, g] : features_) {
          dot += static_cast<double>(d_combined[token_at_[token] + t]) * expert_out[grouped_at + g];
        }
        d_routing[layout_.token_offsets[token] + c * layout_.choice_stride + layout_.route_stride] =
            static_cast<float>(dot);
      }
    }
  }

 private:
  template <typename Body>
  void for_each_kept(Body&& body) const {
    size_t index = 0;
    for (size_t token = 0; token < token_at_.size(); ++token) {
      for (int64_t c = 0; c < layout_.top_k; ++c, ++index) {
        const Assignment& assignment = assignments_[index];
        if (assignment.slot >= 0) {
          body(token_at_[token],
               assignment.position * expert_stride_ + assignment.slot * slot_stride_, assignment);
        }
      }
    }
  }

  RoutingLayout layout_;
  std::vector<int64_t> token_at_;
  int64_t experts_ = 0;
  int64_t capacity_ = 0;
  int64_t expert_stride_ = 0;
  int64_t slot_stride_ = 0;
  std::vector<std::pair<int64_t, int64_t>> features_;  // (token tensor, grouped tensor) offsets
  std::vector<Assignment> assignments_;
};

void run_moe_dispatch(const Ctx& ctx) {
  ctx.expect_counts(2, 2, 1, 2);
  const MoeKernel kernel(ctx, ctx.in_tensor(0), ctx.out_tensor(0), ctx.in_tensor(1), ctx.in(1));
  kernel.dispatch(ctx.in(0), ctx.out(0), ctx.op().phase == Phase::kBackward);
  if (ctx.num_outputs() == 2) {
    if (ctx.op().attrs.capacity_factor > 0) {
      ctx.fail("row_experts belong to a dropless dispatch (capacity_factor <= 0)");
    }
    kernel.row_experts(ctx, ctx.out_tensor(1), ctx.out(1));
  }
}

void run_moe_combine(const Ctx& ctx) {
  ctx.expect_counts(2, 2, 1, 1);
  const MoeKernel kernel(ctx, ctx.out_tensor(0), ctx.in_tensor(0), ctx.in_tensor(1), ctx.in(1));
  kernel.combine(ctx.in(0), ctx.out(0), ctx.op().phase != Phase::kBackward);
}

// Softmax probabilities of one token's router logits and its top-k experts.
struct RouterRow {
  std::vector<double> probabilities;
  std::vector<int64_t> chosen;
};

RouterRow route_token(const float* logits, int64_t experts, int64_t stride, int64_t top_k) {
  RouterRow row;
  row.probabilities.resize(static_cast<size_t>(experts));
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t e = 0; e < experts; ++e) {
    max = std::max(max, static_cast<double>(logits[e * stride]));
  }
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    row.probabilities[static_cast<size_t>(e)] = std::exp(logits[e * stride] - max);
    sum += row.probabilities[static_cast<size_t>(e)];
  }
  for (double& p : row.probabilities) {
    p /= sum;
  }
  std::vector<int64_t> order(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    order[static_cast<size_t>(e)] = e;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t lhs, int64_t rhs) {
    return row.probabilities[static_cast<size_t>(lhs)] >
           row.probabilities[static_cast<size_t>(rhs)];
  });
  order.resize(static_cast<size_t>(top_k));
  row.chosen = order;
  return row;
}

void run_router(const Ctx& ctx, bool gradient) {
  // Forward: (logits) -> routing; gradient: (d_routing, logits) -> d_logits.
  const Tensor& logits = ctx.in_tensor(gradient ? 1 : 0);
  const Tensor& routing = gradient ? ctx.in_tensor(0) : ctx.out_tensor(0);
  const RoutingLayout layout = routing_layout(ctx, routing);
  const Dim& experts = ctx.dim(logits, "experts");
  if (experts.whole_size() != experts.size) {
    ctx.fail("the router's experts dim must be whole");
  }
  if (layout.top_k > experts.size ||
      (ctx.op().attrs.top_k > 0 && ctx.op().attrs.top_k != layout.top_k)) {
    ctx.fail("routing top_k does not match attrs.top_k or the experts");
  }
  Space all = layout.tokens;
  all.add("experts", experts.size);
  ctx.strides_in(logits, all, true, true);
  const std::vector<int64_t> logits_at = offsets_of(ctx, logits, layout.tokens);
  const int64_t stride = ctx.stride(logits, "experts");
  const float* logit_values = ctx.in(gradient ? 1 : 0);
  if (!gradient) {
    float* out = ctx.out(0);
    for (size_t token = 0; token < logits_at.size(); ++token) {
      const RouterRow row =
          route_token(logit_values + logits_at[token], experts.size, stride, layout.top_k);
      for (int64_t c = 0; c < layout.top_k; ++c) {
        const int64_t base = layout.token_offsets[token] + c * layout.choice_stride;
        const int64_t expert = row.chosen[static_cast<size_t>(c)];
        out[base] = static_cast<float>(expert);
        out[base + layout.route_stride] =
            static_cast<float>(row.probabilities[static_cast<size_t>(expert)]);
      }
    }
    return;
  }
  const Tensor& d_logits_tensor = ctx.out_tensor(0);
  ctx.strides_in(d_logits_tensor, all, true, true);
  const std::vector<int64_t> d_at = offsets_of(ctx, d_logits_tensor, layout.tokens);
  const int64_t d_stride = ctx.stride(d_logits_tensor, "experts");
  const float* d_routing = ctx.in(0);
  float* d_logits = ctx.out(0);
  for (size_t token = 0; token < logits_at.size(); ++token) {
    const RouterRow row =
        route_token(logit_values + logits_at[token], experts.size, stride, layout.top_k);
    std::vector<double> dp(static_cast<size_t>(experts.size), 0.0);
    for (int64_t c = 0; c < layout.top_k; ++c) {
      const int64_t base = layout.token_offsets[token] + c * layout.choice_stride;
      dp[static_cast<size_t>(row.chosen[static_cast<size_t>(c)])] +=
          d_routing[base + layout.route_stride];
    }
    double inner = 0;
    for (int64_t e = 0; e < experts.size; ++e) {
      inner += row.probabilities[static_cast<size_t>(e)] * dp[static_cast<size_t>(e)];
    }
    for (int64_t e = 0; e < experts.size; ++e) {
      d_logits[d_at[token] + e * d_stride] = static_cast<float>(
          row.probabilities[static_cast<size_t>(e)] * (dp[static_cast<size_t>(e)] - inner));
    }
  }
}

void run_router_grad(const Ctx& ctx) {
  ctx.expect_counts(2, 3, 1, 1);
  if (ctx.num_inputs() == 2) {
    run_router(ctx, true);
    return;
  }
  // (d_combined, expert_out, routing) -> d_routing.
  const Tensor& routing = ctx.in_tensor(2);
  if (!same_dims(ctx.out_tensor(0), routing)) {
    ctx.fail("d_routing must have the routing's dims");
  }
  const MoeKernel kernel(ctx, ctx.in_tensor(0), ctx.in_tensor(1), routing, ctx.in(2));
  kernel.weight_grad(ctx.in(0), ctx.in(1), ctx.out(0));
}

// ------------------------------------------------------------------------------------------------
// kAdamUpdate(param, grad, mu, nu) -> param', mu', nu' (all the same dims): optax AdamW with
//   device.optimizer: g = grad * gradient_scale; mu' = b1 mu + (1 - b1) g;
//   nu' = b2 nu + (1 - b2) g^2; mhat = mu' / (1 - b1^step); nhat = nu' / (1 - b2^step);
//   param' = param - lr * (mhat / (sqrt(nhat + eps_root) + eps) + weight_decay * param).
//   Computed in double per element.
// ------------------------------------------------------------------------------------------------
void run_adam(const Ctx& ctx) {
  ctx.expect_counts(4, 4, 3, 3);
  const Tensor& param = ctx.in_tensor(0);
  const Space space = space_without(param, {});
  for (size_t index = 0; index < 4; ++index) {
    if (!same_dims(ctx.in_tensor(index), param) ||
        (index < 3 && !same_dims(ctx.out_tensor(index), param))) {
      ctx.fail("AdamW tensors must all have the parameter's dims");
    }
  }
  const DeviceContext::Optimizer& opt = ctx.device().optimizer;
  const double step = static_cast<double>(opt.step);
  const double correction1 = 1.0 - std::pow(opt.b1, step);
  const double correction2 = 1.0 - std::pow(opt.b2, step);
  const float* p = ctx.in(0);
  const float* grad = ctx.in(1);
  const float* mu = ctx.in(2);
  const float* nu = ctx.in(3);
  float* p_out = ctx.out_unfilled(0);  // every element is written below
  float* mu_out = ctx.out_unfilled(1);
  float* nu_out = ctx.out_unfilled(2);
  const int64_t count = space.count();
  // Elementwise: pieces of a fixed size on the kernel threads.
  constexpr int64_t kPiece = 1 << 15;
  const int64_t pieces = (count + kPiece - 1) / kPiece;
  if (ctx.device().fast_kernels) {
    // functional_precision=fast: the same formula in fp32, the bias corrections as factors.
    const auto b1 = static_cast<float>(opt.b1);
    const auto b2 = static_cast<float>(opt.b2);
    const auto scale = static_cast<float>(opt.gradient_scale);
    const auto inverse1 = static_cast<float>(1.0 / correction1);
    const auto inverse2 = static_cast<float>(1.0 / correction2);
    const auto eps = static_cast<float>(opt.eps);
    const auto eps_root = static_cast<float>(opt.eps_root);
    const auto decay = static_cast<float>(opt.weight_decay);
    const auto rate = static_cast<float>(opt.learning_rate);
    parallel_for(ctx.device().threads, pieces, [&](int64_t piece) {
      const int64_t end = std::min(count, (piece + 1) * kPiece);
      for (int64_t index = piece * kPiece; index < end; ++index) {
        const float g = grad[index] * scale;
        const float m = b1 * mu[index] + (1.0f - b1) * g;
        const float v = b2 * nu[index] + (1.0f - b2) * g * g;
        const float update =
            m * inverse1 / (std::sqrt(v * inverse2 + eps_root) + eps) + decay * p[index];
        p_out[index] = p[index] - rate * update;
        mu_out[index] = m;
        nu_out[index] = v;
      }
    });
    return;
  }
  parallel_for(ctx.device().threads, pieces, [&](int64_t piece) {
    const int64_t end = std::min(count, (piece + 1) * kPiece);
    for (int64_t index = piece * kPiece; index < end; ++index) {
      const double g = grad[index] * opt.gradient_scale;
      const double m = opt.b1 * mu[index] + (1.0 - opt.b1) * g;
      const double v = opt.b2 * nu[index] + (1.0 - opt.b2) * g * g;
      const double mhat = m / correction1;
      const double vhat = v / correction2;
      const double update =
          mhat / (std::sqrt(vhat + opt.eps_root) + opt.eps) + opt.weight_decay * p[index];
      p_out[index] = static_cast<float>(p[index] - opt.learning_rate * update);
      mu_out[index] = static_cast<float>(m);
      nu_out[index] = static_cast<float>(v);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// kDynamicSlice(x) -> y (same dim names): y keeps the part of x it covers; per dim (by name) the
//   local start in x is device.offset(y dim) - device.offset(x dim) (must be >= 0). Positions
//   past x's local size (padding of an uneven split) are 0.
// kHostOffload, kHostLoad: copy (same dims).
// ------------------------------------------------------------------------------------------------
void run_dynamic_slice(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& x = ctx.in_tensor(0);
  const Tensor& y = ctx.out_tensor(0);
  if (x.dims.size() != y.dims.size()) {
    ctx.fail("a slice keeps the dims of its input");
  }
  const std::vector<int64_t> x_strides = strides_of(x);
  // Per y dim: x offset of each y index, or -1 when past x.
  std::vector<std::vector<int64_t>> x_at(y.dims.size());
  for (size_t index = 0; index < y.dims.size(); ++index) {
    const Dim& y_dim = y.dims[index];
    const int x_index = x.dim_index(y_dim.name);
    if (x_index < 0) {
      ctx.fail("slice input lacks dim '" + y_dim.name + "'");
    }
    const Dim& x_dim = x.dims[static_cast<size_t>(x_index)];
    const int64_t start = ctx.device().offset(y_dim) - ctx.device().offset(x_dim);
    if (start < 0) {
      ctx.fail("slice of dim '" + y_dim.name + "' starts outside its input");
    }
    for (int64_t position = 0; position < y_dim.size; ++position) {
      const int64_t source = start + position;
      x_at[index].push_back(source < x_dim.size ? source * x_strides[static_cast<size_t>(x_index)]
                                                : -1);
    }
  }
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  const int64_t count = space_without(y, {}).count();
  std::vector<int64_t> index(y.dims.size(), 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t source = 0;
    bool inside = true;
    for (size_t dim = 0; dim < index.size(); ++dim) {
      const int64_t at = x_at[dim][static_cast<size_t>(index[dim])];
      inside = inside && at >= 0;
      source += at;
    }
    out[flat] = inside ? in[source] : 0.0f;
    for (size_t dim = index.size(); dim > 0; --dim) {
      if (++index[dim - 1] < y.dims[dim - 1].size) {
        break;
      }
      index[dim - 1] = 0;
    }
  }
}

void run_copy(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& x = ctx.in_tensor(0);
  const Tensor& y = ctx.out_tensor(0);
  Space space = space_without(y, {});
  const std::array<std::vector<int64_t>, 2> strides = {ctx.strides_in(x, space, true, true),
                                                       strides_of(y)};
  const float* in = ctx.in(0);
  float* out = ctx.out(0);
  for_each_index(space.sizes, strides,
                 [&](const std::array<int64_t, 2>& at) { out[at[1]] = in[at[0]]; });
}

}  // namespace

void run_kernel(const Graph& graph, const Op& op, const std::vector<const TensorData*>& inputs,
                const std::vector<TensorData*>& outputs, const DeviceContext& device) {
  const Ctx ctx(graph, op, inputs, outputs, device);
  switch (op.kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kAllToAll:
    case OpKind::kCollectivePermute:
      throw std::logic_error(std::string("not a compute op: ") + op_kind_name(op.kind) + " '" +
                             op.name + "'");
    default:
      break;
  }
  ctx.check_shapes();
  switch (op.kind) {
    case OpKind::kEinsum:
      run_einsum(ctx);
      return;
    case OpKind::kElementwise:
      run_elementwise(ctx);
      return;
    case OpKind::kReduceSum:
      run_reduce_sum(ctx);
      return;
    case OpKind::kRmsNorm:
      NormKernel(ctx, NormForm::kRms, false).forward();
      return;
    case OpKind::kLayerNorm:
      NormKernel(ctx, NormForm::kLayer, false).forward();
      return;
    case OpKind::kNormGrad:
      NormKernel(ctx, op.outputs.size() == 3 ? NormForm::kLayerGrad : NormForm::kRmsGrad, false)
          .backward();
      return;
    case OpKind::kNormStatistics:
      ctx.expect_counts(2, 4, 1, 1);
      NormKernel(ctx, statistics_form(ctx), true).statistics();
      return;
    case OpKind::kRope:
      run_rope(ctx);
      return;
    case OpKind::kAttention:
      if (device.bf16_matmul_inputs || device.fast_kernels) {
        AttentionKernel<float>(ctx, false).forward();
      } else {
        AttentionKernel<double>(ctx, false).forward();
      }
      return;
    case OpKind::kAttentionGrad:
      if (device.bf16_matmul_inputs || device.fast_kernels) {
        AttentionKernel<float>(ctx, true).backward();
      } else {
        AttentionKernel<double>(ctx, true).backward();
      }
      return;
    case OpKind::kEmbeddingLookup:
      run_embedding(ctx, false);
      return;
    case OpKind::kEmbeddingGrad:
      run_embedding(ctx, true);
      return;
    case OpKind::kCrossEntropy:
      ctx.expect_counts(2, 3, 1, 1);
      CrossEntropyKernel(ctx).loss();
      return;
    case OpKind::kCrossEntropyStatistics:
      ctx.expect_counts(2, 2, 1, 1);
      CrossEntropyKernel(ctx).statistics();
      return;
    case OpKind::kCrossEntropyGrad:
      ctx.expect_counts(2, 3, 1, 1);
      CrossEntropyKernel(ctx).gradient();
      return;
    case OpKind::kMoeRouter:
      ctx.expect_counts(1, 1, 1, 1);
      run_router(ctx, false);
      return;
    case OpKind::kRouterGrad:
      run_router_grad(ctx);
      return;
    case OpKind::kMoeDispatch:
      run_moe_dispatch(ctx);
      return;
    case OpKind::kMoeCombine:
      run_moe_combine(ctx);
      return;
    case OpKind::kAdamUpdate:
      run_adam(ctx);
      return;
    case OpKind::kDynamicSlice:
      run_dynamic_slice(ctx);
      return;
    case OpKind::kHostOffload:
    case OpKind::kHostLoad:
      run_copy(ctx);
      return;
    default:
      throw std::logic_error(std::string("not a compute op: ") + op_kind_name(op.kind));
  }
}

}  // namespace tpusim
