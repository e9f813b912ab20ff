// tests/sim/functional/kernels/attention_test.cpp: the attention kernels
// (sim/functional/kernels/attention.cpp). Attention: against an explicit softmax, split query
// length, and gradients by finite differences, with and without compressed blocks (DeepSeek-V4).
// The method and the helpers: kernel_test_support.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

struct AttentionCase {
  const char* name;
  int64_t heads = 2;
  int64_t kv_heads = 2;
  AttentionMask mask = AttentionMask::kCausal;
  int64_t window = 0;
  bool mla = false;
  int64_t key_dim = 4;    // D_k (MLA: the nope part)
  int64_t rope_dim = 0;   // MLA: R
  int64_t value_dim = 4;  // D_v
  double soft_cap = 0;    // attn_logits_soft_cap: scaled logits s -> cap tanh(s / cap)
  bool sinks = false;     // a [heads] sink logit in every row's softmax (DeepSeek-V4)
  // > 0: compressed blocks of this many tokens join the keys and values (DeepSeek-V4's HCA).
  int64_t compress_ratio = 0;
};

std::vector<AttentionCase> attention_cases() {
  return {
      {"gqa_causal", 4, 2, AttentionMask::kCausal, 0, false, 4, 0, 4},
      {"sliding_window", 2, 1, AttentionMask::kSlidingWindow, 2, false, 4, 0, 3},
      {"chunked", 2, 2, AttentionMask::kChunked, 2, false, 4, 0, 4},
      {"no_mask", 2, 2, AttentionMask::kNone, 0, false, 3, 0, 4},
      {"mla_causal", 2, 2, AttentionMask::kCausal, 0, true, 3, 2, 3},
      // A cap of 0.5 against scaled logits up to ~2: tanh far from linear.
      {"gqa_soft_cap", 4, 2, AttentionMask::kCausal, 0, false, 4, 0, 4, 0.5},
      // DeepSeek-V4's window attention: one shared kv head, a sink logit per query head.
      {"sliding_window_sinks", 4, 1, AttentionMask::kSlidingWindow, 2, false, 4, 0, 4, 0, true},
      {"causal_sinks", 2, 2, AttentionMask::kCausal, 0, false, 4, 0, 4, 0, true},
      // DeepSeek-V4's heavily compressed attention: the window's keys, blocks of 2 tokens and the
      // sinks in one softmax (a window of 2 leaves earlier tokens to the blocks alone).
      {"window_sinks_blocks", 4, 1, AttentionMask::kSlidingWindow, 2, false, 4, 0, 4, 0, true, 2},
      {"window_blocks_of_3", 2, 1, AttentionMask::kSlidingWindow, 1, false, 4, 0, 4, 0, false, 3},
  };
}

// Tensors of an attention case; `query_length` may be a split dim.
struct AttentionGraph {
  Case c;
  TensorId q, k, v, k_rope = -1, sinks = -1, blocks = -1, out;
  std::vector<TensorId> inputs() const {
    std::vector<TensorId> ids = {q, k, v};
    if (k_rope >= 0) {
      ids.push_back(k_rope);
    }
    if (sinks >= 0) {
      ids.push_back(sinks);
    }
    if (blocks >= 0) {
      ids.push_back(blocks);
    }
    return ids;
  }
};

