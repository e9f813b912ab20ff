// sim/functional/kernels/moe.cpp: the token routing of a mixture-of-experts layer: the top-k
// router (kMoeRouter), the dispatch of token-choices into per-expert slots (kMoeDispatch, with
// capacity or dropless), the weighted combine back (kMoeCombine), and the VJPs (the same ops in
// the backward phase, and kRouterGrad). The experts' matmuls are einsums (einsum.cpp).
//
// Example: 4 tokens, 2 experts, top_k 1, capacity 2
//   kMoeRouter(router_logits[tokens, experts]) -> routing[tokens, top_k, 2] = (expert, weight)
//   kMoeDispatch(x[tokens, embed], routing) -> grouped[experts, expert_tokens=2, embed]
//   kMoeCombine(expert_out[experts, expert_tokens, embed], routing) -> y[tokens, embed]
//
// MoE. routing[token dims, top_k, route=2] (dims "top_k" and "route" by name; the token dims are
// its other dims): routing[t, c, 0] = expert index (as float), routing[t, c, 1] = weight.
// kMoeRouter(router_logits[token dims, experts]) -> routing: softmax over "experts" (whole), the
//   attrs.top_k largest probabilities in descending order (ties: lower index first); their
//   weights are those probabilities, divided by their sum when attrs.normalize_top_k (MaxText's
//   norm_topk_prob), times attrs.route_scale (routed_scaling_factor). attrs.hash_routing
//   (DeepSeek-V4's first layers, MaxText RoutedMoE with is_hash_routing): the choices are
//   MaxText's tid2eid row of the token, all zeros from initialization, so every choice is expert
//   0, weighted by a softmax over the chosen scores: route_scale / top_k each, and kRouterGrad
//   gives the logits no gradient (exactly 0). attrs.sqrt_softplus_scores (MaxText's
//   routed_score_func "sqrtsoftplus", DeepSeek-V4): all of the above reads the scores
//   sqrt(softplus(logit)) instead of the logits (the softmax, the top-k, the weights), and
//   kRouterGrad's result is multiplied by d score / d logit.
// kMoeRouter(router_logits, bias[experts]): MaxText's routed_bias (DeepSeek's auxiliary-loss-free
//   balancing, moe.py GateLogit and deepseek_routing): the top-k are those of score + bias
//   (descending, ties: lower index first), and their weights are still those of the scores
//   alone (the probabilities above, without the bias). Not with hash_routing.
// kRouterGrad, by inputs:
//   (d_routing, router_logits[, bias][, counts]) -> d_router_logits[, d_bias]: VJP through the
//   softmax of
//     the picked
//     probabilities (the selection is piecewise constant; the index channel's gradient is
//     ignored): with dw_c = d_routing[t, c, 1] and the chosen probabilities q_c, dq_c = s dw_c,
//     or (s / Z)(dw_c - sum_j dw_j q_j / Z) when normalized (Z = sum q); dp_e = dq of e's choice
//     (0 for the others); dlogits = p * (dp - sum(p dp)). The bias only picks the choices, which
//     are piecewise constant in it: d_bias = 0 (this device's tokens' part of a sum).
//   With a third output, load[experts] (a biased router under MaxText's routed_bias_update_rate,
//     model/autodiff/training_step.cpp): the choices of each expert over the op's tokens (this
//     device's part of the step's loads, which the optimizer's bias update reads).
//   With attrs.load_balance_scale c > 0 (MaxText's load-balance loss, moe.py load_balance_loss;
//     model/ir/op.h): kMoeRouter has two more outputs [token dims, experts], c x softmax(score +
//     bias) and the token's one-hot choices; kRouterGrad one more input, counts[sequence dims,
//     experts] (the one-hot choices summed over each whole sequence), and adds d p = c x counts
//     of the token's sequence through that softmax to the scores' and the bias's gradients (the
//     loss's value and gradient: c sum over (b, e) of counts x sum over tokens of p).
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
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"
#include "sim/functional/kernels/softmax.h"

