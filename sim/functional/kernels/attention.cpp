// sim/functional/kernels/attention.cpp: kAttention, fused masked softmax(q k^T) v with GQA, MLA,
// logit soft cap and causal / sliding-window / chunked masks, and kAttentionGrad, its exact VJP
// (P recomputed from q and k, as flash attention's backward does).
//
// Example: GQA with 8 query heads over 2 kv heads, causal
//   kAttention(q[batch, length, heads=8, head_dim], k[batch, length, kv_heads=2, head_dim],
//              v[...same as k]) -> out[batch, length, heads=8, head_dim]
//   (query heads 0-3 read kv head 0, heads 4-7 kv head 1)
//
// kAttention(q, k, v[, k_rope][, sinks]) -> out
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
//   to bf16 before their matmuls. sinks (a 1-D [heads] input, the same heads slice as q;
//   DeepSeek-V4 and gpt-oss's attention sinks): one more logit per query head in every row's
//   softmax, with a zero value: P_ij = exp(s_ij) / (exp(sink_h) + sum_j' exp(s_ij')).
// kAttentionGrad(dout, q, k, v, [k_rope], [sinks], out) -> dq, dk, dv, [dk_rope], [dsinks]: exact
//   VJP. P is
//   recomputed from q and k; D_i = sum(dout_i * out_i); dS = P * (dout v^T - D) (times
//   1 - tanh^2(scaled scores / cap) under a soft cap); dq = scale dS k
//   (and scale dS k_rope for q's rope part); dk = scale dS^T q; dv = P^T dout; dk_rope = scale
//   sum over heads of dS^T q_rope; dsinks_h = -sum over batch and queries of p_sink D_i, p_sink the
//   sink's probability. dk, dv, dk_rope and dsinks hold the contribution of THIS device's queries
//   (partial sums the engine reduces). With bf16_matmul_inputs, dout, q, k, v, k_rope, P and dS
//   are rounded to bf16 before their matmuls.
// Compressed blocks (attrs.compress_ratio r > 0, DeepSeek-V4's heavily compressed attention; the
//   last input, blocks [batch, length = blocks, kv_heads, head_dim], not with MLA): the blocks
//   join the keys AND the values of the same softmax as the masked keys and the sink (MaxText's
//   CompressedAttention concatenates them to the window's kv). Block c (global index, the offset
//   of blocks' length dim) is visible to query position p iff c < (p + 1) / r: its r tokens are
//   all at or before p. kAttentionGrad then also outputs dblocks (last): the key part
//   scale dS^T q plus the value part P^T dout of the block columns, partial like dk and dv.
//   Example: r = 2, window 2, query p = 4 sees keys 3, 4 and blocks 0, 1 (tokens 0-3), not
//   block 2 (tokens 4-5).
// Selected blocks (attrs.block_topk > 0, DeepSeek-V4's compressed sparse attention): one more
//   input after the blocks, the indexer's selection [batch, length, blocks] (kBlockTopK: 1 where
//   query p keeps block c, the blocks dim whole); a visible block joins query p's softmax only
//   where it is 1 (MaxText adds DEFAULT_MASK_VALUE to the others). It gets no gradient output.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"
#include "sim/functional/kernels/library_gemm.h"

namespace tpusim::kernels {
namespace {

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
  if constexpr (std::is_same_v<Scalar, float>) {
    if (view.feature_stride == 1) {
      // Rows of contiguous features (the usual [batch, length, heads, features] layout): copied
      // as a strided matrix, rounded in one vectorizable pass.
      using Stride = Eigen::OuterStride<Eigen::Dynamic>;
      matrix = Eigen::Map<const Matrix<float>, 0, Stride>(start, view.length, view.features,
                                                          Stride(view.length_stride));
      if (round && ctx.device().bf16_matmul_inputs) {
        matrix = matrix.unaryExpr([](float value) { return round_bf16(value); });
      }
      return matrix;
    }
  }
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
  using Column = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