void add_attention_tensors(AttentionGraph& g, const AttentionCase& test, const Dim& query_length,
                           int64_t length, const std::string& prefix) {
  const int64_t qk = test.key_dim + test.rope_dim;
  const std::string kv_heads = test.mla ? "heads" : "kv_heads";
  const std::string qk_name = test.mla ? "qk_head_dim" : "head_dim";
  const std::string k_name = test.mla ? "qk_nope" : "head_dim";
  const std::string v_name = test.mla || test.value_dim != test.key_dim ? "v_head_dim" : "head_dim";
  Case& c = g.c;
  g.q = c.tensor(prefix + "q",
                 {dim("batch", 2), query_length, dim("heads", test.heads), dim(qk_name, qk)});
  g.k = c.tensor(prefix + "k", {dim("batch", 2), dim("length", length),
                                dim(kv_heads, test.kv_heads), dim(k_name, test.key_dim)});
  g.v = c.tensor(prefix + "v", {dim("batch", 2), dim("length", length),
                                dim(kv_heads, test.kv_heads), dim(v_name, test.value_dim)});
  if (test.mla) {
    g.k_rope = c.tensor(prefix + "k_rope",
                        {dim("batch", 2), dim("length", length), dim("qk_rope", test.rope_dim)});
  }
  if (test.sinks) {
    g.sinks = c.tensor(prefix + "sinks", {dim("heads", test.heads)});
  }
  if (test.compress_ratio > 0) {
    // The whole blocks (MaxText drops a last partial block): [batch, blocks, kv_heads, head_dim].
    g.blocks =
        c.tensor(prefix + "blocks", {dim("batch", 2), dim("length", length / test.compress_ratio),
                                     dim(kv_heads, test.kv_heads), dim(k_name, test.key_dim)});
  }
  g.out = c.tensor(prefix + "out", {dim("batch", 2), query_length, dim("heads", test.heads),
                                    dim(v_name, test.value_dim)});
}

// Scaled as a runtime-scaling family would (1/sqrt(D_qk)): a scale other than 1 exercises the
// scale in the forward and in every gradient.
double attention_scale(const AttentionCase& test) {
  return 1 / std::sqrt(static_cast<double>(test.key_dim + test.rope_dim));
}

OpAttrs attention_attrs(const AttentionCase& test) {
  OpAttrs attrs;
  attrs.mask = test.mask;
  attrs.window = test.window;
  attrs.attention_scale = attention_scale(test);
  attrs.logit_soft_cap = test.soft_cap;
  attrs.compress_ratio = test.compress_ratio;
  return attrs;
}

// Explicit softmax attention over whole tensors.
// With `selection` ([batch, length, blocks], CSA), a block joins row i only where it is 1.
std::vector<double> reference_attention(const AttentionCase& test,
                                        const std::vector<TensorData>& in, int64_t length,
                                        const TensorData* selection = nullptr) {
  const TensorData& q = in[0];
  const TensorData& k = in[1];
  const TensorData& v = in[2];
  const int64_t group = test.heads / test.kv_heads;
  const double scale = attention_scale(test);
  std::vector<double> out(static_cast<size_t>(2 * length * test.heads * test.value_dim), 0.0);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < test.heads; ++h) {
      const int64_t kv = h / group;
      for (int64_t i = 0; i < length; ++i) {
        // Columns: the length keys, then the blocks (keys and values at once).
        const int64_t blocks = test.compress_ratio > 0 ? length / test.compress_ratio : 0;
        std::vector<double> scores(static_cast<size_t>(length + blocks), -kInfinity);
        // The sink: one more logit in the softmax, with a zero value.
        const double sink = test.sinks ? double{in[test.mla ? 4 : 3].at({h})} : -kInfinity;
        double max = sink;
        for (int64_t j = 0; j < length; ++j) {
          const bool in_window =
              test.mask == AttentionMask::kCausal ||
              (test.mask == AttentionMask::kSlidingWindow && i - j < test.window) ||
              (test.mask == AttentionMask::kChunked && j / test.window == i / test.window);
          const bool allowed = test.mask == AttentionMask::kNone || (j <= i && in_window);
          if (!allowed) {
            continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < test.key_dim; ++d) {
            dot += double{q.at({b, i, h, d})} * k.at({b, j, kv, d});
          }
          for (int64_t r = 0; r < test.rope_dim; ++r) {
            dot += double{q.at({b, i, h, test.key_dim + r})} * in[3].at({b, j, r});
          }
          double logit = dot * scale;
          if (test.soft_cap > 0) {
            logit = test.soft_cap * std::tanh(logit / test.soft_cap);
          }
          scores[static_cast<size_t>(j)] = logit;
          max = std::max(max, logit);
        }
        // Block c holds tokens c r .. c r + r - 1: visible once the last of them is at or before i.
        for (int64_t c = 0; c < blocks; ++c) {
          if (c * test.compress_ratio + test.compress_ratio - 1 > i ||
              (selection != nullptr && selection->at({b, i, c}) == 0.0f)) {
            continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < test.key_dim; ++d) {
            dot += double{q.at({b, i, h, d})} * in.back().at({b, c, kv, d});
          }
          scores[static_cast<size_t>(length + c)] = dot * scale;
          max = std::max(max, dot * scale);
        }
        double sum = test.sinks ? std::exp(sink - max) : 0.0;
        for (double& score : scores) {
          score = std::exp(score - max);
          sum += score;
        }
        for (int64_t j = 0; j < length + blocks; ++j) {
          for (int64_t d = 0; d < test.value_dim; ++d) {
            const double value =
                j < length ? double{v.at({b, j, kv, d})} : in.back().at({b, j - length, kv, d});
            out[static_cast<size_t>(((b * length + i) * test.heads + h) * test.value_dim + d)] +=
                scores[static_cast<size_t>(j)] / sum * value;
          }
        }
      }
    }
  }
  return out;
}

