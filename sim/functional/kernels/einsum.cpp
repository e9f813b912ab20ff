// sim/functional/kernels/einsum.cpp: kEinsum, the contraction of two tensors by dim name (every
// matmul of the model and of its gradients), its grouped form over the rows of a dropless MoE
// buffer, and the GEMMs of functional_precision=fast (fp32, or bf16 inputs with
// functional_dtype=bfloat16_matmul).
//
// Example: an MLP up-projection and the gradient of its weight
//   kEinsum(x[batch, length, embed], w[embed, mlp]) -> h[batch, length, mlp], contracted {embed}
//   kEinsum(dh[batch, length, mlp], x) -> dw[embed, mlp], contracted {batch, length}
//
// kEinsum(A, B) -> C
//   C[out dims] = sum over the dims named in attrs.contracted of A * B. Every other dim passes
//   through by name: a dim of A, B and C is a batch dim; of A and C only, a row dim (M); of B and
//   C only, a column dim (N). A contracted dim present in both operands is a K dim; one present in
//   only one operand is summed out of that operand first. Any other dim (in C but in neither
//   operand, in an operand but neither in C nor contracted) is a shape error. Split contracted
//   dims give partial sums (the engine reduces them). Computed as per-batch Eigen GEMMs of the
//   operands packed to [batch, M, K] x [batch, K, N], accumulated in double (in fp32 with
//   bf16_matmul_inputs).
//
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
//
// The fast einsum (functional_precision=fast): GEMMs with fp32 accumulation on operands used in
// place where their layout allows, the work cut into items by the shapes alone (never by the
// thread count), so the result is bitwise the same on any number of kernel threads. The GEMMs run
// on oneDNN's JIT kernels where this machine has them (kernels/library_gemm.h), else on Eigen's;
// with bf16_matmul_inputs they take bf16 operands (rounded to nearest even) where this CPU has
// native bf16 kernels, and otherwise the operands rounded to bf16 and kept in fp32 on the fp32
// kernels (the same exact products, summed in fp32).
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"
#include "sim/functional/kernels/library_gemm.h"

namespace tpusim::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// The grouped einsum (3 inputs, the third row_experts).
// ------------------------------------------------------------------------------------------------
using Rows = std::vector<int64_t>;

// Which tensor of a grouped matmul is the expert tensor, and which rows each of this device's
// experts owns.
struct GroupedLayout {
  Space rows;            // the row dims: row_experts' [experts, expert_tokens]
  int expert_side = -1;  // 0: A, 1: B, 2: C
  int64_t experts = 0;   // this device's experts (the expert tensor's local experts dim)
  int64_t expert_stride = 0;
  std::vector<Rows> members;  // per local expert: its rows, as indices row-major over `rows`
};

GroupedLayout grouped_layout(const Ctx& ctx) {
  GroupedLayout layout;
  const Tensor& rows_tensor = ctx.in_tensor(2);
  if (rows_tensor.dims.size() != 2 || !has_dim(rows_tensor, "experts") ||
      !has_dim(rows_tensor, "expert_tokens")) {
    ctx.fail("row_experts '" + rows_tensor.name + "' must be [experts, expert_tokens]");
  }
  layout.rows = space_without(rows_tensor, {});
  const Space& rows = layout.rows;
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
  layout.expert_side = expert_side;
  const Tensor& expert_tensor = *tensors[static_cast<size_t>(expert_side)];
  const Dim& experts = ctx.dim(expert_tensor, "experts");
  layout.experts = experts.size;
  const int64_t expert_offset = ctx.device().offset(experts);
  layout.expert_stride = ctx.stride(expert_tensor, "experts");
  std::vector<Rows>& members = layout.members;
  members.resize(static_cast<size_t>(experts.size));
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
  return layout;
}

void check_dim_count(const Ctx& ctx, const Tensor& tensor, size_t expected) {
  if (tensor.dims.size() != expected) {
    ctx.fail("tensor '" + tensor.name + "' has dims the grouped matmul does not expect");
  }
}

