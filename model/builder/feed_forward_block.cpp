// model/builder/feed_forward_block.cpp: a decoder layer's feed-forward block: the (gated) MLP, and
// the mixture of experts that routes each token to top-k of num_experts expert MLPs (dropless or
// with a capacity), plus shared experts.
//
// Example (llama3.1-8b, SwiGLU, per token):
//   mlp/wi_0, mlp/wi_1 [embed=4096] -> [mlp=14336]; silu(wi_0) * wi_1; mlp/wo -> [embed=4096]
// mixtral-8x7b: moe/router picks 2 of 8 experts, moe/dispatch groups the tokens as
//   [experts=8, expert_tokens, embed], moe/experts is that MLP per expert, moe/combine sums back.
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "common/error.h"
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {

// Gated MLP: activations[0](x W_0) * activations[1](x W_1) ... then W_out; one activation =
// plain.
TensorId ForwardBuilder::build_mlp(const std::string& prefix, int region, TensorId x,
                                   int64_t mlp_dim, const std::string& experts_prefix,
                                   const Ragged& ragged) {
  const bool moe = !experts_prefix.empty();
  const std::vector<Dim> in_dims = graph().tensor(x).dims;
  std::vector<Dim> weight_lead;
  if (moe) {
    weight_lead.emplace_back("experts", dims_.num_experts, "exp");
  }
  const std::string embed_logical = moe ? "embed_moe" : "embed";
  // qwen3_custom_moe's experts read and write moe_expert_input_dim; emb_dim otherwise.
  const int64_t in_width = moe ? dims_.expert_input_dim() : dims_.emb_dim;
  const std::string mlp_logical = moe ? "mlp_moe" : "mlp";
  const std::string remat_prefix = moe ? "moe_mlpwi" : "mlpwi";
  std::vector<Dim> hidden_dims = with_last(in_dims, {act("mlp", mlp_dim, "activation_mlp")});
  // Fan-in: the contracted axis (embed for wi, mlp for wo). MaxText's routed experts pass
  // in_axis=0 (experts), out_axis=1 to the initializer of their [experts, a, b] kernels, so jax
  // takes fan-in = experts x b: experts x mlp for wi, experts x embed for wo.
  const int64_t wi_fan_in = moe ? dims_.num_experts * mlp_dim : dims_.emb_dim;
  const int64_t wo_fan_in = moe ? dims_.num_experts * in_width : mlp_dim;
  TensorId gated = -1;
  const auto& activations = dims_.mlp_activations;
  // MaxText clips the SwiGLU of deepseek's and deepseek4's routed experts at
  // mlp_activations_limit (moe.py apply_ffn_activation: the gate projection at most L before
  // the SiLU, the up projection within [-L, L]); its shared experts and dense MLPs (MlpBlock)
  // are not clipped. The clip rides on the activation and the gating product (OpAttrs).
  const DecoderBlock block = dims_.family().block;
  const double limit =
      moe && options_.mlp_activations_limit > 0 &&
              (block == DecoderBlock::kDeepseek || block == DecoderBlock::kDeepseek4) &&
              activations.size() == 2 && (activations[0] == "silu" || activations[0] == "swish") &&
              activations[1] == "linear"
          ? options_.mlp_activations_limit
          : 0.0;
  for (size_t index = 0; index < activations.size(); ++index) {
    std::vector<Dim> w_dims = weight_lead;
    w_dims.emplace_back("embed", in_width, embed_logical);
    w_dims.emplace_back("mlp", mlp_dim, mlp_logical);
    const std::string suffix = activations.size() > 1 ? "_" + std::to_string(index) : "";
    const TensorId w = weight(prefix + "/wi" + suffix, w_dims, region, dense(wi_fan_in));
    TensorId hidden = einsum(prefix + "/wi" + suffix, x, w, {"embed"}, hidden_dims, region,
                             remat_prefix + (activations.size() > 1 ? suffix : ""), ragged);
    const std::string& function = activations[index];
    if (function != "linear") {
      const ElementwiseFn fn = function == "silu" || function == "swish" ? ElementwiseFn::kSilu
                               : function == "relu"                      ? ElementwiseFn::kRelu
                               : function == "sigmoid"                   ? ElementwiseFn::kSigmoid
                                                                         : ElementwiseFn::kGelu;
      hidden = elementwise(prefix + "/" + function + suffix, fn, {hidden}, region);
      if (limit > 0 && index == 0) {
        graph().mutable_op(graph().producer(hidden)).attrs.activation_limit = limit;
      }
    }
    gated = gated < 0 ? hidden
                      : elementwise(prefix + "/gate", ElementwiseFn::kMul, {gated, hidden}, region);
    if (limit > 0 && index == 1) {
      graph().mutable_op(graph().producer(gated)).attrs.activation_limit = limit;
    }
  }
  std::vector<Dim> wo_dims = weight_lead;
  wo_dims.emplace_back("mlp", mlp_dim, mlp_logical);
  wo_dims.emplace_back("embed", in_width, embed_logical);
  const TensorId wo = weight(prefix + "/wo", wo_dims, region, dense(wo_fan_in));
  return einsum(prefix + "/wo", gated, wo, {"mlp"}, in_dims, region, moe ? "moe_mlpwo" : "mlpwo",
                ragged);
}

// Routed experts (top-k of num_experts) plus shared experts. With sparse_matmul=false and
// capacity_factor > 0 each expert gets capacity_factor x B*S*k/E slots and drops the choices
// beyond them. Otherwise routing is dropless: the E x ceil(B*S*k/E) rows hold all B*S*k token
// choices sorted by expert, however unbalanced (row_experts says whose each row is; the
// partitioner enlarges the rows under expert parallelism, see sharding/partitioner.h).
//
// deepseek4's hash-routed layers (hash_routing; MaxText RoutedMoE.get_topk with is_hash_routing)
// take each token's experts from a fixed [vocab, top_k] table at its token id instead of the
// top-k of the router's scores; the router still scores every expert and the chosen experts'
// scores weight them, so the program is the same and the router op is named moe/hash_router.
TensorId ForwardBuilder::build_moe(int region, TensorId x, bool hash_routing) {
  const int64_t experts = dims_.num_experts;
  const int64_t top_k = dims_.num_experts_per_tok;
  const int64_t width = dims_.expert_input_dim();
  const std::vector<Dim> moe_dims = graph().tensor(x).dims;
  const TensorId w_gate =
      weight("moe/gate", {Dim{"embed", width, "embed"}, Dim{"experts", experts, "exp"}}, region,
             dense(width));
  const TensorId router_logits =
      einsum("moe/router", x, w_gate, {"embed"},
             with_last(moe_dims, {act("experts", experts, "activation_exp")}), region);
  const TensorId routing = activation(
      "moe/routing", with_last(moe_dims, {act("top_k", top_k, ""), act("route", 2, "")}), region);
  OpAttrs router_attrs;
  router_attrs.top_k = top_k;
  router_attrs.normalize_top_k = options_.normalize_router_top_k;
  router_attrs.route_scale = options_.routed_scaling_factor;
  router_attrs.hash_routing = hash_routing;
  router_attrs.sqrt_softplus_scores = options_.sqrt_softplus_router_scores;
  router_attrs.load_balance_scale = hash_routing ? 0.0 : load_balance_scale();
  std::vector<TensorId> router_outputs = {routing};
  if (router_attrs.load_balance_scale > 0) {
    for (const char* name : {"moe/balance_probabilities", "moe/balance_choices"}) {
      router_outputs.push_back(
          graph().add_tensor(name, with_last(moe_dims, {act("experts", experts, "")}), DType::kF32,
                             TensorKind::kActivation, region));
    }
  }
  std::vector<TensorId> router_inputs = {router_logits};
  if (options_.routed_bias && !hash_routing) {
    // MaxText's GateLogit bias (moe.py, use_bias = routed_bias and not is_hash_routing):
    // [experts], zeros at init, replicated (the last of the gate's kernel_axes, None in
    // deepseek4.py's ("embed", None)); it is added to the scores to choose the experts, not to
    // weight them.
    router_inputs.push_back(
        parameter_tensor("moe/gate_bias", {Dim{"experts", experts, ""}}, region, constant_init(0)));
    check_bias_update_without_pipeline();
  }
  graph().add_op(OpKind::kMoeRouter, hash_routing ? "moe/hash_router" : "moe/router_top_k",
                 router_inputs, router_outputs, router_attrs, region);
  if (router_outputs.size() == 3) {
    build_load_balance_loss(region, router_outputs[1], router_outputs[2]);
  }
  const double tokens = static_cast<double>(batch_ * length_);
  const double capacity_factor = options_.capacity_factor;
  const bool padded = !options_.sparse_matmul && capacity_factor > 0;
  const double per_expert = tokens * static_cast<double>(top_k) / static_cast<double>(experts) *
                            (padded ? capacity_factor : 1.0);
  const auto expert_tokens = static_cast<int64_t>(std::ceil(per_expert));
  const std::vector<Dim> grouped_dims = {
      act("experts", experts, "activation_exp"),
      act("expert_tokens", expert_tokens, "activation_batch_no_exp+activation_length"),
      act("embed", width, "activation_embed")};
  const TensorId grouped = activation("moe/dispatched", grouped_dims, region);
  OpAttrs dispatch_attrs;
  dispatch_attrs.top_k = top_k;
  dispatch_attrs.capacity_factor = padded ? capacity_factor : 0.0;
  dispatch_attrs.ragged_buffer_factor = options_.ragged_buffer_factor;
  std::vector<TensorId> dispatched = {grouped};
  Ragged ragged;
  if (!padded) {
    ragged.row_experts = graph().add_tensor("moe/row_experts", {grouped_dims[0], grouped_dims[1]},
                                            DType::kI32, TensorKind::kActivation, region);
    ragged.routed_fraction =
        tokens * static_cast<double>(top_k) / static_cast<double>(experts * expert_tokens);
    dispatched.push_back(ragged.row_experts);
  }
  graph().add_op(OpKind::kMoeDispatch, "moe/dispatch", {x, routing}, dispatched, dispatch_attrs,
                 region);
  const TensorId expert_out =
      build_mlp("moe/experts", region, grouped, dims_.moe_mlp_dim, "moe", ragged);
  TensorId combined = activation("moe/combined", moe_dims, region);
  graph().add_op(OpKind::kMoeCombine, "moe/combine", {expert_out, routing}, {combined},
                 dispatch_attrs, region);
  if (dims_.has_shared_experts()) {
    TensorId shared =
        build_mlp("moe/shared", region, x, dims_.shared_expert_mlp_dim() * dims_.shared_experts);
    if (dims_.is_gated_delta_net_block()) {
      // Qwen3-Next's shared expert is gated per token (Hugging Face Qwen3NextSparseMoeBlock:
      // sigmoid(shared_expert_gate(x)) * shared_expert(x), shared_expert_gate: D -> 1).
      const TensorId w_shared_gate = weight(
          "moe/shared_gate", {Dim{"embed", dims_.emb_dim, "embed"}}, region, dense(dims_.emb_dim));
      TensorId gate = einsum("moe/shared_gate", x, w_shared_gate, {"embed"}, token_dims(), region);
      gate = elementwise("moe/shared_gate_sigmoid", ElementwiseFn::kSigmoid, {gate}, region);
      shared = elementwise("moe/shared_gated", ElementwiseFn::kMul, {shared, gate}, region);
    }
    combined = elementwise("moe/add_shared", ElementwiseFn::kAdd, {combined, shared}, region);
  }
  return combined;
}

// MaxText's load-balance loss (moe.py permute and load_balance_loss at 00a1eaaa, Switch
// Transformer's; docs/reference/deepseek4.md section 6), read globally: per sequence b, density
// [b, e] = the mean over its S tokens of how many of a token's choices are e, density_prob[b, e]
// = the mean of its softmax p[., e]; the layer's loss is w E^2 x the mean over (b, e) of their
// product, and the step adds the mean over the L routed layers, so each layer adds
// c x sum over (b, e) of counts[b, e] x sum over tokens of p with c = w E / (B S^2 L).
// Hash-routed layers have none (their permute skips it). Built for deepseek4 only: MaxText
// computes it for every routed MoE, but tpusim's other families keep their program (and their
// estimates) for now, and train refuses the key for them.
double ForwardBuilder::load_balance_scale() const {
  const double weight = options_.load_balance_loss_weight;
  if (weight <= 0 || dims_.family().block != DecoderBlock::kDeepseek4 || !dims_.is_moe()) {
    return 0.0;
  }
  int64_t routed_layers = 0;
  for (int64_t layer = 0; layer < dims_.num_layers; ++layer) {
    routed_layers += dims_.is_moe_layer(layer) && !dims_.is_hash_routing_layer(layer) ? 1 : 0;
  }
  if (routed_layers == 0) {
    return 0.0;
  }
  if (pipeline_.active()) {
    // A pipeline's layer region runs its microbatches' iterations interleaved (and bubbles):
    // the per-layer terms would need their own bookkeeping, not built.
    std::ostringstream value;
    value << weight;
    throw UserError("load_balance_loss_weight: " + value.str() +
                    " is not built with pipeline parallelism (the load-balance loss of " +
                    std::string(dims_.family().name) + "'s MoE layers)");
  }
  const auto sequences = static_cast<double>(batch_);
  const auto length = static_cast<double>(length_);
  return weight * static_cast<double>(dims_.num_experts) /
         (sequences * length * length * static_cast<double>(routed_layers));
}

// MaxText's routed_bias_update_rate (deepseek4's biased routers): the router's VJP counts each
// layer's choices for the bias's update after AdamW (model/autodiff/training_step.cpp). A
// pipeline's layer region runs its microbatches' iterations interleaved: those per-layer counts
// would need their own bookkeeping there, not built.
void ForwardBuilder::check_bias_update_without_pipeline() const {
  const double rate = options_.routed_bias_update_rate;
  if (rate <= 0 || dims_.family().block != DecoderBlock::kDeepseek4 || !pipeline_.active()) {
    return;
  }
  std::ostringstream value;
  value << rate;
  throw UserError("routed_bias_update_rate: " + value.str() +
                      " is not built with pipeline parallelism (the router bias's update of " +
                      std::string(dims_.family().name) + "'s MoE layers)",
                  "routed_bias_update_rate");
}

// balance_probabilities = c x softmax(score + bias) and choices (one-hot) [batch, length,
// experts]: each summed over the length (all-reduced over the axes that split the sequences),
// the counts kept for the router's VJP, and their product summed over (batch, experts), which
// ends in an all-reduce over the batch's axes: the layer's share of the loss.
void ForwardBuilder::build_load_balance_loss(int region, TensorId balance_probabilities,
                                             TensorId choices) {
  std::vector<Dim> per_sequence;
  for (const Dim& dim : graph().tensor(choices).dims) {
    if (dim.name != "length") {
      per_sequence.push_back(dim);
    }
  }
  OpAttrs over_length;
  over_length.contracted = {"length"};
  std::vector<TensorId> sums;
  for (const auto& [name, tensor] :
       {std::pair{"moe/balance_counts", choices},
        std::pair{"moe/balance_probability_sums", balance_probabilities}}) {
    sums.push_back(
        graph().add_tensor(name, per_sequence, DType::kF32, TensorKind::kActivation, region));
    graph().add_op(OpKind::kReduceSum, name, {tensor}, {sums.back()}, over_length, region);
  }
  const TensorId loss =
      graph().add_tensor("moe/load_balance_loss", {}, DType::kF32, TensorKind::kScalar, region);
  OpAttrs product;
  for (const Dim& dim : per_sequence) {
    product.contracted.push_back(dim.name);
  }
  graph().add_op(OpKind::kEinsum, "moe/load_balance_loss", sums, {loss}, product, region);
  result_.auxiliary_losses.push_back(loss);
}

}  // namespace tpusim::builder_detail