  AttentionKernel(const Ctx& ctx, bool gradient) : ctx_(ctx) {
    const size_t first = gradient ? 1 : 0;
    if (gradient) {
      ctx.expect_counts(5, 9, 3, 6);
    } else {
      ctx.expect_counts(3, 7, 1, 1);
    }
    // The forward's inputs q, k, v[, k_rope][, sinks][, blocks]: sinks is the 1-D [heads] one,
    // blocks the last when attrs.compress_ratio > 0.
    const size_t forward_inputs = ctx.num_inputs() - (gradient ? 2 : 0);
    blocks_ = ctx.op().attrs.compress_ratio > 0;
    selection_ = blocks_ && ctx.op().attrs.block_topk > 0;
    const size_t before_blocks = forward_inputs - (blocks_ ? 1 : 0) - (selection_ ? 1 : 0);
    const Tensor& last = ctx.in_tensor(first + before_blocks - 1);
    sinks_ = before_blocks > 3 && last.dims.size() == 1 && last.dims[0].name == "heads";
    sinks_index_ = first + before_blocks - 1;
    mla_ = before_blocks - (sinks_ ? 1 : 0) == 4;
    const size_t gradient_outputs =
        3u + (mla_ ? 1u : 0u) + (sinks_ ? 1u : 0u) + (blocks_ ? 1u : 0u);
    if (gradient && ctx.num_outputs() != gradient_outputs) {
      ctx.fail("attention gradient outputs are dq, dk, dv[, dk_rope][, dsinks][, dblocks]");
    }
    dsinks_index_ = gradient_outputs - 1 - (blocks_ ? 1u : 0u);
    q_ = attention_view(ctx, ctx.in_tensor(first), false, true);
    k_ = attention_view(ctx, ctx.in_tensor(first + 1), true, true);
    v_ = attention_view(ctx, ctx.in_tensor(first + 2), true, true);
    if (mla_) {
      kr_ = attention_view(ctx, ctx.in_tensor(first + 3), true, false);
    }
    if (q_.heads_dim->name != "heads") {
      ctx.fail("the query's heads dim must be named 'heads'");
    }
    if (sinks_ && last.dims[0].size != q_.heads) {
      ctx.fail("the sinks must hold one logit per query head of this device");
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
    bl_.length = 0;  // without blocks nothing is stacked below the keys
    if (blocks_) {
      check_blocks(first + before_blocks, gradient);
    }
    if (selection_) {
      check_selection(first + before_blocks + 1);
    }
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
      if (sinks_ && ctx.out_tensor(dsinks_index_).dims.size() != 1) {
        ctx.fail("dsinks must be 1-D [heads]");
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
      const RowMatrix k_matrix = with_blocks(gather<Scalar>(ctx_, k, k_, b, kv, true), b, kv);
      const RowMatrix v_matrix = with_blocks(gather<Scalar>(ctx_, v, v_, b, kv, true), b, kv);
      const RowMatrix probabilities = softmax(q_matrix, k_matrix, k_rope, b, h);
      const RowMatrix result = product(round_matrix(ctx_, probabilities), false, v_matrix, false);
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
    float* dblocks = blocks_ ? ctx_.out(ctx_.num_outputs() - 1) : nullptr;
    // dsinks per (batch, query head), each written by the one item that owns the pair and summed
    // over the batch in order afterwards.
    std::vector<Scalar> dsink_parts(sinks_ ? static_cast<size_t>(q_.batch * q_.heads) : 0, 0);
    // One item per (batch, kv head) (per batch index with MLA, whose dk_rope sums over every
    // head): each sums its query heads in ascending order and writes its own blocks.
    const int64_t groups = mla_ ? 1 : k_.heads;
    parallel_for(ctx_.device().threads, q_.batch * groups, [&](int64_t item) {
      const int64_t b = item / groups;
      const int64_t group = item % groups;
      const RowMatrix k_rope = mla_ ? gather<Scalar>(ctx_, kr, kr_, b, 0, true) : RowMatrix();
      RowMatrix dk_rope = RowMatrix::Zero(k_.length, mla_ ? kr_.features : 0);
      // dk, dv of each kv head: summed over the query heads that share it, then written once.
      // With blocks, the rows past k_.length are the blocks' (as key and as value).
      std::vector<RowMatrix> dk_sum(static_cast<size_t>(k_.heads));
      std::vector<RowMatrix> dv_sum(static_cast<size_t>(k_.heads));
      for (int64_t kv = 0; kv < k_.heads; ++kv) {
        if (mla_ || kv == group) {
          dk_sum[static_cast<size_t>(kv)] = RowMatrix::Zero(k_.length + bl_.length, k_.features);
          dv_sum[static_cast<size_t>(kv)] = RowMatrix::Zero(v_.length + bl_.length, v_.features);
        }
      }
      for (int64_t h = 0; h < q_.heads; ++h) {
        const int64_t kv = kv_of_[static_cast<size_t>(h)];
        if (kv < 0 || (!mla_ && kv != group)) {
          continue;
        }
        const RowMatrix q_matrix = gather<Scalar>(ctx_, q, q_, b, h, true);
        const RowMatrix k_matrix = with_blocks(gather<Scalar>(ctx_, k, k_, b, kv, true), b, kv);
        const RowMatrix v_matrix = with_blocks(gather<Scalar>(ctx_, v, v_, b, kv, true), b, kv);
        const RowMatrix dout_matrix = gather<Scalar>(ctx_, dout, dout_, b, h, true);
        const RowMatrix out_matrix = gather<Scalar>(ctx_, out, o_, b, h, false);
        RowMatrix cap_slope;
        Column sink_probability;
        const RowMatrix probabilities =
            softmax(q_matrix, k_matrix, k_rope, b, h, &cap_slope, &sink_probability);
        const RowMatrix dv_matrix =
            product(round_matrix(ctx_, probabilities), true, dout_matrix, false);
        const RowMatrix dp = product(dout_matrix, false, v_matrix, true);
        // D_i = sum_j dout_ij out_ij (= sum_j P_ij dP_ij for the exact output).
        const Column delta = dout_matrix.cwiseProduct(out_matrix).rowwise().sum();
        if (sinks_) {
          dsink_parts[static_cast<size_t>(b * q_.heads + h)] = -sink_probability.dot(delta);
        }
        RowMatrix ds = probabilities.cwiseProduct(dp.colwise() - delta) * scale_;
        if (soft_cap_ > 0) {
          ds = ds.cwiseProduct(cap_slope);
        }
        ds = round_matrix(ctx_, ds);
        RowMatrix dq_matrix(q_.length, q_.features);
        const RowMatrix dk_matrix = mla_ ? RowMatrix(ds.transpose() * q_matrix.leftCols(d_k_))
                                         : product(ds, true, q_matrix, false);
        if (mla_) {
          dq_matrix.leftCols(d_k_) = ds * k_matrix;
        } else {
          dq_matrix = product(ds, false, k_matrix, false);
        }
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
          const RowMatrix& dk_rows = dk_sum[static_cast<size_t>(kv)];
          const RowMatrix& dv_rows = dv_sum[static_cast<size_t>(kv)];
          scatter(dk, dk_, b, kv, RowMatrix(dk_rows.topRows(k_.length)), false);
          scatter(dv, dv_, b, kv, RowMatrix(dv_rows.topRows(v_.length)), false);
          if (blocks_) {
            // A block is a key and a value: both parts of its gradient.
            scatter(dblocks, dbl_, b, kv,
                    RowMatrix(dk_rows.bottomRows(bl_.length) + dv_rows.bottomRows(bl_.length)),
                    false);
          }
        }
      }
      if (mla_) {
        scatter(dkr, dkr_, b, 0, dk_rope, false);
      }
    });
    if (sinks_) {
      float* dsinks = ctx_.out(dsinks_index_);
      for (int64_t h = 0; h < q_.heads; ++h) {
        Scalar sum = 0;
        for (int64_t b = 0; b < q_.batch; ++b) {
          sum += dsink_parts[static_cast<size_t>(b * q_.heads + h)];
        }
        dsinks[h] = static_cast<float>(sum);
      }
    }
  }

 private:
  void check_same(const AttentionView& view, int64_t batch, int64_t length, int64_t heads,
                  int64_t features, const char* what) const {
    if (view.batch != batch || view.length != length || view.heads != heads ||
        view.features != features) {
      ctx_.fail(std::string("attention ") + what + " has the wrong shape");
    }
  }

  // The compressed blocks (the last forward input, at `index`): [batch, blocks, kv heads,
  // head_dim] like the key, read as key and value (so the key's and the value's features agree).
  void check_blocks(size_t index, bool gradient) {
    const Ctx& ctx = ctx_;
    if (mla_) {
      ctx.fail("compressed blocks (attrs.compress_ratio) are not built with MLA's k_rope");
    }
    bl_ = attention_view(ctx, ctx.in_tensor(index), true, true);
    if (bl_.batch != q_.batch || bl_.heads_dim->name != k_.heads_dim->name ||
        bl_.heads != k_.heads || bl_.features != k_.features || v_.features != k_.features) {
      ctx.fail("compressed blocks must match the key's batch, heads and features (= the value's)");
    }
    block_position_ = ctx.device().offset(*bl_.length_dim);
    blocks_input_ = index;
    if (gradient) {
      dbl_ = attention_view(ctx, ctx.out_tensor(ctx.num_outputs() - 1), true, true);
      check_same(dbl_, bl_.batch, bl_.length, bl_.heads, bl_.features, "dblocks");
    }
  }

  // The indexer's selection (at input `index`): [batch, length, blocks], the query's batch and
  // length, every block of the blocks input.
  void check_selection(size_t index) {
    const Tensor& selection = ctx_.in_tensor(index);
    if (selection.dims.size() != 3 || ctx_.dim(selection, "batch").size != q_.batch ||
        ctx_.dim(selection, "length").size != q_.length ||
        selection.num_elements() != q_.batch * q_.length * bl_.length) {
      ctx_.fail("the block selection must be [batch, length, blocks] of the query and blocks");
    }
    selection_input_ = index;
    selection_batch_stride_ = ctx_.stride(selection, "batch");
    selection_length_stride_ = ctx_.stride(selection, "length");
    for (const Dim& dim : selection.dims) {
      if (dim.name != "batch" && dim.name != "length") {
        selection_block_stride_ = ctx_.stride(selection, dim.name);
      }
    }
  }

  // Hides the blocks row `i` (of batch `b`) does not select: -inf scores, weight 0.
  void hide_unselected(RowMatrix& scores, int64_t b, int64_t i) const {
    const float* row =
        ctx_.in(selection_input_) + b * selection_batch_stride_ + i * selection_length_stride_;
    for (int64_t c = 0; c < bl_.length; ++c) {
      if (row[c * selection_block_stride_] == 0.0f) {
        scores(i, k_.length + c) = -std::numeric_limits<Scalar>::infinity();
      }
    }
  }

  // `rows` (a key or value matrix of kv head `kv`) with the compressed blocks below it.
  RowMatrix with_blocks(RowMatrix rows, int64_t b, int64_t kv) const {
    if (!blocks_) {
      return rows;
    }
    const RowMatrix blocks = gather<Scalar>(ctx_, ctx_.in(blocks_input_), bl_, b, kv, true);
    RowMatrix stacked(rows.rows() + blocks.rows(), rows.cols());
    stacked.topRows(rows.rows()) = rows;
    stacked.bottomRows(blocks.rows()) = blocks;
    return stacked;
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

  // The score columns query position `query` may attend to, as two ordered ranges [first, last):
  // the keys its mask allows, then (with blocks, stacked after the k_.length keys) the blocks
  // completed at or before it, c < (query + 1) / r; empty ranges sit where they would start.
  std::array<std::pair<int64_t, int64_t>, 2> allowed_columns(int64_t query) const {
    const auto [first_key, last_key] = allowed_keys(query);
    const int64_t first = std::clamp<int64_t>(first_key - k_position_, 0, k_.length);
    const int64_t last = std::clamp<int64_t>(last_key - k_position_, first, k_.length);
    int64_t visible = 0;
    if (blocks_) {
      const int64_t completed = (query + 1) / ctx_.op().attrs.compress_ratio;
      visible = std::clamp<int64_t>(completed - block_position_, 0, bl_.length);
    }
    return {{{first, last}, {k_.length, k_.length + visible}}};
  }

  // a (or a^T) times b (or b^T): on oneDNN's kernels in the fast fp32 path (bf16 operands with
  // bf16_matmul_inputs, already rounded, so converting them is exact), else Eigen's.
  RowMatrix product(const RowMatrix& a, bool a_transposed, const RowMatrix& b,
                    bool b_transposed) const {
    const int64_t m = a_transposed ? a.cols() : a.rows();
    const int64_t k = a_transposed ? a.rows() : a.cols();
    const int64_t n = b_transposed ? b.rows() : b.cols();
    if constexpr (std::is_same_v<Scalar, float>) {
      // Without native bf16 kernels the fp32 ones take the (already rounded) operands.
      const GemmPrecision precision = fast_gemm_precision(ctx_.device().bf16_matmul_inputs);
      RowMatrix c(m, n);
      // A row-major r x c matrix read as itself (stride c, 1) or as its transpose (1, c).
      const auto view = [](const void* data, const RowMatrix& x, bool transposed) {
        return transposed ? GemmOperand{data, 1, x.cols()} : GemmOperand{data, x.cols(), 1};
      };
      const GemmResult result{c.data(), n, 1};
      if (ctx_.device().fast_kernels && library_gemm_available(precision)) {
        const void* a_data = a.data();
        const void* b_data = b.data();
        if (precision == GemmPrecision::kBfloat16Inputs) {
          thread_local std::vector<uint16_t> a16;
          thread_local std::vector<uint16_t> b16;
          a16.resize(static_cast<size_t>(a.size()));
          b16.resize(static_cast<size_t>(b.size()));
          to_bf16(a.data(), a16.data(), a.size());
          to_bf16(b.data(), b16.data(), b.size());
          a_data = a16.data();
          b_data = b16.data();
        }
        if (library_gemm(precision, m, n, k, view(a_data, a, a_transposed),
                         view(b_data, b, b_transposed), result)) {
          return c;
        }
      }
    }
    if (a_transposed) {
      return b_transposed ? RowMatrix(a.transpose() * b.transpose()) : RowMatrix(a.transpose() * b);
    }
    return b_transposed ? RowMatrix(a * b.transpose()) : RowMatrix(a * b);
  }

  // Masked softmax(scale q k^T) in Scalar, soft-capped first when soft_cap_ > 0; masked entries
  // are 0. `cap_slope` (when given) receives d capped / d uncapped = 1 - tanh^2(s / cap). With
  // sinks, query head h's sink logit joins every row's softmax and `sink_probability` (when
  // given) receives its probability per row.
  RowMatrix softmax(const RowMatrix& q, const RowMatrix& k, const RowMatrix& k_rope, int64_t b,
                    int64_t h, RowMatrix* cap_slope = nullptr,
                    Column* sink_probability = nullptr) const {
    RowMatrix scores =
        mla_ ? RowMatrix(q.leftCols(d_k_) * k.transpose()) : product(q, false, k, true);
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
    const bool sink = sinks_;
    const Scalar sink_logit = sink ? static_cast<Scalar>(ctx_.in(sinks_index_)[h]) : Scalar(0);
    if (sink_probability != nullptr) {
      *sink_probability = Column::Zero(scores.rows());
    }
    for (int64_t i = 0; i < scores.rows(); ++i) {
      // Every mask allows one contiguous range of keys; the visible blocks are a second one.
      const std::array<std::pair<int64_t, int64_t>, 2> ranges = allowed_columns(q_position_ + i);
      if (selection_) {
        hide_unselected(scores, b, i);
      }
      Scalar max = sink ? sink_logit : -std::numeric_limits<Scalar>::infinity();
      for (const auto& [first, last] : ranges) {
        for (int64_t j = first; j < last; ++j) {
          max = std::max(max, scores(i, j));
        }
      }
      Scalar sum = 0;
      int64_t next = 0;  // the first column not yet set
      for (const auto& [first, last] : ranges) {
        for (int64_t j = next; j < first; ++j) {
          scores(i, j) = 0;
        }
        if constexpr (std::is_same_v<Scalar, float>) {
          // fp32 (fast path and the MXU's numerics): Eigen's vectorized exp, a sum in its order.
          auto allowed = scores.row(i).segment(first, last - first);
          allowed = (allowed.array() - max).exp().matrix();
          sum += allowed.sum();
        } else {
          for (int64_t j = first; j < last; ++j) {
            scores(i, j) = std::exp(scores(i, j) - max);
            sum += scores(i, j);
          }
        }
        next = last;
      }
      for (int64_t j = next; j < scores.cols(); ++j) {
        scores(i, j) = 0;
      }
      const Scalar sink_weight = sink ? std::exp(sink_logit - max) : Scalar(0);
      sum += sink_weight;
      if (sum > 0) {
        scores.row(i) /= sum;
        if (sink_probability != nullptr) {
          (*sink_probability)(i) = sink_weight / sum;
        }
      }
    }
    return scores;
  }

  const Ctx& ctx_;
  bool mla_ = false;
  bool sinks_ = false;
  size_t sinks_index_ = 0;
  size_t dsinks_index_ = 0;
  bool blocks_ = false;
  size_t blocks_input_ = 0;
  bool selection_ = false;
  size_t selection_input_ = 0;
  int64_t selection_batch_stride_ = 0;
  int64_t selection_length_stride_ = 0;
  int64_t selection_block_stride_ = 0;
  int64_t block_position_ = 0;
  AttentionView q_, k_, v_, kr_, o_, dout_, dq_, dk_, dv_, dkr_, bl_, dbl_;
  int64_t d_k_ = 0;
  Scalar scale_ = 1;
  Scalar soft_cap_ = 0;
  std::vector<int64_t> kv_of_;
  int64_t q_position_ = 0;
  int64_t k_position_ = 0;
};

}  // namespace

void run_attention(const Ctx& ctx) {
  if (ctx.device().bf16_matmul_inputs || ctx.device().fast_kernels) {
    AttentionKernel<float>(ctx, false).forward();
  } else {
    AttentionKernel<double>(ctx, false).forward();
  }
}

void run_attention_grad(const Ctx& ctx) {
  if (ctx.device().bf16_matmul_inputs || ctx.device().fast_kernels) {
    AttentionKernel<float>(ctx, true).backward();
  } else {
    AttentionKernel<double>(ctx, true).backward();
  }
}

}  // namespace tpusim::kernels
