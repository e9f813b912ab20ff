// sim/functional/kernels/cross_entropy.cpp: the mean token cross-entropy of the output head
// (kCrossEntropy), its per-token statistics when the vocab is split across devices
// (kCrossEntropyStatistics) and its gradient (kCrossEntropyGrad), through MaxText's logit
// scaling and soft cap.
//
// Example: vocab split over "tensor" on two devices
//   kCrossEntropyStatistics(logits[batch, length, vocab/2], targets) -> stats[batch, length, 3]
//   (the engine combines both devices' (max, sum exp, target logit)), then
//   kCrossEntropy(logits, targets, stats) -> this device's share of the loss
//
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
// With a sink whose logits_position is set (`tpusim generate`), kCrossEntropy also records every
//   transformed logit of that position (below) by global vocab index.
// Logit transform (MaxText's tied output head, decoders.py: normalize_embedding_logits divides
//   the logits by sqrt(emb_dim), then final_logits_soft_cap c maps them to c tanh(logits / c)):
//   every op above reads each logit x as z = c tanh(m x / c) (z = m x when c = attrs.
//   logit_soft_cap is 0; m = attrs.logit_multiplier), and the gradient is taken through it:
//   dlogits = (softmax(z) - onehot) / T x m (1 - tanh^2(m x / c)) (x m when c is 0).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {
namespace {

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
    // By the targets' local element: where its logits row starts (for the logits sink).
    std::vector<int64_t> rows(record && sink->logits_position >= 0 ? log_probs.size() : 0);
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
      if (!rows.empty()) {
        rows[static_cast<size_t>(target_at)] = logits_at;
      }
    });
    ctx_.out(0)[0] = static_cast<float>(total / static_cast<double>(token_count_));
    if (record) {
      record_log_probs(*sink, log_probs);
    }
    if (!rows.empty()) {
      record_logits(*sink, logits, rows);
    }
  }

  // Copies this device's (transformed) logits at sink.logits_position into sink.logits
  // [sequences, vocab], by global sequence and vocab index.
  void record_logits(TokenLogProbs& sink, const float* logits,
                     const std::vector<int64_t>& rows) const {
    const Tensor& targets = ctx_.in_tensor(1);
    const int64_t chunk_length = targets.dims.at(1).whole_size();
    if (vocab_offset_ + valid_ > sink.vocab) {
      ctx_.fail("the logits sink holds " + std::to_string(sink.vocab) +
                " vocab entries, fewer "
                "than the head's");
    }
    sink.logits.resize(static_cast<size_t>(sink.sequences * sink.vocab),
                       std::numeric_limits<float>::quiet_NaN());
    ctx_.device().for_each_global_element(targets, [&](int64_t local, int64_t global) {
      const int64_t sequence = global / chunk_length;
      const int64_t position = sink.chunk * chunk_length + global % chunk_length;
      if (global < 0 || sequence >= sink.sequences || position != sink.logits_position) {
        return;
      }
      const float* row = logits + rows[static_cast<size_t>(local)];
      for (int64_t j = 0; j < valid_; ++j) {
        sink.logits[static_cast<size_t>(sequence * sink.vocab + vocab_offset_ + j)] =
            static_cast<float>(transformed(row[j * vocab_stride_]));
      }
    });
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

}  // namespace

void run_cross_entropy(const Ctx& ctx) {
  ctx.expect_counts(2, 3, 1, 1);
  CrossEntropyKernel(ctx).loss();
}

void run_cross_entropy_statistics(const Ctx& ctx) {
  ctx.expect_counts(2, 2, 1, 1);
  CrossEntropyKernel(ctx).statistics();
}

void run_cross_entropy_grad(const Ctx& ctx) {
  ctx.expect_counts(2, 3, 1, 1);
  CrossEntropyKernel(ctx).gradient();
}

}  // namespace tpusim::kernels
