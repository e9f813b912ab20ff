// sim/functional/kernels/sinkhorn.cpp: kSinkhorn, the Sinkhorn normalization of DeepSeek-V4's
// mHC residual matrix (MaxText layers/mhc.py `sinkhorn`), and its VJP kSinkhornGrad.
//
// Example: logits[batch, length, streams, streams_out] (n x n per token, n = 4) ->
//   res[batch, length, streams, streams_out] whose rows and columns each sum to about 1.
//
// kSinkhorn(t) -> y over t's LAST TWO dims (rows = dims[-2], columns = dims[-1], both whole); every
//   other dim indexes independent matrices. With eps = attrs.epsilon, N =
//   attrs.sinkhorn_iterations:
//     a = softmax over each row (the last dim) of t, plus eps;
//     b = a / (column sums of a + eps);
//     N times: b = b / max(row sums, 1e-12), then b = b / max(column sums, 1e-12);
//     y = b.
// kSinkhornGrad(dy, t) -> dt: the vector-Jacobian product of the above. It recomputes the forward
//   (keeping each pass's matrix and sums) and runs the passes backwards; a sum the clip replaced
//   passes no gradient (jnp.clip's derivative). Values in double; outputs rounded to float once.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {
namespace {

// MaxText mhc.py sinkhorn: the floor of a row or column sum in the iterations (jnp.clip min).
constexpr double kSumFloor = 1e-12;

// One matrix of `rows` x `columns` doubles, row-major.
using Values = std::vector<double>;

// Every intermediate of one matrix's forward pass, for the VJP.
struct SinkhornTrace {
  int64_t rows = 0;
  int64_t columns = 0;
  Values softmax;                   // p (before + eps)
  Values shifted;                   // a = p + eps
  Values first_column_sums;         // sum_i a_ij + eps, per column
  std::vector<Values> before_rows;  // b entering each iteration
  std::vector<Values> before_columns;
  std::vector<Values> row_sums;     // max(sum, floor) per row, per iteration
  std::vector<Values> column_sums;  // max(sum, floor) per column, per iteration
  Values result;
};

// The sums of a rows x columns matrix's rows (`along_rows`) or of its columns, in index order.
Values sums_of(const Values& m, int64_t rows, int64_t columns, bool along_rows) {
  Values sums(static_cast<size_t>(along_rows ? rows : columns), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      sums[static_cast<size_t>(along_rows ? i : j)] += m[static_cast<size_t>(i * columns + j)];
    }
  }
  return sums;
}

Values row_sums_of(const Values& m, int64_t rows, int64_t columns) {
  return sums_of(m, rows, columns, true);
}

Values column_sums_of(const Values& m, int64_t rows, int64_t columns) {
  return sums_of(m, rows, columns, false);
}

Values floored(Values sums) {
  for (double& sum : sums) {
    sum = std::max(sum, kSumFloor);
  }
  return sums;
}

SinkhornTrace sinkhorn_forward(const Values& logits, int64_t rows, int64_t columns, double epsilon,
                               int64_t iterations) {
  SinkhornTrace trace;
  trace.rows = rows;
  trace.columns = columns;
  trace.softmax = logits;
  for (int64_t i = 0; i < rows; ++i) {
    double* row = trace.softmax.data() + i * columns;
    const double largest = *std::max_element(row, row + columns);
    double total = 0;
    for (int64_t j = 0; j < columns; ++j) {
      row[j] = std::exp(row[j] - largest);
      total += row[j];
    }
    for (int64_t j = 0; j < columns; ++j) {
      row[j] /= total;
    }
  }
  trace.shifted = trace.softmax;
  for (double& value : trace.shifted) {
    value += epsilon;
  }
  trace.first_column_sums = column_sums_of(trace.shifted, rows, columns);
  for (double& sum : trace.first_column_sums) {
    sum += epsilon;
  }
  Values current = trace.shifted;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      current[static_cast<size_t>(i * columns + j)] /=
          trace.first_column_sums[static_cast<size_t>(j)];
    }
  }
  for (int64_t iteration = 0; iteration < iterations; ++iteration) {
    trace.before_rows.push_back(current);
    Values sums = floored(row_sums_of(current, rows, columns));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < columns; ++j) {
        current[static_cast<size_t>(i * columns + j)] /= sums[static_cast<size_t>(i)];
      }
    }
    trace.row_sums.push_back(std::move(sums));
    trace.before_columns.push_back(current);
    sums = floored(column_sums_of(current, rows, columns));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < columns; ++j) {
        current[static_cast<size_t>(i * columns + j)] /= sums[static_cast<size_t>(j)];
      }
    }
    trace.column_sums.push_back(std::move(sums));
  }
  trace.result = std::move(current);
  return trace;
}

// The VJP of y = x / s, s the sums of x along rows (by_row) or columns, floored at `floor`
// (0: no floor): dx = dy / s - [s > floor] (sum of dy x along the same line) / s^2.
Values normalize_vjp(const Values& dy, const Values& x, const Values& sums, bool by_row,
                     int64_t rows, int64_t columns, double floor) {
  const int64_t lines = by_row ? rows : columns;
  Values dot(static_cast<size_t>(lines), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      const size_t at = static_cast<size_t>(i * columns + j);
      dot[static_cast<size_t>(by_row ? i : j)] += dy[at] * x[at];
    }
  }
  Values dx(dy.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      const size_t at = static_cast<size_t>(i * columns + j);
      const size_t line = static_cast<size_t>(by_row ? i : j);
      const double sum = sums[line];
      const bool passes = floor <= 0 || sum > floor;
      dx[at] = dy[at] / sum - (passes ? dot[line] / (sum * sum) : 0.0);
    }
  }
  return dx;
}

