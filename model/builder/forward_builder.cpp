// model/builder/forward_builder.cpp: build_forward and ForwardBuilder's driver: the embedding, one
// region per layer group with the decoder layer assembled from its blocks (norms, attention of the
// group's kind, MLP or MoE, residuals, gemma4_small's per-layer inputs, qwen3_custom_moe's latent
// MoE layer), the pipeline's loop, and the head (final norm, logits, cross-entropy). The blocks
// are built in attention_block.cpp, mla_block.cpp, gated_delta_net.cpp, compressed_attention.cpp,
// feed_forward_block.cpp; deepseek4's layer in hyper_connections.cpp.
//
// Example (llama3.1-8b):
//   embed x1:  tokens -> token_embedding -> embedded [batch, length, embed=4096]
//   layer x32: pre_attention_norm, attention, attention_residual, pre_mlp_norm, mlp, mlp_residual
//   head x1:   final_norm, logits [batch, length, vocab=128256], cross_entropy -> loss
#include "model/builder/forward_builder.h"

#include <cmath>

#include "common/error.h"
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"
#include "model/model_dims.h"
#include "model/pipeline_schedule.h"

namespace tpusim {
namespace builder_detail {

ForwardBuilder::ForwardBuilder(const Config& config, int64_t batch, LayerOrder order)
    : config_(config),
      dims_(ModelDims::from_config(config)),
      batch_(batch),
      length_(options_.max_target_length),
      activation_dtype_(parse_dtype(options_.dtype, "dtype")),
      weight_dtype_(parse_dtype(options_.weight_dtype, "weight_dtype")),
      pipeline_(PipelineSchedule::from_config(config, batch)),
      order_(order) {}

ForwardGraph ForwardBuilder::build() {
  result_.batch = batch_;
  result_.length = length_;
  result_.pipeline = pipeline_;
  const std::vector<LayerGroup> groups = plan_layers(config_, order_);
  if (pipeline_.active() && groups.size() != 1) {
    throw UserError(std::string(options_.dcn_pipeline_parallelism > 1
                                    ? "dcn_pipeline_parallelism"
                                    : "ici_pipeline_parallelism") +
                    "=" + std::to_string(pipeline_.stages) + ": " + options_.model_name + " has " +
                    std::to_string(groups.size()) +
                    " kinds of decoder layer; pipelining is modeled only for models whose "
                    "decoder layers are all alike");
  }
  // MaxText's pipeline: the embedding and the logits shard the batch over the stages too
  // (activation_embed_and_logits_batch); the layers run one microbatch per iteration.
  if (pipeline_.active()) {
    batch_logical_ = "activation_embed_and_logits_batch";
  }
  TensorId x = build_embedding();
  result_.embed_output = x;
  for (const LayerGroup& group : groups) {
    const int64_t repeat =
        pipeline_.active() ? pipeline_.iterations() * pipeline_.layers_per_stage : group.count;
    const int region = graph().add_region(group.name(), repeat, Phase::kForward);
    if (pipeline_.active()) {
      PipelineLoop& loop = graph().mutable_region(region).pipeline;
      loop.layers_per_stage = pipeline_.layers_per_stage;
      loop.parameter_sets = pipeline_.layers_held();
      loop.delayed_forwarding = pipeline_.forwarding_delay > 1;
      loop.circular_storage = pipeline_.repeats > 1 && pipeline_.microbatches > pipeline_.stages;
      loop.weights_gathered_once = options_.pipeline_fsdp_ag_once;
    }
    const int64_t full_batch = batch_;
    const std::string full_logical = batch_logical_;
    batch_ /= pipeline_.active() ? pipeline_.microbatches : 1;
    batch_logical_ = "activation_batch";
    result_.layer_regions.push_back(region);
    const TensorId input =
        graph().add_tensor(group.name() + "/input", residual_dims(), activation_dtype_,
                           TensorKind::kActivation, region, "decoder_layer_input");
    // The previous region's output `x` is this region's input (the scan carry).
    graph().add_carry(x, input);
    result_.layer_inputs.push_back(input);
    const TensorId output = build_layer(group, region, input);
    if (repeat > 1) {
      graph().add_carry(output, input);
    }
    batch_ = full_batch;
    batch_logical_ = full_logical;
    result_.layer_outputs.push_back(output);
    x = output;
  }
  build_head();
  return std::move(result_);
}

TensorId ForwardBuilder::build_embedding() {
  const int region = graph().add_region("embed", 1, Phase::kForward);
  result_.embed_region = region;
  tokens_ = graph().add_tensor("tokens", token_dims(), DType::kI32, TensorKind::kInput, region);
  table_ = parameter_tensor(
      "token_embedding",
      {Dim{"vocab", dims_.vocab_size, "vocab"}, Dim{"embed", dims_.emb_dim, "embed"}}, region,
      normal_init(1.0));
  TensorId x = activation("embedded", activation_dims(), region);
  // MaxText's Embed with use_iota_embed: one_hot(tokens, vocab) . table, a matmul (the position
  // table of gpt3 and the per-layer tables of gemma4_small are charged as gathers: tpusim does not
  // know whether MaxText looks those up the same way).
  OpAttrs lookup;
  lookup.one_hot_embedding = options_.use_iota_embed;
  graph().add_op(OpKind::kEmbeddingLookup, "token_embedding", {tokens_, table_}, {x}, lookup,
                 region);
  const int64_t positions = options_.trainable_position_size;
  if (dims_.family().positions == PositionEncoding::kLearned && positions > 0) {
    if (positions < length_) {
      throw UserError("trainable_position_size: " + std::to_string(positions) +
                      " is shorter than max_target_length (" + std::to_string(length_) + ")");
    }
    const TensorId position_ids =
        graph().add_tensor("positions", token_dims(), DType::kI32, TensorKind::kInput, region);
    const TensorId position_table = parameter_tensor(
        "position_embedding",
        {Dim{"position", positions, "vocab"}, Dim{"embed", dims_.emb_dim, "embed"}}, region,
        normal_init(1.0));
    const TensorId position_x = activation("position_embedded", activation_dims(), region);
    graph().add_op(OpKind::kEmbeddingLookup, "position_embedding", {position_ids, position_table},
                   {position_x}, {}, region);
    x = elementwise("embedded_with_positions", ElementwiseFn::kAdd, {x, position_x}, region);
  }
  // deepseek4: copied into the hyper-connection streams (hyper_connections.cpp).
  return expand_streams(region, x);
}

TensorId ForwardBuilder::build_layer(const LayerGroup& group, int region, TensorId x) {
  if (group.attention == AttentionKind::kCompressed) {
    return build_deepseek4_layer(group, region, x);  // hyper_connections.cpp
  }
  if (dims_.family().latent_moe && group.feed_forward == FeedForwardKind::kMoe) {
    return build_latent_moe_layer(group, region, x);
  }
  const TensorId per_layer_input =
      dims_.has_per_layer_inputs() ? build_per_layer_input(region, x) : -1;
  // OLMo 2/3 normalize after the attention and the MLP instead of before them (HF
  // Olmo3DecoderLayer: post_attention_layernorm, post_feedforward_layernorm; no input norm).
  const bool post_norm_only = dims_.family().norm_placement == NormPlacement::kPostNormOnly;
  const TensorId attention_in = post_norm_only ? x : norm("pre_attention_norm", x, region);
  TensorId attention_out = group.attention == AttentionKind::kMla ? build_mla(region, attention_in)
                           : group.attention == AttentionKind::kGatedDeltaNet
                               ? build_gated_delta_net(region, attention_in)
                               : build_attention(group, region, attention_in);
  if (post_norm_only || options_.use_post_attn_norm) {
    attention_out = norm("post_attention_norm", attention_out, region);
  }
  const TensorId residual =
      elementwise("attention_residual", ElementwiseFn::kAdd, {x, attention_out}, region);
  const TensorId mlp_in = post_norm_only ? residual : norm("pre_mlp_norm", residual, region);
  TensorId mlp_out = group.feed_forward == FeedForwardKind::kMoe
                         ? build_moe(region, mlp_in)
                         : build_mlp("mlp", region, mlp_in, group.mlp_dim);
  if (post_norm_only || options_.use_post_ffw_norm) {
    mlp_out = norm("post_mlp_norm", mlp_out, region);
  }
  const TensorId output =
      elementwise("mlp_residual", ElementwiseFn::kAdd, {residual, mlp_out}, region);
  return per_layer_input < 0 ? output : add_per_layer_input(region, output, per_layer_input);
}

// qwen3_custom_moe's decoder layer (MaxText Qwen3CustomMoeDecoderLayer): attention projecting to
// attention_output_dim, a latent RMSNorm, the routed experts at that width, an up projection
// back to emb_dim, and one residual around it all.
TensorId ForwardBuilder::build_latent_moe_layer(const LayerGroup& group, int region, TensorId x) {
  const TensorId attention_in = norm("pre_attention_norm", x, region);
  TensorId latent = build_attention(group, region, attention_in);
  latent = norm("latent_norm", latent, region);
  latent = build_moe(region, latent);
  const int64_t width = dims_.attention_output_dim;
  if (width == dims_.emb_dim) {
    // MaxText builds no layer_up_projection when the latent width is emb_dim.
    latent = reshape("layer_output", latent, activation_dims(), region);
    return elementwise("layer_residual", ElementwiseFn::kAdd, {x, latent}, region);
  }
  latent = reshape("layer_up_projection/input", latent,
                   with_last(activation_dims(), {act("latent", width, "activation_mlp")}), region);
  const TensorId w_up = weight("layer_up_projection",
                               {Dim{"latent", width, "mlp"}, Dim{"embed", dims_.emb_dim, "embed"}},
                               region, dense(width));
  const TensorId up =
      einsum("layer_up_projection", latent, w_up, {"latent"}, activation_dims(), region);
  return elementwise("layer_residual", ElementwiseFn::kAdd, {x, up}, region);
}

// gemma4_small's per-layer input of width P = hidden_size_per_layer_input: the layer's own table
// [vocab_size_per_layer_input, P] looked up at the tokens, plus the normalized projection of the
// residual stream to P. MaxText projects the token embedding once for all layers ([D, L.P]) and
// each layer takes its slice; tpusim's layers project their own input instead (the program has
// no per-layer slices of a tensor made outside the scan): the same FLOPs, bytes and weights.
TensorId ForwardBuilder::build_per_layer_input(int region, TensorId x) {
  const int64_t width = dims_.hidden_size_per_layer_input;
  const std::vector<Dim> per_layer_dims =
      with_last(activation_dims(), {act("per_layer", width, "activation_mlp")});
  const TensorId tokens =
      graph().add_tensor("tokens", token_dims(), DType::kI32, TensorKind::kInput, region);
  const TensorId table = parameter_tensor(
      "per_layer/embedding",
      {Dim{"vocab", dims_.vocab_size_per_layer_input, "vocab"}, Dim{"per_layer", width, "embed"}},
      region, normal_init(1.0));
  const TensorId embedded = activation("per_layer/embedded", per_layer_dims, region);
  graph().add_op(OpKind::kEmbeddingLookup, "per_layer/embedding", {tokens, table}, {embedded}, {},
                 region);
  const TensorId w_projection =
      weight("per_layer/projection",
             {Dim{"embed", dims_.emb_dim, "embed"}, Dim{"per_layer", width, "mlp"}}, region,
             dense(dims_.emb_dim));
  const TensorId projected =
      einsum("per_layer/projection", x, w_projection, {"embed"}, per_layer_dims, region);
  const TensorId normed = norm("per_layer/projection_norm", projected, region);
  return elementwise("per_layer/input", ElementwiseFn::kAdd, {normed, embedded}, region);
}

// The layer's output plus norm(W_out . (gelu(W_gate . output) * per_layer_input)).
TensorId ForwardBuilder::add_per_layer_input(int region, TensorId output,
                                             TensorId per_layer_input) {
  const int64_t width = dims_.hidden_size_per_layer_input;
  const TensorId w_gate = weight(
      "per_layer/gate", {Dim{"embed", dims_.emb_dim, "embed"}, Dim{"per_layer", width, "mlp"}},
      region, dense(dims_.emb_dim));
  TensorId gate = einsum("per_layer/gate", output, w_gate, {"embed"},
                         graph().tensor(per_layer_input).dims, region);
  gate = elementwise("per_layer/gelu", ElementwiseFn::kGelu, {gate}, region);
  const TensorId gated =
      elementwise("per_layer/gated", ElementwiseFn::kMul, {gate, per_layer_input}, region);
  const TensorId w_out = weight(
      "per_layer/out", {Dim{"per_layer", width, "mlp"}, Dim{"embed", dims_.emb_dim, "embed"}},
      region, dense(width));
  TensorId projected =
      einsum("per_layer/out", gated, w_out, {"per_layer"}, activation_dims(), region);
  projected = norm("per_layer/out_norm", projected, region);
  return elementwise("per_layer/residual", ElementwiseFn::kAdd, {output, projected}, region);
}

// The final norm, logits and loss. With num_vocab_tiling = T > 1 (MaxText's chunked
// cross-entropy) the head is a region repeated T times over 1/T of the tokens each.
void ForwardBuilder::build_head() {
  const int64_t chunks = options_.num_vocab_tiling;
  if (length_ % chunks != 0) {
    throw UserError("num_vocab_tiling: " + std::to_string(chunks) +
                    " must divide max_target_length (" + std::to_string(length_) + ")");
  }
  const int region =
      graph().add_region("head", chunks, Phase::kForward, -1, /*shared_parameters=*/true);
  result_.head_region = region;
  result_.head_chunks = chunks;
  const int64_t full_length = length_;
  length_ /= chunks;
  const TensorId input = graph().add_tensor("head/input", residual_dims(), activation_dtype_,
                                            TensorKind::kActivation, region);
  result_.head_input = input;
  graph().add_carry(
      result_.layer_outputs.empty() ? result_.embed_output : result_.layer_outputs.back(), input);
  // deepseek4's hyper-connection streams are summed first (hyper_connections.cpp).
  const TensorId normed = norm("final_norm", reduce_streams(region, input), region);
  TensorId unembed = table_;
  if (dims_.logits_via_embedding && weight_dtype_ != activation_dtype_) {
    unembed = graph().add_tensor("token_embedding/cast", graph().tensor(table_).dims,
                                 activation_dtype_, TensorKind::kActivation, region);
    OpAttrs attrs;
    attrs.function = ElementwiseFn::kCast;
    graph().add_op(OpKind::kElementwise, "token_embedding/cast", {table_}, {unembed}, attrs,
                   region);
  }
  std::vector<std::string> contracted = {"embed"};
  if (!dims_.logits_via_embedding) {
    unembed =
        weight("unembedding",
               {Dim{"embed", dims_.emb_dim, "embed"}, Dim{"vocab", dims_.vocab_size, "vocab"}},
               region, dense(dims_.emb_dim));
  }
  const TensorId logits = einsum(
      "logits", normed, unembed, contracted,
      with_last(activation_dims(), {act("vocab", dims_.vocab_size, "activation_vocab")}), region);
  const TensorId targets =
      graph().add_tensor("targets", token_dims(), DType::kI32, TensorKind::kInput, region);
  const TensorId loss = graph().add_tensor("loss", {}, DType::kF32, TensorKind::kScalar, region);
  OpAttrs loss_attrs;
  loss_attrs.token_chunks = chunks;
  if (dims_.logits_via_embedding) {
    // MaxText's output head (decoders.py), in its tied branch only (logits attend on the token
    // embedding): with normalize_embedding_logits the logits are divided by sqrt(emb_dim), then
    // with final_logits_soft_cap > 0 they become cap tanh(logits / cap) (gemma2/3/4: 30). Its
    // untied branch (logits_dense) applies neither; tpusim train refuses a final cap there.
    // The loss applies both as it reads the logits (XLA fuses them into the loss, so the step
    // keeps one logits tensor).
    loss_attrs.logit_soft_cap = options_.final_logits_soft_cap;
    loss_attrs.logit_multiplier = options_.normalize_embedding_logits
                                      ? 1.0 / std::sqrt(static_cast<double>(dims_.emb_dim))
                                      : 1.0;
  }
  graph().add_op(OpKind::kCrossEntropy, "cross_entropy", {logits, targets}, {loss}, loss_attrs,
                 region);
  result_.loss = loss;
  length_ = full_length;
}

}  // namespace builder_detail

ForwardGraph build_forward(const Config& config, int64_t batch, LayerOrder order) {
  if (batch < 1) {
    throw UserError(
        "the global batch must hold at least one sequence (per_device_batch_size x "
        "devices = " +
        std::to_string(batch) + ")");
  }
  return builder_detail::ForwardBuilder(config, batch, order).build();
}

}  // namespace tpusim