// (b) C is the expert tensor: C[e] = sum over e's rows of A[r] (x) B[r].
template <typename Scalar>
void grouped_into_experts(const Ctx& ctx, const GroupedLayout& layout, float* out) {
  const Space& rows = layout.rows;
  const int64_t expert_stride = layout.expert_stride;
  const Tensor& a = ctx.in_tensor(0);
  const Tensor& b = ctx.in_tensor(1);
  const Tensor& c = ctx.out_tensor(0);
  const std::vector<std::string> row_names = {"experts", "expert_tokens"};
  const Space p = space_without(a, row_names);
  const Space q = space_without(b, row_names);
  check_dim_count(ctx, c, 1 + p.names.size() + q.names.size());
  const Rows a_rows = offsets_of(ctx, a, rows);
  const Rows b_rows = offsets_of(ctx, b, rows);
  const Rows a_features = offsets_of(ctx, a, p);
  const Rows b_features = offsets_of(ctx, b, q);
  const Rows c_p = offsets_of(ctx, c, p);
  const Rows c_q = offsets_of(ctx, c, q);
  const float* a_values = ctx.in(0);
  const float* b_values = ctx.in(1);
  for (int64_t e = 0; e < layout.experts; ++e) {
    const Rows& members_e = layout.members[static_cast<size_t>(e)];
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
}

// (a) C and one operand X are row tensors: C[r] = X[r] W[e] over the contracted dims.
template <typename Scalar>
void grouped_rows_times_experts(const Ctx& ctx, const GroupedLayout& layout, float* out) {
  const Space& rows = layout.rows;
  const int64_t expert_stride = layout.expert_stride;
  const auto expert_side = static_cast<size_t>(layout.expert_side);
  const size_t x_side = expert_side == 0 ? 1 : 0;
  const Tensor& x = ctx.in_tensor(x_side);
  const Tensor& w = ctx.in_tensor(expert_side);
  const Tensor& c = ctx.out_tensor(0);
  Space k;
  for (const std::string& name : ctx.op().attrs.contracted) {
    k.add(name, ctx.dim(w, name).size);
  }
  std::vector<std::string> not_n = ctx.op().attrs.contracted;
  not_n.emplace_back("experts");
  const Space n = space_without(w, not_n);
  check_dim_count(ctx, x, 2 + k.names.size());
  check_dim_count(ctx, c, 2 + n.names.size());
  const Rows x_rows = offsets_of(ctx, x, rows);
  const Rows c_rows = offsets_of(ctx, c, rows);
  const Rows x_k = offsets_of(ctx, x, k);
  const Rows w_k = offsets_of(ctx, w, k);
  const Rows w_n = offsets_of(ctx, w, n);
  const Rows c_n = offsets_of(ctx, c, n);
  const float* x_values = ctx.in(x_side);
  const float* w_values = ctx.in(expert_side);
  for (int64_t e = 0; e < layout.experts; ++e) {
    const Rows& members_e = layout.members[static_cast<size_t>(e)];
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

template <typename Scalar>
void run_grouped_einsum(const Ctx& ctx) {
  const GroupedLayout layout = grouped_layout(ctx);
  float* out = ctx.out(0);
  if (layout.expert_side == 2) {
    grouped_into_experts<Scalar>(ctx, layout, out);
  } else {
    grouped_rows_times_experts<Scalar>(ctx, layout, out);
  }
}

// ------------------------------------------------------------------------------------------------
// The fast GEMMs.
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

// The strides of an operand's matrix of `rows` x `cols` (transposed: stored cols x rows).
GemmOperand strided(const void* data, bool transposed, int64_t rows, int64_t cols) {
  return transposed ? GemmOperand{data, 1, rows} : GemmOperand{data, cols, 1};
}

// The items of a batch of products C[i] = A[i] B[i] (A m x k, B k x n, C m x n): each batch
// index's product cut into blocks of rows (or of columns when they are fewer) of at least
// kMinBlock, at most kMaxBlocks per product. The cut depends on the shapes alone.
struct GemmItems {
  GemmItems(int64_t m, int64_t n) : by_rows(m >= n), extent(by_rows ? m : n) {
    constexpr int64_t kMinBlock = 128;
    constexpr int64_t kMaxBlocks = 8;
    block = std::max(kMinBlock, (extent + kMaxBlocks - 1) / kMaxBlocks);
    block = (block + 15) / 16 * 16;
    blocks = std::max<int64_t>(1, (extent + block - 1) / block);
  }
  int64_t batch_of(int64_t item) const { return item / blocks; }
  int64_t start_of(int64_t item) const { return (item % blocks) * block; }
  int64_t size_of(int64_t item) const { return std::min(block, extent - start_of(item)); }

  bool by_rows;
  int64_t extent;
  int64_t block = 0;
  int64_t blocks = 0;
};

// Rounds to bf16 the rows [first, first + count) of the logical R x C operand at `data` (or its
// columns, `by_columns`) into `out`, stored in the operand's own orientation, and returns that
// block's strides. Rounding the blocked operand item by item, right before its GEMM, keeps the
// rounded copy in cache instead of writing a whole second copy of it to memory first.
GemmOperand round_block(const float* data, bool transposed, int64_t rows, int64_t cols,
                        bool by_columns, int64_t first, int64_t count, std::vector<float>& out) {
  out.resize(static_cast<size_t>(count * (by_columns ? rows : cols)));
  // Stored row-major: R rows of C (plain) or C rows of R (transposed). The block is contiguous
  // when it runs along the storage's rows, else one segment of every storage row.
  const int64_t stored_rows = transposed ? cols : rows;
  const int64_t stored_cols = transposed ? rows : cols;
  const bool contiguous = by_columns == transposed;
  if (contiguous) {
    const float* begin = data + first * stored_cols;
    std::transform(begin, begin + count * stored_cols, out.begin(), round_bf16);
  } else {
    for (int64_t row = 0; row < stored_rows; ++row) {
      const float* begin = data + row * stored_cols + first;
      std::transform(begin, begin + count, out.begin() + row * count, round_bf16);
    }
  }
  return by_columns ? strided(out.data(), transposed, rows, count)
                    : strided(out.data(), transposed, count, cols);
}

// The items on oneDNN's kernels, if it has them for this precision and these layouts (both
// block sizes); false (nothing written) otherwise. `round_inputs` (fp32 kernels only): the
// operands are first rounded to bf16, the blocked one item by item (round_block).
bool library_gemms(const Ctx& ctx, GemmPrecision precision, const EinsumOperand& a,
                   const EinsumOperand& b, const EinsumOperand& c, int64_t nb, int64_t m, int64_t n,
                   int64_t k, bool round_inputs = false) {
  const GemmItems items(m, n);
  float* c_data = const_cast<float*>(c.data);
  const auto supported = [&](int64_t size) {
    // A rounded block has its own leading dimension: check the layout the kernel will see.
    const bool packed = round_inputs;
    const GemmOperand lhs = strided(a.data, a.transposed, items.by_rows && packed ? size : m, k);
    const GemmOperand rhs = strided(b.data, b.transposed, k, !items.by_rows && packed ? size : n);
    const GemmOperand out = strided(c.data, c.transposed, m, n);
    const GemmResult result{c_data, out.row_stride, out.col_stride};
    return items.by_rows ? library_gemm_supports(precision, size, n, k, lhs, rhs, result)
                         : library_gemm_supports(precision, m, size, k, lhs, rhs, result);
  };
  if (!library_gemm_available(precision) || !supported(std::min(items.block, items.extent)) ||
      !supported(items.extent - (items.blocks - 1) * items.block)) {
    return false;
  }
  // bf16 inputs: every operand rounded once (the layout kept), then multiplied in blocks.
  std::vector<uint16_t> a16;
  std::vector<uint16_t> b16;
  std::vector<float> shared_rounded;  // round_inputs: the operand every item reads whole
  const void* a_base = a.data;
  const void* b_base = b.data;
  size_t element = sizeof(float);
  if (precision == GemmPrecision::kBfloat16Inputs) {
    a16.resize(static_cast<size_t>(nb * m * k));
    b16.resize(static_cast<size_t>(nb * k * n));
    to_bf16(a.data, a16.data(), nb * m * k);
    to_bf16(b.data, b16.data(), nb * k * n);
    a_base = a16.data();
    b_base = b16.data();
    element = sizeof(uint16_t);
  } else if (round_inputs) {
    const EinsumOperand& shared = items.by_rows ? b : a;
    shared_rounded.resize(static_cast<size_t>(nb * k * (items.by_rows ? n : m)));
    std::transform(shared.data, shared.data + shared_rounded.size(), shared_rounded.begin(),
                   round_bf16);
    (items.by_rows ? b_base : a_base) = shared_rounded.data();
  }
  const auto at = [element](const void* base, int64_t offset) {
    return static_cast<const unsigned char*>(base) + offset * static_cast<int64_t>(element);
  };
  parallel_for(ctx.device().threads, nb * items.blocks, [&](int64_t index) {
    const int64_t batch = items.batch_of(index);
    const int64_t start = items.start_of(index);
    const int64_t size = items.size_of(index);
    if (size <= 0) {
      return;
    }
    GemmOperand lhs = strided(at(a_base, batch * m * k), a.transposed, m, k);
    GemmOperand rhs = strided(at(b_base, batch * k * n), b.transposed, k, n);
    const GemmOperand out = strided(c_data + batch * m * n, c.transposed, m, n);
    GemmResult result{static_cast<float*>(const_cast<void*>(out.data)), out.row_stride,
                      out.col_stride};
    thread_local std::vector<float> block;
    bool done = false;
    if (items.by_rows) {
      lhs = round_inputs
                ? round_block(a.data + batch * m * k, a.transposed, m, k, false, start, size, block)
                : GemmOperand{at(lhs.data, start * lhs.row_stride), lhs.row_stride, lhs.col_stride};
      result.data += start * result.row_stride;
      done = library_gemm(precision, size, n, k, lhs, rhs, result);
    } else {
      rhs = round_inputs
                ? round_block(b.data + batch * k * n, b.transposed, k, n, true, start, size, block)
                : GemmOperand{at(rhs.data, start * rhs.col_stride), rhs.row_stride, rhs.col_stride};
      result.data += start * result.col_stride;
      done = library_gemm(precision, m, size, k, lhs, rhs, result);
    }
    if (!done) {
      throw std::logic_error("einsum: oneDNN refused a block library_gemm_supports accepted");
    }
  });
  return true;
}

// The items on Eigen's fp32 GEMMs; bf16 inputs rounded first (then the products are exact in
// fp32, as in the reference path).
void eigen_gemms(const Ctx& ctx, bool bf16_inputs, const EinsumOperand& a, const EinsumOperand& b,
                 const EinsumOperand& c, int64_t nb, int64_t m, int64_t n, int64_t k) {
  const GemmItems items(m, n);
  float* c_data = const_cast<float*>(c.data);
  std::vector<float> a_rounded;
  std::vector<float> b_rounded;
  const float* a_values = a.data;
  const float* b_values = b.data;
  if (bf16_inputs) {
    a_rounded.assign(a.data, a.data + nb * m * k);
    b_rounded.assign(b.data, b.data + nb * k * n);
    for (float& value : a_rounded) {
      value = round_bf16(value);
    }
    for (float& value : b_rounded) {
      value = round_bf16(value);
    }
    a_values = a_rounded.data();
    b_values = b_rounded.data();
  }
  parallel_for(ctx.device().threads, nb * items.blocks, [&](int64_t index) {
    const int64_t start = items.start_of(index);
    const int64_t size = items.size_of(index);
    if (size <= 0) {
      return;
    }
    const int64_t batch = items.batch_of(index);
    const float* a_data = a_values + batch * m * k;
    const float* b_data = b_values + batch * k * n;
    float* out = c_data + batch * m * n;
    const auto multiply = [&](const auto& lhs, const auto& rhs) {
      const auto assign = [&](auto& product) {
        if (items.by_rows) {
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
  });
}

// C[i] = A[i] B[i] for every batch index i; A is m x k, B k x n, C m x n. On oneDNN's kernels
// where this machine has them for these layouts (kernels/library_gemm.h), else on Eigen's.
void fast_gemms(const Ctx& ctx, const EinsumOperand& a, const EinsumOperand& b,
                const EinsumOperand& c, int64_t nb, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) {
    return;
  }
  const bool bf16 = ctx.device().bf16_matmul_inputs;
  const GemmPrecision precision = fast_gemm_precision(bf16);
  if (bf16 && precision == GemmPrecision::kFloat32) {
    // No native bf16 kernels here: the operands rounded to bf16, then the fp32 kernels (each
    // product of two bf16 values is exact in fp32, so only the summation order can differ from
    // a bf16 kernel's).
    if (!library_gemms(ctx, precision, a, b, c, nb, m, n, k, /*round_inputs=*/true)) {
      eigen_gemms(ctx, true, a, b, c, nb, m, n, k);
    }
    return;
  }
  if (!library_gemms(ctx, precision, a, b, c, nb, m, n, k)) {
    eigen_gemms(ctx, bf16, a, b, c, nb, m, n, k);
  }
}

// ------------------------------------------------------------------------------------------------
// The dense einsum (2 inputs).
// ------------------------------------------------------------------------------------------------
// The dims of a dense einsum by role: C = [batch, rows (M), cols (N)] in some order, A's and B's
// shared contracted dims `inner` (K), and the contracted dims of only one operand.
struct EinsumDims {
  Space batch;
  Space rows;
  Space cols;
  Space inner;
  Space a_only;
  Space b_only;
};

// Classifies the dims of A, B and C by name, failing on sizes that differ or dims of no role.
EinsumDims einsum_dims(const Ctx& ctx) {
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
  EinsumDims dims;
  for (const Dim& dim : c.dims) {
    if (is_contracted(dim.name)) {
      ctx.fail("contracted dim '" + dim.name + "' appears in the output");
    }
    const bool in_a = has_dim(a, dim.name);
    const bool in_b = has_dim(b, dim.name);
    if (in_a && in_b) {
      dims.batch.add(dim.name, dim.size);
    } else if (in_a) {
      dims.rows.add(dim.name, dim.size);
    } else if (in_b) {
      dims.cols.add(dim.name, dim.size);
    } else {
      ctx.fail("output dim '" + dim.name + "' is in neither operand");
    }
  }
  for (const std::string& name : contracted) {
    const bool in_a = has_dim(a, name);
    const bool in_b = has_dim(b, name);
    if (in_a && in_b) {
      dims.inner.add(name, ctx.dim(a, name).size);
    } else if (in_a) {
      dims.a_only.add(name, ctx.dim(a, name).size);
    } else if (in_b) {
      dims.b_only.add(name, ctx.dim(b, name).size);
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
  return dims;
}

// Packs an operand as [batch..., first..., second...] row-major (A: [batch, M, K]; B:
// [batch, K, N]), summing its operand-only contracted dims onto the same packed element.
std::vector<float> pack(const Ctx& ctx, const Space& batch, const Tensor& tensor,
                        const float* values, const Space& first, const Space& second,
                        const Space& summed) {
  Space loop;
  for (const Space* part : std::initializer_list<const Space*>{&batch, &first, &second, &summed}) {
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
}

// functional_precision=fast: an operand laid out as [batch, X, Y] or [batch, Y, X] is used
// in place (a row- or column-major matrix per batch index), others are packed; fp32 GEMMs.
void run_fast_einsum(const Ctx& ctx, const EinsumDims& dims) {
  const Tensor& a = ctx.in_tensor(0);
  const Tensor& b = ctx.in_tensor(1);
  const Tensor& c = ctx.out_tensor(0);
  const Space& batch = dims.batch;
  const Space& rows = dims.rows;
  const Space& cols = dims.cols;
  const Space& inner = dims.inner;
  const int64_t nb = batch.count();
  const int64_t m = rows.count();
  const int64_t n = cols.count();
  const int64_t k = inner.count();
  const auto operand = [&](const Tensor& tensor, const float* values, const Space& first,
                           const Space& second, const Space& summed, std::vector<float>& storage) {
    if (summed.names.empty() && laid_out_as(tensor, {&batch, &first, &second})) {
      return EinsumOperand{values, false};
    }
    if (summed.names.empty() && laid_out_as(tensor, {&batch, &second, &first})) {
      return EinsumOperand{values, true};
    }
    storage = pack(ctx, batch, tensor, values, first, second, summed);
    return EinsumOperand{storage.data(), false};
  };
  std::vector<float> a_storage;
  std::vector<float> b_storage;
  const EinsumOperand lhs = operand(a, ctx.in(0), rows, inner, dims.a_only, a_storage);
  const EinsumOperand rhs = operand(b, ctx.in(1), inner, cols, dims.b_only, b_storage);
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
}

// The reference: packed operands, per-batch GEMMs in double (in fp32 on bf16-rounded inputs with
// bf16_matmul_inputs), the packed product scattered into C's layout.
void run_reference_einsum(const Ctx& ctx, const EinsumDims& dims) {
  const Tensor& a = ctx.in_tensor(0);
  const Tensor& b = ctx.in_tensor(1);
  const Tensor& c = ctx.out_tensor(0);
  const int64_t nb = dims.batch.count();
  const int64_t m = dims.rows.count();
  const int64_t n = dims.cols.count();
  const int64_t k = dims.inner.count();
  const std::vector<float> packed_a =
      pack(ctx, dims.batch, a, ctx.in(0), dims.rows, dims.inner, dims.a_only);
  const std::vector<float> packed_b =
      pack(ctx, dims.batch, b, ctx.in(1), dims.inner, dims.cols, dims.b_only);
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
  for (const Space* part : {&dims.batch, &dims.rows, &dims.cols}) {
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

}  // namespace

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
  const EinsumDims dims = einsum_dims(ctx);
  if (ctx.device().fast_kernels) {
    run_fast_einsum(ctx, dims);
    return;
  }
  run_reference_einsum(ctx, dims);
}

}  // namespace tpusim::kernels