TEST(KernelAttention, ForwardMatchesExplicitSoftmax) {
  std::mt19937 rng(11);
  const int64_t length = 6;
  for (const AttentionCase& test : attention_cases()) {
    SCOPED_TRACE(test.name);
    AttentionGraph g;
    add_attention_tensors(g, test, dim("length", length), length, "");
    const Op& op = g.c.op(OpKind::kAttention, g.inputs(), {g.out}, attention_attrs(test));
    const std::vector<TensorData> inputs = random_inputs(g.c, g.inputs(), rng);
    expect_close(run(g.c.graph, op, inputs)[0], reference_attention(test, inputs, length));
  }
}

// Queries split over "context" (3 of 6 per device, keys whole): each device's rows match the
// whole output, and its dk/dv partial sums add up to the whole gradient.
TEST(KernelAttention, SplitQueryLengthMatchesWhole) {
  std::mt19937 rng(12);
  const int64_t length = 6;
  for (const AttentionCase& test : attention_cases()) {
    SCOPED_TRACE(test.name);
    AttentionGraph whole;
    add_attention_tensors(whole, test, dim("length", length), length, "");
    AttentionGraph local;
    add_attention_tensors(local, test, split("length", 3, length, "context"), length, "");
    const Op& whole_op =
        whole.c.op(OpKind::kAttention, whole.inputs(), {whole.out}, attention_attrs(test));
    const Op& local_op =
        local.c.op(OpKind::kAttention, local.inputs(), {local.out}, attention_attrs(test));
    auto grad_op = [&](AttentionGraph& g) -> const Op& {
      std::vector<TensorId> in = {g.c.tensor("dout", g.c.info(g.out).dims)};
      std::vector<TensorId> out;
      for (const TensorId id : g.inputs()) {
        in.push_back(id);
        out.push_back(g.c.tensor(g.c.info(id).name + "/grad", g.c.info(id).dims));
      }
      in.push_back(g.out);
      return g.c.op(OpKind::kAttentionGrad, in, out, attention_attrs(test), true);
    };
    const Op& whole_grad = grad_op(whole);
    const Op& local_grad = grad_op(local);
    const std::vector<TensorData> inputs = random_inputs(whole.c, whole.inputs(), rng);
    const TensorData out = run(whole.c.graph, whole_op, inputs)[0];
    const TensorData dout = random_data(whole.c.info(whole.out), rng);
    std::vector<TensorData> grad_inputs = {dout};
    grad_inputs.insert(grad_inputs.end(), inputs.begin(), inputs.end());
    grad_inputs.push_back(out);
    const std::vector<TensorData> grads = run(whole.c.graph, whole_grad, grad_inputs);
    std::vector<TensorData> key_sums;
    for (size_t index = 1; index < grads.size(); ++index) {
      key_sums.push_back(TensorData::zeros(grads[index].shape));
    }
    for (int device = 0; device < 2; ++device) {
      const DeviceContext context = device_on("context", device, 2);
      std::vector<TensorData> local_inputs = inputs;
      local_inputs[0] = slice(inputs[0], 1, device * 3, 3);
      const TensorData local_out = run(local.c.graph, local_op, local_inputs, context)[0];
      expect_close(local_out, slice(out, 1, device * 3, 3));
      std::vector<TensorData> local_grad_inputs = {slice(dout, 1, device * 3, 3)};
      local_grad_inputs.insert(local_grad_inputs.end(), local_inputs.begin(), local_inputs.end());
      local_grad_inputs.push_back(local_out);
      const std::vector<TensorData> local_grads =
          run(local.c.graph, local_grad, local_grad_inputs, context);
      expect_close(local_grads[0], slice(grads[0], 1, device * 3, 3));
      for (size_t index = 1; index < local_grads.size(); ++index) {
        for (size_t e = 0; e < key_sums[index - 1].values.size(); ++e) {
          key_sums[index - 1].values[e] += local_grads[index].values[e];
        }
      }
    }
    for (size_t index = 1; index < grads.size(); ++index) {
      expect_close(key_sums[index - 1], grads[index]);
    }
  }
}