Values sinkhorn_vjp(const SinkhornTrace& trace, Values grad) {
  const int64_t rows = trace.rows;
  const int64_t columns = trace.columns;
  for (size_t iteration = trace.row_sums.size(); iteration > 0; --iteration) {
    const size_t at = iteration - 1;
    grad = normalize_vjp(grad, trace.before_columns[at], trace.column_sums[at], false, rows,
                         columns, kSumFloor);
    grad = normalize_vjp(grad, trace.before_rows[at], trace.row_sums[at], true, rows, columns,
                         kSumFloor);
  }
  // b = a / (column sums + eps): eps keeps the divisor positive, so it has no floor.
  grad = normalize_vjp(grad, trace.shifted, trace.first_column_sums, false, rows, columns, 0.0);
  // a = p + eps, p the softmax of each row: dt = p (dp - sum_j dp p).
  for (int64_t i = 0; i < rows; ++i) {
    double dot = 0;
    for (int64_t j = 0; j < columns; ++j) {
      const size_t at = static_cast<size_t>(i * columns + j);
      dot += grad[at] * trace.softmax[at];
    }
    for (int64_t j = 0; j < columns; ++j) {
      const size_t at = static_cast<size_t>(i * columns + j);
      grad[at] = trace.softmax[at] * (grad[at] - dot);
    }
  }
  return grad;
}

// Walks the matrices of `tensor` (every dim but the last two): calls body(offsets, row stride,
// column stride) with offsets[t] the start of the matrix in tensor t of `others`, all shaped as
// `tensor`.
template <size_t N, typename Body>
void for_each_matrix(const Ctx& ctx, const Tensor& tensor, const std::array<const Tensor*, N>& all,
                     Body&& body) {
  if (tensor.dims.size() < 2) {
    ctx.fail("a Sinkhorn matrix needs two dims");
  }
  const Dim& row_dim = tensor.dims[tensor.dims.size() - 2];
  const Dim& column_dim = tensor.dims.back();
  if (row_dim.whole_size() != row_dim.size || column_dim.whole_size() != column_dim.size) {
    ctx.fail("the Sinkhorn matrix dims '" + row_dim.name + "', '" + column_dim.name +
             "' must be whole");
  }
  const Space outer = space_without(tensor, {row_dim.name, column_dim.name});
  Space whole = outer;
  whole.add(row_dim.name, row_dim.size);
  whole.add(column_dim.name, column_dim.size);
  std::array<std::vector<int64_t>, N> strides;
  std::array<std::array<int64_t, 2>, N> inner{};
  for (size_t t = 0; t < N; ++t) {
    ctx.strides_in(*all[t], whole, true, true);
    strides[t] = ctx.strides_in(*all[t], outer, true, false);
    inner[t] = {ctx.stride(*all[t], row_dim.name), ctx.stride(*all[t], column_dim.name)};
  }
  for_each_index(outer.sizes, strides, [&](const std::array<int64_t, N>& at) {
    body(at, inner, row_dim.size, column_dim.size);
  });
}

Values gather(const float* data, int64_t start, const std::array<int64_t, 2>& step, int64_t rows,
              int64_t columns) {
  Values m(static_cast<size_t>(rows * columns));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      m[static_cast<size_t>(i * columns + j)] = data[start + i * step[0] + j * step[1]];
    }
  }
  return m;
}

void scatter(const Values& m, float* data, int64_t start, const std::array<int64_t, 2>& step,
             int64_t rows, int64_t columns) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < columns; ++j) {
      data[start + i * step[0] + j * step[1]] =
          static_cast<float>(m[static_cast<size_t>(i * columns + j)]);
    }
  }
}

}  // namespace

void run_sinkhorn(const Ctx& ctx) {
  ctx.expect_counts(1, 1, 1, 1);
  const Tensor& logits = ctx.in_tensor(0);
  const OpAttrs& attrs = ctx.op().attrs;
  const float* in = ctx.in(0);
  float* out = ctx.out_unfilled(0);
  const std::array<const Tensor*, 2> all = {&logits, &ctx.out_tensor(0)};
  for_each_matrix(ctx, logits, all,
                  [&](const auto& at, const auto& step, int64_t rows, int64_t columns) {
                    const SinkhornTrace trace =
                        sinkhorn_forward(gather(in, at[0], step[0], rows, columns), rows, columns,
                                         attrs.epsilon, attrs.sinkhorn_iterations);
                    scatter(trace.result, out, at[1], step[1], rows, columns);
                  });
}

void run_sinkhorn_grad(const Ctx& ctx) {
  ctx.expect_counts(2, 2, 1, 1);
  const Tensor& logits = ctx.in_tensor(1);
  const OpAttrs& attrs = ctx.op().attrs;
  const float* dy = ctx.in(0);
  const float* in = ctx.in(1);
  float* out = ctx.out_unfilled(0);
  const std::array<const Tensor*, 3> all = {&ctx.in_tensor(0), &logits, &ctx.out_tensor(0)};
  for_each_matrix(
      ctx, logits, all, [&](const auto& at, const auto& step, int64_t rows, int64_t columns) {
        const SinkhornTrace trace =
            sinkhorn_forward(gather(in, at[1], step[1], rows, columns), rows, columns,
                             attrs.epsilon, attrs.sinkhorn_iterations);
        const Values grad = sinkhorn_vjp(trace, gather(dy, at[0], step[0], rows, columns));
        scatter(grad, out, at[2], step[2], rows, columns);
      });
}

}  // namespace tpusim::kernels