namespace tpusim::kernels {
namespace {

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

// Softmax probabilities of one token's router scores, its top-k experts, and what turns a chosen
// probability into its weight: route_scale, over the chosen probabilities' sum when normalized.
// score_slopes: d score / d logit per expert (empty when the scores are the logits).
// balance_probabilities (attrs.load_balance_scale > 0): the load-balance loss's softmax, of
// score + bias (MaxText's jax.nn.softmax(gate_logits), the gate's output with its bias).
struct RouterRow {
  std::vector<double> probabilities;
  std::vector<int64_t> chosen;
  double chosen_sum = 0;
  double weight_scale = 1;
  std::vector<double> score_slopes;
  std::vector<double> balance_probabilities;
};

// The router's score of a logit l under attrs.sqrt_softplus_scores: sqrt(softplus(l)), softplus
// written so that e^l cannot overflow; `slope` gets its derivative sigmoid(l) / (2 score).
double sqrt_softplus_score(double logit, double& slope) {
  const double softplus =
      logit > 0 ? logit + std::log1p(std::exp(-logit)) : std::log1p(std::exp(logit));
  const double score = std::sqrt(softplus);
  const double sigmoid = 1.0 / (1.0 + std::exp(-logit));
  slope = score > 0 ? sigmoid / (2.0 * score) : 0.0;
  return score;
}

// softmax(values + shift) with shift = nullptr read as 0.
std::vector<double> softmax_of(const std::vector<double>& values, const float* shift) {
  std::vector<double> result(values.size());
  for (size_t e = 0; e < values.size(); ++e) {
    result[e] = values[e] + (shift == nullptr ? 0.0 : static_cast<double>(shift[e]));
  }
  softmax_in_place(result);
  return result;
}

// `bias` (routed_bias; nullptr without): [experts] added to the scores for the choice only.
RouterRow route_token(const float* logits, const float* bias, int64_t experts, int64_t stride,
                      int64_t top_k, const OpAttrs& attrs) {
  RouterRow row;
  std::vector<double> scores(static_cast<size_t>(experts));
  if (attrs.sqrt_softplus_scores) {
    row.score_slopes.resize(static_cast<size_t>(experts));
  }
  for (int64_t e = 0; e < experts; ++e) {
    const auto at = static_cast<size_t>(e);
    scores[at] = attrs.sqrt_softplus_scores
                     ? sqrt_softplus_score(logits[e * stride], row.score_slopes[at])
                     : static_cast<double>(logits[e * stride]);
  }
  row.probabilities = softmax_of(scores, nullptr);
  if (attrs.load_balance_scale > 0) {
    row.balance_probabilities = bias == nullptr ? row.probabilities : softmax_of(scores, bias);
  }
  std::vector<int64_t> order(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    order[static_cast<size_t>(e)] = e;
  }
  if (bias == nullptr) {
    std::stable_sort(order.begin(), order.end(), [&](int64_t lhs, int64_t rhs) {
      return row.probabilities[static_cast<size_t>(lhs)] >
             row.probabilities[static_cast<size_t>(rhs)];
    });
  } else {
    // deepseek_routing: the top-k of the biased scores; the weights below read the unbiased.
    std::stable_sort(order.begin(), order.end(), [&](int64_t lhs, int64_t rhs) {
      return scores[static_cast<size_t>(lhs)] + static_cast<double>(bias[lhs]) >
             scores[static_cast<size_t>(rhs)] + static_cast<double>(bias[rhs]);
    });
  }
  order.resize(static_cast<size_t>(top_k));
  // Hash routing (model/ir/op.h hash_routing): MaxText's tid2eid table, all zeros from its
  // initialization, picks expert 0 for every choice.
  row.chosen = attrs.hash_routing ? std::vector<int64_t>(static_cast<size_t>(top_k), 0) : order;
  for (const int64_t e : row.chosen) {
    row.chosen_sum += row.probabilities[static_cast<size_t>(e)];
  }
  row.weight_scale = attrs.route_scale / (attrs.normalize_top_k ? row.chosen_sum : 1.0);
  if (attrs.hash_routing) {
    // A softmax over top_k copies of one score: 1 / top_k each, whatever the logits.
    row.weight_scale = attrs.route_scale /
                       (static_cast<double>(top_k) * row.probabilities[static_cast<size_t>(0)]);
  }
  return row;
}

// What the router's forward and gradient both read: the logits, the bias and the routing layout.
struct RouterInputs {
  const Tensor* logits = nullptr;
  const float* logit_values = nullptr;
  const float* bias = nullptr;
  size_t bias_input = 0;
  RoutingLayout layout;
  int64_t experts = 0;
  Space all;  // the token dims, then experts
  std::vector<int64_t> logits_at;
  int64_t stride = 0;
};

RouterInputs router_inputs(const Ctx& ctx, bool gradient) {
  // Forward: (logits[, bias]) -> routing; gradient: (d_routing, logits[, bias]) -> d_logits.
  RouterInputs in;
  in.logits = &ctx.in_tensor(gradient ? 1 : 0);
  in.logit_values = ctx.in(gradient ? 1 : 0);
  in.bias_input = gradient ? 2 : 1;
  // With the load-balance loss the gradient's last input is the per-sequence choice counts.
  const size_t counts_inputs = gradient && ctx.op().attrs.load_balance_scale > 0 ? 1 : 0;
  if (ctx.num_inputs() > in.bias_input + counts_inputs) {
    const Tensor& bias_tensor = ctx.in_tensor(in.bias_input);
    if (bias_tensor.dims.size() != 1 || bias_tensor.dims[0].name != "experts" ||
        bias_tensor.dims[0].size != bias_tensor.dims[0].whole_size()) {
      ctx.fail("the router's bias must be a whole [experts]");
    }
    if (ctx.op().attrs.hash_routing) {
      ctx.fail("a hash-routed router takes no bias");
    }
    in.bias = ctx.in(in.bias_input);
  }
  if (ctx.op().attrs.hash_routing && ctx.op().attrs.load_balance_scale > 0) {
    ctx.fail("a hash-routed router has no load-balance loss");
  }
  in.layout = routing_layout(ctx, gradient ? ctx.in_tensor(0) : ctx.out_tensor(0));
  const Dim& experts = ctx.dim(*in.logits, "experts");
  if (experts.whole_size() != experts.size) {
    ctx.fail("the router's experts dim must be whole");
  }
  in.experts = experts.size;
  if (in.bias != nullptr && ctx.in_tensor(in.bias_input).dims[0].size != experts.size) {
    ctx.fail("the router's bias must have the logits' experts");
  }
  if (in.layout.top_k > experts.size ||
      (ctx.op().attrs.top_k > 0 && ctx.op().attrs.top_k != in.layout.top_k)) {
    ctx.fail("routing top_k does not match attrs.top_k or the experts");
  }
  in.all = in.layout.tokens;
  in.all.add("experts", experts.size);
  ctx.strides_in(*in.logits, in.all, true, true);
  in.logits_at = offsets_of(ctx, *in.logits, in.layout.tokens);
  in.stride = ctx.stride(*in.logits, "experts");
  return in;
}

// (logits[, bias]) -> routing[, c x softmax(score + bias), one-hot choices] (model/ir/op.h
// load_balance_scale c: the last two [token dims, experts], for the load-balance loss).
void run_router_forward(const Ctx& ctx) {
  const RouterInputs in = router_inputs(ctx, false);
  const bool balance = ctx.num_outputs() == 3;
  if (balance != (ctx.op().attrs.load_balance_scale > 0)) {
    ctx.fail("the router's load-balance outputs need load_balance_scale > 0, and it them");
  }
  std::vector<int64_t> balance_at;
  std::vector<int64_t> choices_at;
  float* probabilities = nullptr;  // (ctx.out zero-fills: each output is taken once)
  float* choices = nullptr;
  int64_t balance_stride = 0;
  int64_t choices_stride = 0;
  if (balance) {
    ctx.strides_in(ctx.out_tensor(1), in.all, true, true);
    ctx.strides_in(ctx.out_tensor(2), in.all, true, true);
    balance_at = offsets_of(ctx, ctx.out_tensor(1), in.layout.tokens);
    choices_at = offsets_of(ctx, ctx.out_tensor(2), in.layout.tokens);
    balance_stride = ctx.stride(ctx.out_tensor(1), "experts");
    choices_stride = ctx.stride(ctx.out_tensor(2), "experts");
    probabilities = ctx.out(1);
    choices = ctx.out(2);
  }
  float* out = ctx.out(0);
  for (size_t token = 0; token < in.logits_at.size(); ++token) {
    const RouterRow row = route_token(in.logit_values + in.logits_at[token], in.bias, in.experts,
                                      in.stride, in.layout.top_k, ctx.op().attrs);
    for (int64_t c = 0; c < in.layout.top_k; ++c) {
      const int64_t base = in.layout.token_offsets[token] + c * in.layout.choice_stride;
      const int64_t expert = row.chosen[static_cast<size_t>(c)];
      out[base] = static_cast<float>(expert);
      out[base + in.layout.route_stride] =
          static_cast<float>(row.probabilities[static_cast<size_t>(expert)] * row.weight_scale);
    }
    if (!balance) {
      continue;
    }
    for (int64_t e = 0; e < in.experts; ++e) {
      probabilities[balance_at[token] + e * balance_stride] = static_cast<float>(
          ctx.op().attrs.load_balance_scale * row.balance_probabilities[static_cast<size_t>(e)]);
    }
    for (const int64_t e : row.chosen) {
      choices[choices_at[token] + e * choices_stride] += 1.0f;
    }
  }
}

// d scores of one token through its chosen weights: w_c = weight_scale q_c, where a normalized
// weight_scale = s / Z also depends on every q_j; then through the softmax to the scores.
std::vector<double> weight_score_gradient(const RouterRow& row, const RoutingLayout& layout,
                                          int64_t routing_at, const float* d_routing,
                                          bool normalize) {
  const size_t experts = row.probabilities.size();
  double weighted = 0;  // sum_j dw_j q_j
  for (int64_t c = 0; c < layout.top_k; ++c) {
    const int64_t base = routing_at + c * layout.choice_stride;
    weighted += d_routing[base + layout.route_stride] *
                row.probabilities[static_cast<size_t>(row.chosen[static_cast<size_t>(c)])];
  }
  const double normalized = normalize ? weighted / row.chosen_sum : 0.0;
  std::vector<double> dp(experts, 0.0);
  for (int64_t c = 0; c < layout.top_k; ++c) {
    const int64_t base = routing_at + c * layout.choice_stride;
    dp[static_cast<size_t>(row.chosen[static_cast<size_t>(c)])] +=
        row.weight_scale * (d_routing[base + layout.route_stride] - normalized);
  }
  double inner = 0;
  for (size_t e = 0; e < experts; ++e) {
    inner += row.probabilities[e] * dp[e];
  }
  std::vector<double> d_scores(experts);
  for (size_t e = 0; e < experts; ++e) {
    d_scores[e] = row.probabilities[e] * (dp[e] - inner);
  }
  return d_scores;
}

// The load-balance loss's gradient at one token (model/ir/op.h load_balance_scale c): d p[e] =
// c count[e] (its sequence's choices of e), through the softmax of z = score + bias to
// d z[e] = p[e] (d p[e] - sum_j p[j] d p[j]), which both the score and the bias get.
std::vector<double> balance_gradient(const RouterRow& row, const float* counts, int64_t stride,
                                     double scale) {
  const std::vector<double>& p = row.balance_probabilities;
  double inner = 0;
  for (size_t e = 0; e < p.size(); ++e) {
    inner += p[e] * scale * counts[static_cast<int64_t>(e) * stride];
  }
  std::vector<double> d_z(p.size());
  for (size_t e = 0; e < p.size(); ++e) {
    d_z[e] = p[e] * (scale * counts[static_cast<int64_t>(e) * stride] - inner);
  }
  return d_z;
}

// (d_routing, logits[, bias][, counts[sequence dims, experts]]) -> d_logits[, d_bias[, load]];
// counts (with load_balance_scale > 0): the choices of each expert over each whole sequence.
void run_router_gradient(const Ctx& ctx) {
  const RouterInputs in = router_inputs(ctx, true);
  const OpAttrs& attrs = ctx.op().attrs;
  const Tensor& d_logits_tensor = ctx.out_tensor(0);
  ctx.strides_in(d_logits_tensor, in.all, true, true);
  const std::vector<int64_t> d_at = offsets_of(ctx, d_logits_tensor, in.layout.tokens);
  const int64_t d_stride = ctx.stride(d_logits_tensor, "experts");
  const float* d_routing = ctx.in(0);
  float* d_logits = ctx.out(0);
  std::vector<double> d_bias(static_cast<size_t>(in.experts), 0.0);
  std::vector<double> loads(static_cast<size_t>(in.experts), 0.0);
  for (size_t output = 1; output < ctx.num_outputs(); ++output) {
    if (in.bias == nullptr || !same_dims(ctx.out_tensor(output), ctx.in_tensor(in.bias_input))) {
      ctx.fail("d_bias and the loads need the bias input and its dims");
    }
  }
  std::vector<int64_t> counts_at;
  int64_t counts_stride = 0;
  const float* counts = nullptr;
  if (attrs.load_balance_scale > 0) {
    const size_t counts_input = ctx.num_inputs() - 1;
    const Tensor& counts_tensor = ctx.in_tensor(counts_input);
    ctx.strides_in(counts_tensor, in.all, false, true);  // its dims: some token dims, experts
    // The sequence's row for each token (stride 0 over the dims it lacks: length).
    const std::array<std::vector<int64_t>, 1> strides = {
        ctx.strides_in(counts_tensor, in.layout.tokens, false, false)};
    for_each_index(in.layout.tokens.sizes, strides,
                   [&](const std::array<int64_t, 1>& at) { counts_at.push_back(at[0]); });
    counts_stride = ctx.stride(counts_tensor, "experts");
    counts = ctx.in(counts_input);
  }
  for (size_t token = 0; token < in.logits_at.size(); ++token) {
    if (attrs.hash_routing) {
      // Hash-routed weights are constant (1 / top_k): no gradient reaches the logits. (Computed
      // through the softmax it is 0 only up to rounding, which sharding would change.)
      for (int64_t e = 0; e < in.experts; ++e) {
        d_logits[d_at[token] + e * d_stride] = 0.0f;
      }
      continue;
    }
    const RouterRow row = route_token(in.logit_values + in.logits_at[token], in.bias, in.experts,
                                      in.stride, in.layout.top_k, attrs);
    for (const int64_t e : row.chosen) {
      loads[static_cast<size_t>(e)] += 1.0;
    }
    std::vector<double> d_scores = weight_score_gradient(
        row, in.layout, in.layout.token_offsets[token], d_routing, attrs.normalize_top_k);
    if (counts != nullptr) {
      const std::vector<double> d_z =
          balance_gradient(row, counts + counts_at[token], counts_stride, attrs.load_balance_scale);
      for (size_t e = 0; e < d_z.size(); ++e) {
        d_scores[e] += d_z[e];
        d_bias[e] += d_z[e];
      }
    }
    for (int64_t e = 0; e < in.experts; ++e) {
      const auto at = static_cast<size_t>(e);
      d_logits[d_at[token] + e * d_stride] = static_cast<float>(
          row.score_slopes.empty() ? d_scores[at] : d_scores[at] * row.score_slopes[at]);
    }
  }
  // The bias only picks the choices (piecewise constant) but is in the load-balance softmax:
  // this device's tokens' part of the sum over tokens.
  if (ctx.num_outputs() >= 2) {
    float* d_bias_out = ctx.out(1);
    for (int64_t e = 0; e < in.experts; ++e) {
      d_bias_out[e] = static_cast<float>(d_bias[static_cast<size_t>(e)]);
    }
  }
  if (ctx.num_outputs() == 3) {
    float* load_out = ctx.out(2);
    for (int64_t e = 0; e < in.experts; ++e) {
      load_out[e] = static_cast<float>(loads[static_cast<size_t>(e)]);
    }
  }
}

}  // namespace

void run_moe_router(const Ctx& ctx) {
  ctx.expect_counts(1, 2, 1, 3);
  run_router_forward(ctx);
}

void run_router_grad(const Ctx& ctx) {
  ctx.expect_counts(2, 4, 1, 3);
  // d_routing (input 0 of the logits' gradient) has the routing's "route" dim; d_combined not.
  if (ctx.in_tensor(0).dim_index("route") >= 0) {
    run_router_gradient(ctx);
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

}  // namespace tpusim::kernels