TEST(KernelAttention, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(13);
  const int64_t length = 5;
  for (const AttentionCase& test : attention_cases()) {
    AttentionGraph g;
    add_attention_tensors(g, test, dim("length", length), length, "");
    const Op& forward = g.c.op(OpKind::kAttention, g.inputs(), {g.out}, attention_attrs(test));
    const TensorId dout = g.c.tensor("dout", g.c.info(g.out).dims);
    std::vector<TensorId> grad_in = {dout};
    std::vector<TensorId> grad_out;
    for (const TensorId id : g.inputs()) {
      grad_in.push_back(id);
      grad_out.push_back(g.c.tensor(g.c.info(id).name + "/grad", g.c.info(id).dims));
    }
    grad_in.push_back(g.out);
    const Op& grad = g.c.op(OpKind::kAttentionGrad, grad_in, grad_out, attention_attrs(test), true);
    const std::vector<TensorData> inputs = random_inputs(g.c, g.inputs(), rng);
    const std::vector<TensorData> weights = random_weights(g.c.graph, forward, rng);
    std::vector<TensorData> grad_values = {weights[0]};
    grad_values.insert(grad_values.end(), inputs.begin(), inputs.end());
    grad_values.push_back(run(g.c.graph, forward, inputs)[0]);
    const std::vector<TensorData> analytic = run(g.c.graph, grad, grad_values);
    std::vector<std::string> names = {"dq", "dk", "dv"};
    if (test.mla) {
      names.emplace_back("dk_rope");
    }
    if (test.sinks) {
      names.emplace_back("dsinks");
    }
    if (test.compress_ratio > 0) {
      names.emplace_back("dblocks");
    }
    for (size_t index = 0; index < analytic.size(); ++index) {
      expect_fd(std::string("attention ") + (test.mla ? "mla " : "") + names[index], g.c.graph,
                forward, inputs, weights, index, analytic[index]);
    }
  }
}

// DeepSeek-V4's compressed sparse attention: blocks of 2 tokens (3 of 6), window 2, sinks, and the
// indexer's selection as the last input: a visible block joins a row only where it is 1.
struct SelectionGraph {
  AttentionGraph g;
  TensorId selection = -1;
  std::vector<TensorId> inputs() const {
    std::vector<TensorId> ids = g.inputs();
    ids.push_back(selection);
    return ids;
  }
};

