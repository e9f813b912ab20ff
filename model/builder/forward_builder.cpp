#include "model/builder/forward_builder.h"

#include <cmath>

#include "common/error.h"
#include "model/config.h"
#include "model/model_dims.h"
#include "model/pipeline_schedule.h"

namespace tpusim {
namespace {

// The rows of a dropless MoE's grouped tensors: whose expert each row is, and the fraction of
// rows balanced routing fills (see model/ir/op.h). row_experts < 0: not ragged.
struct Ragged {
  TensorId row_experts = -1;
  double routed_fraction = 1;
};

// Builds one model into a ForwardGraph; holds the config-derived sizes the layers share.
class ForwardBuilder {
 public:
  ForwardBuilder(const Config& config, int64_t batch)
      : config_(config),
        dims_(ModelDims::from_config(config)),
        batch_(batch),
        length_(config.get_int("max_target_length")),
        activation_dtype_(parse_dtype(config.get_string("dtype"), "dtype")),
        weight_dtype_(parse_dtype(config.get_string("weight_dtype"), "weight_dtype")),
        block_(config.get_string("decoder_block")),
        pipeline_(PipelineSchedule::from_config(config, batch)) {}

  ForwardGraph build() {
    result_.batch = batch_;
    result_.length = length_;
    result_.pipeline = pipeline_;
    const std::vector<LayerGroup> groups = plan_layers(config_);
    if (pipeline_.active() && groups.size() != 1) {
      throw UserError(std::string(config_.get_int("dcn_pipeline_parallelism") > 1
                                      ? "dcn_pipeline_parallelism"
                                      : "ici_pipeline_parallelism") +
                      "=" + std::to_string(pipeline_.stages) + ": " +
                      config_.get_string("model_name") + " has " + std::to_string(groups.size()) +
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
        loop.weights_gathered_once = config_.get_bool("pipeline_fsdp_ag_once");
      }
      const int64_t full_batch = batch_;
      const std::string full_logical = batch_logical_;
      batch_ /= pipeline_.active() ? pipeline_.microbatches : 1;
      batch_logical_ = "activation_batch";
      result_.layer_regions.push_back(region);
      const TensorId input =
          graph().add_tensor(group.name() + "/input", activation_dims(), activation_dtype_,
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

 private:
  Graph& graph() { return result_.graph; }

  Dim act(const std::string& name, int64_t size, const std::string& logical) const {
    return Dim{name, size, logical};
  }
  std::vector<Dim> activation_dims() const {
    return {act("batch", batch_, batch_logical_), act("length", length_, "activation_length"),
            act("embed", dims_.emb_dim, "activation_embed")};
  }
  std::vector<Dim> with_last(std::vector<Dim> dims, std::vector<Dim> last) const {
    dims.pop_back();
    dims.insert(dims.end(), last.begin(), last.end());
    return dims;
  }
  std::vector<Dim> token_dims() const {
    return {act("batch", batch_, batch_logical_), act("length", length_, "activation_length")};
  }

  // A parameter as a matmul reads it: MaxText keeps weights in weight_dtype and casts them to
  // dtype inside the layer; the cast runs on each device's shard, so FSDP gathers move dtype bytes.
  TensorId weight(const std::string& name, std::vector<Dim> dims, int region,
                  const ParameterInit& init) {
    const TensorId parameter = parameter_tensor(name, std::move(dims), region, init);
    if (weight_dtype_ == activation_dtype_) {
      return parameter;
    }
    const TensorId cast = graph().add_tensor(name + "/cast", graph().tensor(parameter).dims,
                                             activation_dtype_, TensorKind::kActivation, region);
    OpAttrs attrs;
    attrs.function = ElementwiseFn::kCast;
    graph().add_op(OpKind::kElementwise, name + "/cast", {parameter}, {cast}, attrs, region);
    return cast;
  }
  // A parameter used as is (norm scales and biases, embedding tables).
  TensorId parameter_tensor(const std::string& name, std::vector<Dim> dims, int region,
                            const ParameterInit& init) {
    result_.initializers[graph().region(region).name + "/" + name] = init;
    return graph().add_tensor(name, std::move(dims), weight_dtype_, TensorKind::kParameter, region);
  }
  // MaxText's dense kernels: variance scaling over `fan_in` (the contracted axes), truncated
  // normal; GPT-3's attention kernels draw from a plain normal (Gpt3MultiHeadAttention).
  ParameterInit dense(int64_t fan_in, double divisor = 1, bool gpt3_attention = false) const {
    return kernel_init(static_cast<double>(fan_in), divisor,
                       gpt3_attention && block_ == "gpt3" ? InitDistribution::kNormal
                                                          : InitDistribution::kTruncatedNormal);
  }
  TensorId activation(const std::string& name, std::vector<Dim> dims, int region,
                      const std::string& remat_name = "") {
    return graph().add_tensor(name, std::move(dims), activation_dtype_, TensorKind::kActivation,
                              region, remat_name);
  }
  TensorId einsum(const std::string& name, TensorId lhs, TensorId rhs,
                  std::vector<std::string> contracted, std::vector<Dim> out_dims, int region,
                  const std::string& remat_name = "", const Ragged& ragged = {}) {
    const TensorId out = activation(name, std::move(out_dims), region, remat_name);
    OpAttrs attrs;
    attrs.contracted = std::move(contracted);
    std::vector<TensorId> inputs = {lhs, rhs};
    if (ragged.row_experts >= 0) {
      inputs.push_back(ragged.row_experts);
      attrs.routed_fraction = ragged.routed_fraction;
    }
    graph().add_op(OpKind::kEinsum, name, inputs, {out}, attrs, region);
    return out;
  }
  TensorId elementwise(const std::string& name, ElementwiseFn fn, std::vector<TensorId> inputs,
                       int region, const std::string& remat_name = "") {
    const TensorId out = activation(name, graph().tensor(inputs.front()).dims, region, remat_name);
    OpAttrs attrs;
    attrs.function = fn;
    graph().add_op(OpKind::kElementwise, name, std::move(inputs), {out}, attrs, region);
    return out;
  }
  // An elementwise op whose output has `dims` (inputs broadcast along the dims they lack).
  TensorId elementwise_to(const std::string& name, ElementwiseFn fn, std::vector<TensorId> inputs,
                          std::vector<Dim> dims, int region) {
    const TensorId out = activation(name, std::move(dims), region);
    OpAttrs attrs;
    attrs.function = fn;
    graph().add_op(OpKind::kElementwise, name, std::move(inputs), {out}, attrs, region);
    return out;
  }
  // The elements of `x` under other dims (ElementwiseFn::kReshape).
  TensorId reshape(const std::string& name, TensorId x, std::vector<Dim> dims, int region) {
    return elementwise_to(name, ElementwiseFn::kReshape, {x}, std::move(dims), region);
  }
  TensorId norm(const std::string& name, TensorId x, int region) {
    // Copies: adding tensors below may move the graph's storage.
    const std::vector<Dim> input_dims = graph().tensor(x).dims;
    const Dim& last = input_dims.back();
    const bool layer_norm = block_ == "gpt3";
    std::vector<TensorId> inputs = {
        x, parameter_tensor(name + "/scale", {Dim{last.name, last.size, "norm"}}, region,
                            constant_init(1))};
    if (layer_norm) {
      inputs.push_back(parameter_tensor(name + "/bias", {Dim{last.name, last.size, "norm"}}, region,
                                        constant_init(0)));
    }
    const TensorId out = activation(name, input_dims, region);
    OpAttrs attrs;
    attrs.contracted = {last.name};
    attrs.epsilon = config_.get_float("normalization_layer_epsilon");
    graph().add_op(layer_norm ? OpKind::kLayerNorm : OpKind::kRmsNorm, name, inputs, {out}, attrs,
                   region);
    return out;
  }

  TensorId build_embedding() {
    const int region = graph().add_region("embed", 1, Phase::kForward);
    result_.embed_region = region;
    tokens_ = graph().add_tensor("tokens", token_dims(), DType::kI32, TensorKind::kInput, region);
    table_ = parameter_tensor(
        "token_embedding",
        {Dim{"vocab", dims_.vocab_size, "vocab"}, Dim{"embed", dims_.emb_dim, "embed"}}, region,
        normal_init(1.0));
    TensorId x = activation("embedded", activation_dims(), region);
    graph().add_op(OpKind::kEmbeddingLookup, "token_embedding", {tokens_, table_}, {x}, {}, region);
    const int64_t positions = config_.get_int("trainable_position_size");
    if (block_ == "gpt3" && positions > 0) {
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
    return x;
  }

  TensorId build_layer(const LayerGroup& group, int region, TensorId x) {
    const TensorId per_layer_input =
        dims_.has_per_layer_inputs() ? build_per_layer_input(region, x) : -1;
    // OLMo 2/3 normalize after the attention and the MLP instead of before them (HF
    // Olmo3DecoderLayer: post_attention_layernorm, post_feedforward_layernorm; no input norm).
    const bool post_norm_only = block_ == "olmo3";
    const TensorId attention_in = post_norm_only ? x : norm("pre_attention_norm", x, region);
    TensorId attention_out = group.attention == AttentionKind::kMla
                                 ? build_mla(region, attention_in)
                             : group.attention == AttentionKind::kGatedDeltaNet
                                 ? build_gated_delta_net(region, attention_in)
                                 : build_attention(group, region, attention_in);
    if (post_norm_only || config_.get_bool("use_post_attn_norm")) {
      attention_out = norm("post_attention_norm", attention_out, region);
    }
    const TensorId residual =
        elementwise("attention_residual", ElementwiseFn::kAdd, {x, attention_out}, region);
    const TensorId mlp_in = post_norm_only ? residual : norm("pre_mlp_norm", residual, region);
    TensorId mlp_out = group.feed_forward == FeedForwardKind::kMoe
                           ? build_moe(region, mlp_in)
                           : build_mlp("mlp", region, mlp_in, group.mlp_dim);
    if (post_norm_only || config_.get_bool("use_post_ffw_norm")) {
      mlp_out = norm("post_mlp_norm", mlp_out, region);
    }
    const TensorId output =
        elementwise("mlp_residual", ElementwiseFn::kAdd, {residual, mlp_out}, region);
    return per_layer_input < 0 ? output : add_per_layer_input(region, output, per_layer_input);
  }

  // gemma4_small's per-layer input of width P = hidden_size_per_layer_input: the layer's own table
  // [vocab_size_per_layer_input, P] looked up at the tokens, plus the normalized projection of the
  // residual stream to P. MaxText projects the token embedding once for all layers ([D, L.P]) and
  // each layer takes its slice; tpusim's layers project their own input instead (the program has
  // no per-layer slices of a tensor made outside the scan): the same FLOPs, bytes and weights.
  TensorId build_per_layer_input(int region, TensorId x) {
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
  TensorId add_per_layer_input(int region, TensorId output, TensorId per_layer_input) {
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

  std::vector<Dim> head_dims(int64_t heads, const std::string& heads_name,
                             const std::string& activation_logical, const std::string& dim_name,
                             int64_t dim_size) const {
    return with_last(activation_dims(), {act(heads_name, heads, activation_logical),
                                         act(dim_name, dim_size, "activation_kv")});
  }

  TensorId attention_op(const LayerGroup& group, int region, std::vector<TensorId> inputs,
                        int64_t heads, const std::string& out_dim, int64_t out_dim_size,
                        double runtime_scale) {
    const TensorId context = activation(
        "attention/context", head_dims(heads, "heads", "activation_heads", out_dim, out_dim_size),
        region, "context");
    OpAttrs attrs;
    attrs.mask = group.attention == AttentionKind::kSlidingWindow ? AttentionMask::kSlidingWindow
                 : group.attention == AttentionKind::kChunked     ? AttentionMask::kChunked
                                                                  : AttentionMask::kCausal;
    attrs.window = group.attention == AttentionKind::kChunked
                       ? dims_.chunk_attn_window_size
                       : config_.get_int("sliding_window_size");
    attrs.attention_scale = runtime_scale;
    // MaxText's attn_logits_soft_cap (AttentionOp, attention_op.py): the scaled logits become
    // cap tanh(logits / cap) before the mask and the softmax. MaxText's presets set it for gemma2
    // (50); tpusim applies it in whichever block the config sets it.
    attrs.logit_soft_cap = config_.get_float("attn_logits_soft_cap");
    graph().add_op(OpKind::kAttention, "attention", std::move(inputs), {context}, attrs, region);
    return context;
  }

  TensorId out_projection(int region, TensorId context, const std::string& head_dim_name,
                          int64_t head_dim_size) {
    const TensorId wo =
        weight("attention/out",
               {Dim{"heads", dims_.num_query_heads, "heads"},
                Dim{head_dim_name, head_dim_size, "kv"}, Dim{"embed", dims_.emb_dim, "embed"}},
               region, dense(dims_.num_query_heads * head_dim_size, 1, true));
    const TensorId out = einsum("attention/out", context, wo, {"heads", head_dim_name},
                                activation_dims(), region, "out_proj");
    return with_bias("attention/out", out, {Dim{"embed", dims_.emb_dim, "norm"}}, region);
  }

  // With attention_bias (qwen2, gpt-oss), MaxText's attention projections (query, key, value and
  // out) add a learned bias over their output features; otherwise `x` as it is.
  TensorId with_bias(const std::string& name, TensorId x, std::vector<Dim> bias_dims, int region) {
    if (!config_.get_bool("attention_bias")) {
      return x;
    }
    // MaxText's bias_init: zeros.
    const TensorId bias =
        parameter_tensor(name + "/bias", std::move(bias_dims), region, constant_init(0));
    return elementwise(name + "/add_bias", ElementwiseFn::kAdd, {x, bias}, region);
  }

  // gemma4_small's kv-shared layers (group.kv_shared) project their own keys and values here,
  // where MaxText reuses those of the last earlier layer of the same attention kind: the program
  // has no tensors that cross from one scanned region into a later one. That adds 2.D.2K.h FLOPs
  // per token and layer (0.7% of gemma4-e2b's step); model/flops_maxtext.cpp counts MaxText's.
  TensorId build_attention(const LayerGroup& group, int region, TensorId x) {
    // gemma4's global layers: their own head width and kv heads, one K/V projection.
    const bool global = group.attention == AttentionKind::kGlobal;
    const int64_t head_dim = global ? dims_.global_layer_head_dim() : dims_.head_dim;
    const int64_t kv_heads = global ? dims_.global_layer_kv_heads() : dims_.num_kv_heads;
    const bool shared_kv = global && dims_.global_layer_shares_kv();
    // llama4's global layers use no position encoding (NoPE); gpt3 adds learned positions.
    const bool rotary = block_ != "gpt3" && !(block_ == "llama4" && global);
    const QueryScaling scaling = query_scaling(config_, head_dim);
    auto projection = [&](const std::string& name, const std::string& heads_name, int64_t heads,
                          const std::string& weight_logical, const std::string& act_logical,
                          const std::string& remat) {
      // Fan-in = embed (the contracted axis); the query's init carries the folded 1/sqrt(d).
      const double divisor = name == "query" ? scaling.init_divisor : 1.0;
      const TensorId w =
          weight("attention/" + name,
                 {Dim{"embed", dims_.emb_dim, "embed"}, Dim{heads_name, heads, weight_logical},
                  Dim{"head_dim", head_dim, "kv"}},
                 region, dense(dims_.emb_dim, divisor, true));
      const TensorId projected =
          einsum("attention/" + name, x, w, {"embed"},
                 head_dims(heads, heads_name, act_logical, "head_dim", head_dim), region, remat);
      return with_bias("attention/" + name, projected,
                       {Dim{heads_name, heads, weight_logical}, Dim{"head_dim", head_dim, "kv"}},
                       region);
    };
    TensorId query = projection("query", "heads", dims_.num_query_heads, "q_heads",
                                "activation_heads", "query_proj");
    TensorId key =
        projection("key", "kv_heads", kv_heads, "kv_heads", "activation_kv_heads", "key_proj");
    // Shared K/V: the values are the key projection as computed, before RoPE.
    const TensorId value = shared_kv ? key
                                     : projection("value", "kv_heads", kv_heads, "kv_heads",
                                                  "activation_kv_heads", "value_proj");
    if (uses_qk_norm(config_)) {
      // MaxText's Attention with use_qk_norm (attentions.py, qwen3's layers): an RMSNorm over
      // head_dim of every head of the projected query and of the projected key, each with its own
      // learned [head_dim] scale (initialized to ones, kernel axis "norm") and epsilon
      // normalization_layer_epsilon, applied before RoPE; the values are not normalized. The
      // query is then scaled by query_pre_attn_scalar = head_dim^-0.5 at run time (scaling above).
      // llama4's qk-norm (a scale-free L2 norm after RoPE) is another function: tpusim train
      // refuses it, tpusim estimate charges it as this norm (the same traffic and vector work).
      query = norm("attention/query_norm", query, region);
      key = norm("attention/key_norm", key, region);
    }
    if (rotary) {
      query = rope("attention/query_rope", query, region);
      key = rope("attention/key_rope", key, region);
    }
    TensorId context = attention_op(group, region, {query, key, value}, dims_.num_query_heads,
                                    "head_dim", head_dim, scaling.runtime_scale);
    if (dims_.is_gated_delta_net_block()) {
      // Qwen3-Next's gated attention (Hugging Face Qwen3NextAttention): the query projection also
      // yields a gate as wide as the query (q_proj: D -> 2.H.h), and the context is multiplied by
      // sigmoid(gate) before the out projection. A separate einsum here, the same FLOPs.
      TensorId gate =
          projection("gate", "heads", dims_.num_query_heads, "q_heads", "activation_heads", "");
      gate = elementwise("attention/gate_sigmoid", ElementwiseFn::kSigmoid, {gate}, region);
      context =
          elementwise("attention/gated_context", ElementwiseFn::kMul, {context, gate}, region);
    }
    return out_projection(region, context, "head_dim", head_dim);
  }

  TensorId rope(const std::string& name, TensorId x, int region) {
    const TensorId out = activation(name, graph().tensor(x).dims, region);
    OpAttrs attrs;
    attrs.rope_max_timescale = static_cast<double>(config_.get_int("rope_max_timescale"));
    graph().add_op(OpKind::kRope, name, {x}, {out}, attrs, region);
    return out;
  }

  // DeepSeek multi-head latent attention: low-rank query (q_lora_rank > 0) and key/value
  // (kv_lora_rank) projections, a shared rotary key, per-head nope+rope query/key dims.
  TensorId build_mla(int region, TensorId x) {
    const int64_t heads = dims_.num_query_heads;
    const int64_t q_lora = config_.get_int("q_lora_rank");
    const int64_t kv_lora = config_.get_int("kv_lora_rank");
    const int64_t nope = config_.get_int("qk_nope_head_dim");
    const int64_t rope_dim = config_.get_int("qk_rope_head_dim");
    const int64_t value_dim = config_.get_int("v_head_dim");
    const Dim embed_w{"embed", dims_.emb_dim, "embed"};
    const Dim heads_w{"heads", heads, "q_heads"};
    TensorId query = -1;
    const auto query_dims =
        head_dims(heads, "heads", "activation_heads", "qk_head_dim", nope + rope_dim);
    if (q_lora > 0) {
      const TensorId wq_a = weight("mla/wq_a", {embed_w, Dim{"q_lora", q_lora, "q_lora"}}, region,
                                   dense(dims_.emb_dim));
      TensorId q_latent =
          einsum("mla/q_latent", x, wq_a, {"embed"},
                 with_last(activation_dims(), {act("q_lora", q_lora, "activation_embed")}), region,
                 "mla_q");
      q_latent = norm("mla/q_norm", q_latent, region);
      const TensorId wq_b = weight(
          "mla/wq_b",
          {Dim{"q_lora", q_lora, "q_lora"}, heads_w, Dim{"qk_head_dim", nope + rope_dim, "kv"}},
          region, dense(q_lora));
      query = einsum("mla/query", q_latent, wq_b, {"q_lora"}, query_dims, region, "query_proj");
    } else {
      const TensorId wq =
          weight("mla/wq", {embed_w, heads_w, Dim{"qk_head_dim", nope + rope_dim, "kv"}}, region,
                 dense(dims_.emb_dim));
      query = einsum("mla/query", x, wq, {"embed"}, query_dims, region, "query_proj");
    }
    query = rope("mla/query_rope", query, region);
    const TensorId wkv_a = weight("mla/wkv_a", {embed_w, Dim{"kv_lora", kv_lora, "kv_lora"}},
                                  region, dense(dims_.emb_dim));
    TensorId kv_latent =
        einsum("mla/kv_latent", x, wkv_a, {"embed"},
               with_last(activation_dims(), {act("kv_lora", kv_lora, "activation_embed")}), region,
               "mla_kv");
    kv_latent = norm("mla/kv_norm", kv_latent, region);
    const TensorId wk_rope = weight("mla/wk_rope", {embed_w, Dim{"qk_rope", rope_dim, "kv"}},
                                    region, dense(dims_.emb_dim));
    TensorId key_rope =
        einsum("mla/key_rope", x, wk_rope, {"embed"},
               with_last(activation_dims(), {act("qk_rope", rope_dim, "")}), region);
    key_rope = rope("mla/key_rope_rotated", key_rope, region);
    const TensorId wk_b = weight(
        "mla/wk_b", {Dim{"kv_lora", kv_lora, "kv_lora"}, heads_w, Dim{"qk_nope", nope, "kv"}},
        region, dense(kv_lora));
    const TensorId key =
        einsum("mla/key", kv_latent, wk_b, {"kv_lora"},
               head_dims(heads, "heads", "activation_heads", "qk_nope", nope), region, "key_proj");
    const TensorId wv_b =
        weight("mla/wv_b",
               {Dim{"kv_lora", kv_lora, "kv_lora"}, heads_w, Dim{"v_head_dim", value_dim, "kv"}},
               region, dense(kv_lora));
    const TensorId value =
        einsum("mla/value", kv_latent, wv_b, {"kv_lora"},
               head_dims(heads, "heads", "activation_heads", "v_head_dim", value_dim), region,
               "value_proj");
    LayerGroup mla;
    mla.attention = AttentionKind::kMla;
    const TensorId context =
        attention_op(mla, region, {query, key, value, key_rope}, heads, "v_head_dim", value_dim,
                     query_scaling(config_, nope + rope_dim).runtime_scale);
    return out_projection(region, context, "v_head_dim", value_dim);
  }

  // A Gated DeltaNet layer (qwen3_next, qwen3_5: Yang, Kautz, Hatamizadeh, "Gated Delta
  // Networks", arXiv:2412.06464; Hugging Face Qwen3NextGatedDeltaNet and its
  // torch_chunk_gated_delta_rule). Per token: q, k (Hk key heads of dk), v, z (Hv = G.Hk value
  // heads of dv), beta and the decay a (one per value head) are projected from x; q, k, v pass a
  // causal depthwise conv of width gdn_conv_kernel_dim and SiLU, q and k an L2 norm; the chunked
  // delta rule mixes the tokens; the result passes a gated RMSNorm, norm(o) * silu(z), and
  // out_proj. The layer works on the sequence cut into n = S / C chunks of C = gdn_chunk_size
  // tokens ([batch, gdn_chunks, gdn_chunk, ...], reshapes at its ends), so that every matmul of
  // the chunked rule is an einsum. Per chunk and value head (value heads share their key head's
  // q and k; gdn_chunk indexes a chunk's rows, gdn_chunk_key its columns):
  //   A = (k.beta) k^T, decay- and strictly-lower-masked   [C x C]   2.C^2.dk
  //   U = A (v.beta),  W = A (k.beta.exp g)               (the WY/UT form; tpusim charges each as
  //                                                         the dense [C x C] product HF computes
  //                                                         after forming the inverse T)
  //                                                        2.C^2.dv + 2.C^2.dk
  //   S = k^T U                     the chunk's state      [dk x dv]  2.C.dk.dv
  //   V = U - W S                   the new values                    2.C.dk.dv
  //   P = (q.exp g) k^T, causal and decay-masked                      2.C^2.dk
  //   O = (q.exp g) S + P V                                           2.C.dk.dv + 2.C^2.dv
  // i.e. 2.C.(3.dk + 2.dv) + 6.dk.dv FLOPs per token and value head, the count
  // model/flops_maxtext.cpp charges (derived, not MaxText's formula). Written as one op per
  // matmul over all chunks at once, the per-chunk states are computed from U instead of from
  // the previous chunk's V: the same shapes, FLOPs and memory, without the scan's sequential
  // dependency (the executed math is not the recurrence; tpusim train refuses this block).
  // Stand-ins, each the same kind of work as what it replaces: the conv and SiLU as one SiLU
  // (the conv's K.(2.Hk.dk + Hv.dv) weights are left out: 0.002% of qwen3-next-80b-a3b's
  // parameters), the L2 norms as RMSNorms (with a [dk] scale), the decay
  // -exp(A_log).softplus(a + dt_bias) and its cumulative sum within the chunk as
  // sigmoid(a + dt_bias) (A_log left out), exp(g) and the masks as products with it.
  TensorId build_gated_delta_net(int region, TensorId x) {
    const int64_t key_heads = dims_.gdn_num_key_heads;
    const int64_t group = dims_.gdn_num_value_heads / key_heads;
    const int64_t chunk = dims_.gdn_chunk_size;
    const Dim batch = act("batch", batch_, batch_logical_);
    const Dim chunks = act("gdn_chunks", length_ / chunk, "activation_length");
    const Dim row = act("gdn_chunk", chunk, "");
    const Dim column = act("gdn_chunk_key", chunk, "");
    const Dim heads = act("gdn_heads", key_heads, "activation_heads");
    const Dim groups = act("gdn_group", group, "");
    const Dim key_dim = act("gdn_key_dim", dims_.gdn_key_head_dim, "");
    const Dim value_dim = act("gdn_value_dim", dims_.gdn_value_head_dim, "");
    const Dim embed = act("embed", dims_.emb_dim, "activation_embed");
    // [batch, gdn_chunks, position, rest...]
    auto chunked = [&](const Dim& position, std::vector<Dim> rest) {
      std::vector<Dim> out = {batch, chunks, position};
      out.insert(out.end(), rest.begin(), rest.end());
      return out;
    };
    const TensorId xc = reshape("gdn/chunked_input", x, chunked(row, {embed}), region);
    // The projections (MaxText in_proj_qkvz and in_proj_ba, kernel axes (embed, gdn_head)).
    auto project = [&](const std::string& name, std::vector<Dim> features) {
      std::vector<Dim> w_dims = {Dim{"embed", dims_.emb_dim, "embed"}};
      for (const Dim& feature : features) {
        w_dims.emplace_back(feature.name, feature.size,
                            feature.name == "gdn_heads" ? "gdn_head" : "");
      }
      const TensorId w = weight("gdn/" + name, w_dims, region, dense(dims_.emb_dim));
      return einsum("gdn/" + name, xc, w, {"embed"}, chunked(row, std::move(features)), region);
    };
    TensorId query = project("query", {heads, key_dim});
    TensorId key = project("key", {heads, key_dim});
    TensorId value = project("value", {heads, groups, value_dim});
    const TensorId z = project("output_gate", {heads, groups, value_dim});
    const TensorId beta_logit = project("beta", {heads, groups});
    const TensorId decay_logit = project("decay", {heads, groups});
    query = elementwise("gdn/query_conv_silu", ElementwiseFn::kSilu, {query}, region);
    key = elementwise("gdn/key_conv_silu", ElementwiseFn::kSilu, {key}, region);
    value = elementwise("gdn/value_conv_silu", ElementwiseFn::kSilu, {value}, region);
    if (config_.get_bool("use_qk_norm_in_gdn")) {
      query = norm("gdn/query_l2norm", query, region);
      key = norm("gdn/key_l2norm", key, region);
    }
    const TensorId beta = elementwise("gdn/beta", ElementwiseFn::kSigmoid, {beta_logit}, region);
    // Hugging Face initializes dt_bias to ones.
    const TensorId dt_bias = parameter_tensor(
        "gdn/dt_bias", {Dim{"gdn_heads", key_heads, "gdn_head"}, Dim{"gdn_group", group, ""}},
        region, constant_init(1));
    const TensorId decay = elementwise(
        "gdn/decay", ElementwiseFn::kSigmoid,
        {elementwise("gdn/decay_bias", ElementwiseFn::kAdd, {decay_logit, dt_bias}, region)},
        region);
    const std::vector<Dim> key_per_value_head = chunked(row, {heads, groups, key_dim});
    const TensorId key_beta = elementwise_to("gdn/key_beta", ElementwiseFn::kMul, {key, beta},
                                             key_per_value_head, region);
    const TensorId value_beta =
        elementwise("gdn/value_beta", ElementwiseFn::kMul, {value, beta}, region);
    const TensorId key_beta_decayed =
        elementwise("gdn/key_beta_decayed", ElementwiseFn::kMul, {key_beta, decay}, region);
    const TensorId query_decayed = elementwise_to("gdn/query_decayed", ElementwiseFn::kMul,
                                                  {query, decay}, key_per_value_head, region);
    // The same tokens as the columns of a chunk's [C x C] matrices.
    const TensorId key_columns =
        reshape("gdn/key_columns", key, chunked(column, {heads, key_dim}), region);
    const TensorId value_beta_columns = reshape(
        "gdn/value_beta_columns", value_beta, chunked(column, {heads, groups, value_dim}), region);
    const TensorId key_beta_decayed_columns =
        reshape("gdn/key_beta_decayed_columns", key_beta_decayed,
                chunked(column, {heads, groups, key_dim}), region);
    const std::vector<Dim> square = chunked(row, {heads, groups, column});
    const std::vector<Dim> values = chunked(row, {heads, groups, value_dim});
    TensorId key_key =
        einsum("gdn/key_key", key_beta, key_columns, {"gdn_key_dim"}, square, region);
    key_key = elementwise("gdn/key_key_masked", ElementwiseFn::kMul, {key_key, decay}, region);
    const TensorId solved_values =
        einsum("gdn/solve_values", key_key, value_beta_columns, {"gdn_chunk_key"}, values, region);
    const TensorId solved_keys = einsum("gdn/solve_keys", key_key, key_beta_decayed_columns,
                                        {"gdn_chunk_key"}, key_per_value_head, region);
    const TensorId state = einsum("gdn/state", key, solved_values, {"gdn_chunk"},
                                  {batch, chunks, heads, groups, key_dim, value_dim}, region);
    const TensorId state_values =
        einsum("gdn/state_values", solved_keys, state, {"gdn_key_dim"}, values, region);
    const TensorId new_values =
        elementwise("gdn/new_values", ElementwiseFn::kAdd, {solved_values, state_values}, region);
    const TensorId new_value_columns = reshape("gdn/new_value_columns", new_values,
                                               chunked(column, {heads, groups, value_dim}), region);
    TensorId scores =
        einsum("gdn/query_key", query_decayed, key_columns, {"gdn_key_dim"}, square, region);
    scores = elementwise("gdn/query_key_masked", ElementwiseFn::kMul, {scores, decay}, region);
    const TensorId from_state =
        einsum("gdn/state_output", query_decayed, state, {"gdn_key_dim"}, values, region);
    const TensorId from_chunk =
        einsum("gdn/chunk_output", scores, new_value_columns, {"gdn_chunk_key"}, values, region);
    TensorId out = elementwise("gdn/output", ElementwiseFn::kAdd, {from_state, from_chunk}, region);
    // The gated RMSNorm (Qwen3NextRMSNormGated): norm over dv, times silu(z).
    out = norm("gdn/output_norm", out, region);
    out = elementwise("gdn/output_gated", ElementwiseFn::kMul,
                      {out, elementwise("gdn/output_gate_silu", ElementwiseFn::kSilu, {z}, region)},
                      region);
    const TensorId w_out = weight(
        "gdn/out",
        {Dim{"gdn_heads", key_heads, "gdn_head"}, Dim{"gdn_group", group, ""},
         Dim{"gdn_value_dim", dims_.gdn_value_head_dim, ""}, Dim{"embed", dims_.emb_dim, "embed"}},
        region, dense(dims_.gdn_num_value_heads * dims_.gdn_value_head_dim));
    const TensorId projected =
        einsum("gdn/out", out, w_out, {"gdn_heads", "gdn_group", "gdn_value_dim"},
               chunked(row, {embed}), region);
    return reshape("gdn/layer_output", projected, activation_dims(), region);
  }

  // Gated MLP: activations[0](x W_0) * activations[1](x W_1) ... then W_out; one activation =
  // plain.
  TensorId build_mlp(const std::string& prefix, int region, TensorId x, int64_t mlp_dim,
                     const std::string& experts_prefix = "", const Ragged& ragged = {}) {
    const bool moe = !experts_prefix.empty();
    const std::vector<Dim> in_dims = graph().tensor(x).dims;
    std::vector<Dim> weight_lead;
    if (moe) {
      weight_lead.emplace_back("experts", dims_.num_experts, "exp");
    }
    const std::string embed_logical = moe ? "embed_moe" : "embed";
    const std::string mlp_logical = moe ? "mlp_moe" : "mlp";
    const std::string remat_prefix = moe ? "moe_mlpwi" : "mlpwi";
    std::vector<Dim> hidden_dims = with_last(in_dims, {act("mlp", mlp_dim, "activation_mlp")});
    // Fan-in: the contracted axis (embed for wi, mlp for wo). MaxText's routed experts pass
    // in_axis=0 (experts), out_axis=1 to the initializer of their [experts, a, b] kernels, so jax
    // takes fan-in = experts x b: experts x mlp for wi, experts x embed for wo.
    const int64_t wi_fan_in = moe ? dims_.num_experts * mlp_dim : dims_.emb_dim;
    const int64_t wo_fan_in = moe ? dims_.num_experts * dims_.emb_dim : mlp_dim;
    TensorId gated = -1;
    const auto& activations = dims_.mlp_activations;
    for (size_t index = 0; index < activations.size(); ++index) {
      std::vector<Dim> w_dims = weight_lead;
      w_dims.emplace_back("embed", dims_.emb_dim, embed_logical);
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
      }
      gated = gated < 0
                  ? hidden
                  : elementwise(prefix + "/gate", ElementwiseFn::kMul, {gated, hidden}, region);
    }
    std::vector<Dim> wo_dims = weight_lead;
    wo_dims.emplace_back("mlp", mlp_dim, mlp_logical);
    wo_dims.emplace_back("embed", dims_.emb_dim, embed_logical);
    const TensorId wo = weight(prefix + "/wo", wo_dims, region, dense(wo_fan_in));
    return einsum(prefix + "/wo", gated, wo, {"mlp"}, in_dims, region, moe ? "moe_mlpwo" : "mlpwo",
                  ragged);
  }

  // Routed experts (top-k of num_experts) plus shared experts. With sparse_matmul=false and
  // capacity_factor > 0 each expert gets capacity_factor x B*S*k/E slots and drops the choices
  // beyond them. Otherwise routing is dropless: the E x ceil(B*S*k/E) rows hold all B*S*k token
  // choices sorted by expert, however unbalanced (row_experts says whose each row is; the
  // partitioner enlarges the rows under expert parallelism, see sharding/partitioner.h).
  TensorId build_moe(int region, TensorId x) {
    const int64_t experts = dims_.num_experts;
    const int64_t top_k = dims_.num_experts_per_tok;
    const TensorId w_gate =
        weight("moe/gate", {Dim{"embed", dims_.emb_dim, "embed"}, Dim{"experts", experts, "exp"}},
               region, dense(dims_.emb_dim));
    const TensorId router_logits =
        einsum("moe/router", x, w_gate, {"embed"},
               with_last(activation_dims(), {act("experts", experts, "activation_exp")}), region);
    const TensorId routing = activation(
        "moe/routing", with_last(activation_dims(), {act("top_k", top_k, ""), act("route", 2, "")}),
        region);
    OpAttrs router_attrs;
    router_attrs.top_k = top_k;
    graph().add_op(OpKind::kMoeRouter, "moe/router_top_k", {router_logits}, {routing}, router_attrs,
                   region);
    const double tokens = static_cast<double>(batch_ * length_);
    const double capacity_factor = config_.get_float("capacity_factor");
    const bool padded = !config_.get_bool("sparse_matmul") && capacity_factor > 0;
    const double per_expert = tokens * static_cast<double>(top_k) / static_cast<double>(experts) *
                              (padded ? capacity_factor : 1.0);
    const auto expert_tokens = static_cast<int64_t>(std::ceil(per_expert));
    const std::vector<Dim> grouped_dims = {
        act("experts", experts, "activation_exp"),
        act("expert_tokens", expert_tokens, "activation_batch_no_exp+activation_length"),
        act("embed", dims_.emb_dim, "activation_embed")};
    const TensorId grouped = activation("moe/dispatched", grouped_dims, region);
    OpAttrs dispatch_attrs;
    dispatch_attrs.top_k = top_k;
    dispatch_attrs.capacity_factor = padded ? capacity_factor : 0.0;
    dispatch_attrs.ragged_buffer_factor = config_.get_float("ragged_buffer_factor");
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
    TensorId combined = activation("moe/combined", activation_dims(), region);
    graph().add_op(OpKind::kMoeCombine, "moe/combine", {expert_out, routing}, {combined},
                   dispatch_attrs, region);
    if (dims_.has_shared_experts()) {
      TensorId shared =
          build_mlp("moe/shared", region, x, dims_.shared_expert_mlp_dim() * dims_.shared_experts);
      if (dims_.is_gated_delta_net_block()) {
        // Qwen3-Next's shared expert is gated per token (Hugging Face Qwen3NextSparseMoeBlock:
        // sigmoid(shared_expert_gate(x)) * shared_expert(x), shared_expert_gate: D -> 1).
        const TensorId w_shared_gate =
            weight("moe/shared_gate", {Dim{"embed", dims_.emb_dim, "embed"}}, region,
                   dense(dims_.emb_dim));
        TensorId gate =
            einsum("moe/shared_gate", x, w_shared_gate, {"embed"}, token_dims(), region);
        gate = elementwise("moe/shared_gate_sigmoid", ElementwiseFn::kSigmoid, {gate}, region);
        shared = elementwise("moe/shared_gated", ElementwiseFn::kMul, {shared, gate}, region);
      }
      combined = elementwise("moe/add_shared", ElementwiseFn::kAdd, {combined, shared}, region);
    }
    return combined;
  }

  // The final norm, logits and loss. With num_vocab_tiling = T > 1 (MaxText's chunked
  // cross-entropy) the head is a region repeated T times over 1/T of the tokens each.
  void build_head() {
    const int64_t chunks = config_.get_int("num_vocab_tiling");
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
    const TensorId input = graph().add_tensor("head/input", activation_dims(), activation_dtype_,
                                              TensorKind::kActivation, region);
    result_.head_input = input;
    graph().add_carry(
        result_.layer_outputs.empty() ? result_.embed_output : result_.layer_outputs.back(), input);
    const TensorId normed = norm("final_norm", input, region);
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
      loss_attrs.logit_soft_cap = config_.get_float("final_logits_soft_cap");
      loss_attrs.logit_multiplier = config_.get_bool("normalize_embedding_logits")
                                        ? 1.0 / std::sqrt(static_cast<double>(dims_.emb_dim))
                                        : 1.0;
    }
    graph().add_op(OpKind::kCrossEntropy, "cross_entropy", {logits, targets}, {loss}, loss_attrs,
                   region);
    result_.loss = loss;
    length_ = full_length;
  }

  const Config& config_;
  ModelDims dims_;
  int64_t batch_;
  int64_t length_;
  DType activation_dtype_;
  DType weight_dtype_;
  std::string block_;
  PipelineSchedule pipeline_;
  // The batch dim's logical axis: the layers' (activation_batch), or outside a pipeline's layers
  // MaxText's activation_embed_and_logits_batch, which also shards over the stages.
  std::string batch_logical_ = "activation_batch";
  TensorId tokens_ = -1;
  TensorId table_ = -1;
  ForwardGraph result_;
};

}  // namespace

ForwardGraph build_forward(const Config& config, int64_t batch) {
  if (batch < 1) {
    throw UserError(
        "the global batch must hold at least one sequence (per_device_batch_size x "
        "devices = " +
        std::to_string(batch) + ")");
  }
  return ForwardBuilder(config, batch).build();
}

}  // namespace tpusim