const AttentionCase kSelectedBlocks = {"window_sinks_selected_blocks",
                                       4,
                                       1,
                                       AttentionMask::kSlidingWindow,
                                       2,
                                       false,
                                       4,
                                       0,
                                       4,
                                       0,
                                       true,
                                       2};

OpAttrs selection_attrs() {
  OpAttrs attrs = attention_attrs(kSelectedBlocks);
  attrs.block_topk = 1;  // > 0: the selection input; its count is the indexer's business
  return attrs;
}

void add_selection_tensors(SelectionGraph& s, int64_t length) {
  add_attention_tensors(s.g, kSelectedBlocks, dim("length", length), length, "");
  s.selection =
      s.g.c.tensor("selection", {dim("batch", 2), dim("length", length),
                                 dim("indexer_blocks", length / kSelectedBlocks.compress_ratio)});
}

TEST(KernelAttention, SelectedBlocksMatchExplicitSoftmax) {
  std::mt19937 rng(14);
  const int64_t length = 6;
  SelectionGraph s;
  add_selection_tensors(s, length);
  const Op& op = s.g.c.op(OpKind::kAttention, s.inputs(), {s.g.out}, selection_attrs());
  const std::vector<TensorData> inputs = random_inputs(s.g.c, s.g.inputs(), rng);
  // Each row keeps a random half of the blocks (visible or not: the kernel hides the others).
  const TensorData selection = random_ints(s.g.c.info(s.selection), rng, 2);
  std::vector<TensorData> with_selection = inputs;
  with_selection.push_back(selection);
  const TensorData out = run(s.g.c.graph, op, with_selection)[0];
  expect_close(out, reference_attention(kSelectedBlocks, inputs, length, &selection));
  // The check sees the selection: with every block kept the output differs.
  const std::vector<double> all_kept = reference_attention(kSelectedBlocks, inputs, length);
  double largest = 0;
  for (size_t e = 0; e < all_kept.size(); ++e) {
    largest = std::max(largest, std::abs(all_kept[e] - double{out.values[e]}));
  }
  EXPECT_GT(largest, 1e-2);
}

TEST(KernelAttention, SelectedBlocksGradientsMatchFiniteDifferences) {
  std::mt19937 rng(15);
  const int64_t length = 6;
  SelectionGraph s;
  add_selection_tensors(s, length);
  Case& c = s.g.c;
  const Op& forward = c.op(OpKind::kAttention, s.inputs(), {s.g.out}, selection_attrs());
  std::vector<TensorId> grad_in = {c.tensor("dout", c.info(s.g.out).dims)};
  std::vector<TensorId> grad_out;
  for (const TensorId id : s.g.inputs()) {  // no gradient for the selection
    grad_in.push_back(id);
    grad_out.push_back(c.tensor(c.info(id).name + "/grad", c.info(id).dims));
  }
  grad_in.push_back(s.selection);
  grad_in.push_back(s.g.out);
  const Op& grad = c.op(OpKind::kAttentionGrad, grad_in, grad_out, selection_attrs(), true);
  std::vector<TensorData> inputs = random_inputs(c, s.g.inputs(), rng);
  inputs.push_back(random_ints(c.info(s.selection), rng, 2));
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  std::vector<TensorData> grad_values = {weights[0]};
  grad_values.insert(grad_values.end(), inputs.begin(), inputs.end());
  grad_values.push_back(run(c.graph, forward, inputs)[0]);
  const std::vector<TensorData> analytic = run(c.graph, grad, grad_values);
  const std::vector<std::string> names = {"dq", "dk", "dv", "dsinks", "dblocks"};
  ASSERT_EQ(analytic.size(), names.size());
  for (size_t index = 0; index < analytic.size(); ++index) {
    expect_fd("selected-block attention " + names[index], c.graph, forward, inputs, weights, index,
              analytic[index]);
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
