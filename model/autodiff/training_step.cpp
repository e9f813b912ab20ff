#include "model/autodiff/training_step.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "model/builder/build_options.h"
#include "model/config.h"
#include "model/decoder_family.h"

namespace tpusim {
namespace {

// Dims in `a` or `b` that are not in `out`: what an einsum producing `out` from a and b contracts.
std::vector<std::string> contracted_for(const Tensor& a, const Tensor& b, const Tensor& out) {
  std::vector<std::string> result;
  for (const Tensor* tensor : {&a, &b}) {
    for (const Dim& dim : tensor->dims) {
      const bool in_out = out.dim_index(dim.name) >= 0;
      const bool seen = std::find(result.begin(), result.end(), dim.name) != result.end();
      if (!in_out && !seen) {
        result.push_back(dim.name);
      }
    }
  }
  return result;
}

// Tensor -> tensor associations of the builder (gradients, rematerialized copies) as a vector
// indexed by tensor id: the graph's ids are dense, and -1 means none.
class TensorMap {
 public:
  TensorId find(TensorId key) const {
    const auto slot = static_cast<size_t>(key);
    return slot < values_.size() ? values_[slot] : -1;
  }
  TensorId at(TensorId key) const {
    const TensorId value = find(key);
    if (value < 0) {
      throw std::out_of_range("no tensor mapped from tensor " + std::to_string(key));
    }
    return value;
  }
  void set(TensorId key, TensorId value) {
    const auto slot = static_cast<size_t>(key);
    if (slot >= values_.size()) {
      values_.resize(slot + 1, -1);
    }
    values_[slot] = value;
  }
  void clear() { std::fill(values_.begin(), values_.end(), -1); }
  std::map<TensorId, TensorId> to_map() const {
    std::map<TensorId, TensorId> result;
    for (size_t key = 0; key < values_.size(); ++key) {
      if (values_[key] >= 0) {
        result.emplace_hint(result.end(), static_cast<TensorId>(key), values_[key]);
      }
    }
    return result;
  }

 private:
  std::vector<TensorId> values_;
};

// The dtypes of the optimizer's state: gradients (grad_dtype) and Adam's moments (mu_dtype, else
// weight_dtype).
struct OptimizerDTypes {
  DType gradient;
  DType moment;
};

OptimizerDTypes optimizer_dtypes_from_config(const Config& config) {
  const DType gradient = parse_dtype(config.get_string("grad_dtype"), "grad_dtype");
  const DType moment = config.get_string("mu_dtype").empty()
                           ? parse_dtype(config.get_string("weight_dtype"), "weight_dtype")
                           : parse_dtype(config.get_string("mu_dtype"), "mu_dtype");
  return {gradient, moment};
}

// MaxText's auxiliary-loss-free balancing (routed_bias_update_rate > 0, train.py after the
// optimizer step; docs/reference/deepseek4.md section 6): built for deepseek4's biased routers,
// like its load-balance loss (the other families' routers keep their program).
bool bias_balance_from_config(const Config& config) {
  const DecoderBlock block = parse_decoder_block(config.get_string("decoder_block"));
  return routed_bias_update_rate_from_config(config) > 0 && block == DecoderBlock::kDeepseek4;
}

class BackwardBuilder {
 public:
  BackwardBuilder(const Config& config, ForwardGraph forward)
      : forward_(std::move(forward)),
        graph_(forward_.graph),
        policy_(RematPolicy::from_config(config)),
        dtypes_(optimizer_dtypes_from_config(config)),
        balance_biases_(bias_balance_from_config(config)) {}

  TrainingStep build() {
    TrainingStep step;
    const std::vector<int> forward_order = forward_region_order();
    TensorId incoming = -1;  // gradient of the current region's output, from the region after it
    for (auto it = forward_order.rbegin(); it != forward_order.rend(); ++it) {
      incoming = differentiate_region(*it, incoming, step);
    }
    build_optimizer(step);
    step.parameter_grads = parameter_grads_.to_map();
    step.saved = std::move(saved_);
    step.graph = std::move(graph_);
    step.forward_info = std::move(forward_);
    step.forward_info.graph = Graph();
    return step;
  }

 private:
  std::vector<int> forward_region_order() const {
    std::vector<int> order = {forward_.embed_region};
    order.insert(order.end(), forward_.layer_regions.begin(), forward_.layer_regions.end());
    order.push_back(forward_.head_region);
    return order;
  }

  bool is_layer_region(int region) const {
    return std::find(forward_.layer_regions.begin(), forward_.layer_regions.end(), region) !=
           forward_.layer_regions.end();
  }

  // The carry input and output of a forward region.
  std::pair<TensorId, TensorId> region_io(int region) const {
    if (region == forward_.embed_region) {
      return {-1, forward_.embed_output};
    }
    if (region == forward_.head_region) {
      return {forward_.head_input, forward_.loss};
    }
    for (size_t index = 0; index < forward_.layer_regions.size(); ++index) {
      if (forward_.layer_regions[index] == region) {
        return {forward_.layer_inputs[index], forward_.layer_outputs[index]};
      }
    }
    throw std::logic_error("unknown forward region");
  }

  // A weight as a matmul reads it: a parameter, or a parameter cast to the compute dtype.
  bool is_weight(const Tensor& tensor) const {
    if (tensor.kind == TensorKind::kParameter) {
      return true;
    }
    const int producer = graph_.producer(tensor.id);
    if (producer < 0) {
      return false;
    }
    const Op& op = graph_.ops()[static_cast<size_t>(producer)];
    return op.kind == OpKind::kElementwise && op.attrs.function == ElementwiseFn::kCast &&
           graph_.tensor(op.inputs[0]).kind == TensorKind::kParameter;
  }

  TensorId new_grad(const Tensor& of, int region, const std::string& suffix = "/grad") {
    const bool parameter = of.kind == TensorKind::kParameter;
    const DType dtype = parameter ? dtypes_.gradient : of.dtype;
    // The gradient of a cast weight is a parameter gradient too (in the compute dtype).
    const TensorKind kind = is_weight(of) ? TensorKind::kParameterGrad : TensorKind::kGradient;
    return graph_.add_tensor(of.name + suffix, of.dims, dtype, kind, region);
  }

  // Adds `contribution` to the gradient of forward tensor `of` (summing fan-out).
  void accumulate(TensorId of, TensorId contribution, int region) {
    auto& grads = graph_.tensor(of).kind == TensorKind::kParameter ? parameter_grads_ : grads_;
    const TensorId found = grads.find(of);
    if (found < 0) {
      grads.set(of, contribution);
      return;
    }
    const TensorId sum = new_grad(graph_.tensor(of), region, "/grad_sum");
    OpAttrs attrs;
    attrs.function = ElementwiseFn::kAdd;
    graph_.add_op(OpKind::kElementwise, graph_.tensor(of).name + "/grad_sum", {found, contribution},
                  {sum}, attrs, region);
    grads.set(of, sum);
  }

  // The forward tensor `id` as `region` reads it without recomputing anything: a parameter or
  // input itself, or its saved, reloaded or recomputed copy; -1 when none exists yet.
  TensorId ready(TensorId id) const {
    const TensorKind kind = graph_.tensor(id).kind;
    if (kind == TensorKind::kParameter || kind == TensorKind::kInput) {
      return id;
    }
    return materialized_.find(id);
  }

  // Whether the backward pass keeps `id` on the device, offloads it or recomputes it.
  RematDecision decision_for(TensorId id) const {
    const int forward_region = graph_.tensor(id).region;
    const bool carry = id == region_io(forward_region).first;
    if (is_layer_region(forward_region)) {
      return policy_.decision(carry ? "decoder_layer_input" : graph_.tensor(id).remat_name);
    }
    if (forward_region == forward_.head_region && forward_.head_chunks > 1) {
      // Chunked cross-entropy recomputes each chunk's logits in backward (MaxText's custom VJP).
      return carry ? RematDecision::kDevice : RematDecision::kRemat;
    }
    return RematDecision::kDevice;
  }

  // The forward tensor `id` as the backward region `region` can read it. A rematerialized tensor
  // is recomputed from its producer's inputs, which may need recomputing in turn: the walk keeps
  // its own stack (a chain of 20,000 gated MLP branches overflowed the call stack as recursion)
  // and visits the inputs in order, depth first, as the recursion did, so ops come out the same.
  TensorId available(TensorId id, int region) {
    std::vector<TensorId> pending = {id};
    while (!pending.empty()) {
      const TensorId top = pending.back();
      if (ready(top) >= 0) {
        pending.pop_back();
        continue;
      }
      const RematDecision decision = decision_for(top);
      if (decision != RematDecision::kRemat) {
        materialized_.set(top, keep(top, decision, region));
        pending.pop_back();
        continue;
      }
      const int producer = graph_.producer(top);
      if (producer < 0) {
        throw std::logic_error("cannot recompute '" + graph_.tensor(top).name + "': no producer");
      }
      const Op& op = graph_.ops()[static_cast<size_t>(producer)];  // stays valid (a deque)
      const auto missing = std::find_if(op.inputs.begin(), op.inputs.end(),
                                        [&](TensorId input) { return ready(input) < 0; });
      if (missing != op.inputs.end()) {
        pending.push_back(*missing);  // this op is looked at again once that input is ready
        continue;
      }
      recompute(op, region);
      pending.pop_back();
    }
    return ready(id);
  }

  // A tensor the backward pass keeps (on the device, or offloaded to the host and reloaded in
  // `region`), as `region` reads it.
  TensorId keep(TensorId id, RematDecision decision, int region) {
    saved_[id] = decision;
    if (decision != RematDecision::kOffload) {
      return id;
    }
    // The graph keeps tensors in a deque: adding tensors below leaves this reference valid.
    const Tensor& tensor = graph_.tensor(id);
    const int forward_region = tensor.region;
    const TensorId on_host = graph_.add_tensor(tensor.name + "/host", tensor.dims, tensor.dtype,
                                               TensorKind::kActivation, forward_region);
    graph_.add_op(OpKind::kHostOffload, tensor.name + "/offload", {id}, {on_host}, {},
                  forward_region);
    const TensorId reloaded = graph_.add_tensor(tensor.name + "/reloaded", tensor.dims,
                                                tensor.dtype, TensorKind::kActivation, region);
    graph_.add_op(OpKind::kHostLoad, tensor.name + "/reload", {on_host}, {reloaded}, {}, region);
    return reloaded;
  }

  // Clones forward op `op`, whose inputs are all ready, into the backward region; its outputs'
  // copies become what the region reads for them.
  void recompute(const Op& op, int region) {
    std::vector<TensorId> inputs;
    for (const TensorId input : op.inputs) {
      inputs.push_back(ready(input));
    }
    std::vector<TensorId> outputs;
    for (const TensorId output : op.outputs) {
      const Tensor& original = graph_.tensor(output);
      const TensorId copy =
          graph_.add_tensor(original.name + "/remat", original.dims, original.dtype, original.kind,
                            region, original.remat_name);
      outputs.push_back(copy);
      materialized_.set(output, copy);
    }
    const int clone = graph_.add_op(op.kind, op.name, inputs, outputs, op.attrs, region);
    graph_.mutable_op(clone).phase = Phase::kRecompute;
  }

  void emit_einsum_grad(const Op& op, TensorId grad_out, int region) {
    const TensorId lhs = op.inputs[0];
    const TensorId rhs = op.inputs[1];
    const Tensor& out = graph_.tensor(op.outputs[0]);
    for (const auto& [target, other] : {std::pair{lhs, rhs}, std::pair{rhs, lhs}}) {
      const Tensor& target_tensor = graph_.tensor(target);
      if (target_tensor.kind == TensorKind::kInput) {
        continue;
      }
      const TensorId grad = new_grad(target_tensor, region);
      OpAttrs attrs;
      attrs.contracted = contracted_for(out, graph_.tensor(other), graph_.tensor(grad));
      std::vector<TensorId> inputs = {grad_out, available(other, region)};
      if (op.inputs.size() == 3) {
        // A grouped matmul's VJPs are grouped matmuls over the same rows (model/ir/op.h).
        inputs.push_back(available(op.inputs[2], region));
        attrs.routed_fraction = op.attrs.routed_fraction;
      }
      graph_.add_op(OpKind::kEinsum, op.name + "/grad_" + target_tensor.name, inputs, {grad}, attrs,
                    region);
      accumulate(target, grad, region);
    }
  }

  TensorId simple_op(OpKind kind, const std::string& name, std::vector<TensorId> inputs,
                     const Tensor& grad_of, int region, OpAttrs attrs = {}) {
    const TensorId grad = new_grad(grad_of, region);
    graph_.add_op(kind, name, std::move(inputs), {grad}, std::move(attrs), region);
    return grad;
  }

  // The VJP of an elementwise op: a sum's inputs get dy (summed over the dims an input was
  // broadcast over), a product's each get dy times the other, a cast casts back, and an
  // activation applies its derivative kernel to (dy, x).
  void emit_elementwise_grad(const Op& op, TensorId dy, int region) {
    auto grad_name = [&op] { return op.name + "/grad"; };
    const ElementwiseFn fn = op.attrs.function;
    if (fn == ElementwiseFn::kAdd) {
      // An input broadcast over dims it lacks (a bias over the tokens) gets dy summed over
      // them.
      const Tensor& output = graph_.tensor(op.outputs[0]);
      for (const TensorId input : op.inputs) {
        OpAttrs attrs;
        for (const Dim& dim : output.dims) {
          if (graph_.tensor(input).dim_index(dim.name) < 0) {
            attrs.contracted.push_back(dim.name);
          }
        }
        accumulate(input,
                   attrs.contracted.empty() ? dy
                                            : simple_op(OpKind::kReduceSum, grad_name(), {dy},
                                                        graph_.tensor(input), region, attrs),
                   region);
      }
      return;
    }
    if (fn == ElementwiseFn::kCast || fn == ElementwiseFn::kReshape) {
      // A cast casts back; a reshape reshapes back to its input's dims.
      OpAttrs attrs;
      attrs.function = fn;
      const TensorId grad = simple_op(OpKind::kElementwise, grad_name(), {dy},
                                      graph_.tensor(op.inputs[0]), region, attrs);
      accumulate(op.inputs[0], grad, region);
      return;
    }
    if (fn == ElementwiseFn::kMul) {
      // A product clipping its second input b (model/ir/op.h activation_limit): a gets
      // dy clip(b), b gets dy a [|b| < L], which reads b as well.
      const double limit = op.attrs.activation_limit;
      for (size_t index = 0; index < 2; ++index) {
        OpAttrs attrs;
        attrs.function = ElementwiseFn::kMul;
        attrs.activation_limit = limit;
        std::vector<TensorId> inputs = {dy, available(op.inputs[1 - index], region)};
        if (limit > 0 && index == 1) {
          inputs.push_back(available(op.inputs[1], region));
        }
        const TensorId grad = simple_op(OpKind::kElementwise, grad_name(), std::move(inputs),
                                        graph_.tensor(op.inputs[index]), region, attrs);
        accumulate(op.inputs[index], grad, region);
      }
      return;
    }
    OpAttrs attrs;
    attrs.activation_limit = op.attrs.activation_limit;  // kSilu's clip, for kSiluGrad
    attrs.function = fn == ElementwiseFn::kSilu      ? ElementwiseFn::kSiluGrad
                     : fn == ElementwiseFn::kRelu    ? ElementwiseFn::kReluGrad
                     : fn == ElementwiseFn::kSigmoid ? ElementwiseFn::kSigmoidGrad
                     : fn == ElementwiseFn::kGelu    ? ElementwiseFn::kGeluGrad
                                                     : fn;
    const TensorId grad =
        simple_op(OpKind::kElementwise, grad_name(), {dy, available(op.inputs[0], region)},
                  graph_.tensor(op.inputs[0]), region, attrs);
    accumulate(op.inputs[0], grad, region);
    return;
  }

  // A VJP op `kind` of (dy, op's inputs) giving every input's gradient: a norm's (x and its scale
  // and bias) and the router's (its logits and, with routed_bias, its bias, which only picks the
  // experts: the op reads it to pick the same ones and sums its gradient over the tokens).
  // `extra` (>= 0): one more input the VJP reads without giving it a gradient (a router's
  // per-sequence choice counts, for its load-balance loss); `extra_output` (>= 0): one more output
  // it writes (a biased router's choices per expert, for the bias's update after the optimizer).
  void emit_with_input_grads(OpKind kind, const Op& op, TensorId dy, int region,
                             TensorId extra = -1, TensorId extra_output = -1) {
    std::vector<TensorId> inputs = {dy};
    std::vector<TensorId> outputs;
    for (const TensorId input : op.inputs) {
      inputs.push_back(available(input, region));
      outputs.push_back(new_grad(graph_.tensor(input), region));
    }
    if (extra >= 0) {
      inputs.push_back(available(extra, region));
    }
    if (extra_output >= 0) {
      outputs.push_back(extra_output);
    }
    graph_.add_op(kind, op.name + "/grad", inputs, outputs, op.attrs, region);
    for (size_t index = 0; index < op.inputs.size(); ++index) {
      accumulate(op.inputs[index], outputs[index], region);
    }
  }

  // A router with MaxText's load-balance loss (OpAttrs::load_balance_scale): the choices of each
  // expert summed over each sequence (the kReduceSum of its one-hot output, model/builder/
  // feed_forward_block.cpp), whose product with d p the router's VJP adds; -1 without the loss.
  TensorId load_balance_counts(const Op& router) const {
    if (router.attrs.load_balance_scale <= 0) {
      return -1;
    }
    for (const Op& op : graph_.ops()) {
      if (op.kind == OpKind::kReduceSum && op.region == router.region &&
          op.inputs[0] == router.outputs.at(2)) {
        return op.outputs[0];
      }
    }
    throw std::logic_error("router '" + router.name + "' has no load-balance counts");
  }

  // With MaxText's routed_bias_update_rate (balance_biases_), a biased router's VJP also counts
  // the choices of each expert over the tokens it routes: load [experts], completed over the
  // devices that split them like the bias's gradient (sharding/partitioner.cpp), summed over the
  // microbatches (sim/functional/executor.cpp) and read by the bias's optimizer update, which adds
  // rate x sign(mean load - load) after AdamW. -1 for a router without a bias or without the rate.
  TensorId bias_load(const Op& router, int region) {
    if (!balance_biases_ || router.inputs.size() < 2) {
      return -1;
    }
    const Tensor& bias = graph_.tensor(router.inputs[1]);
    const TensorId load = graph_.add_tensor(bias.name + "/load", bias.dims, DType::kF32,
                                            TensorKind::kActivation, region);
    bias_loads_.set(router.inputs[1], load);
    return load;
  }

  // The attention's gradient op reads dy, every input and the output, and gives every input
  // (query, key, value, and the sinks or compressed blocks when present) its gradient, but CSA's
  // block selection (attrs.block_topk, the last input: top-k indices carry none).
  void emit_attention_grad(const Op& op, TensorId dy, int region) {
    std::vector<TensorId> inputs = {dy};
    std::vector<TensorId> outputs;
    const size_t differentiable = op.inputs.size() - (op.attrs.block_topk > 0 ? 1 : 0);
    for (size_t index = 0; index < op.inputs.size(); ++index) {
      inputs.push_back(available(op.inputs[index], region));
      if (index < differentiable) {
        outputs.push_back(new_grad(graph_.tensor(op.inputs[index]), region));
      }
    }
    inputs.push_back(available(op.outputs[0], region));
    graph_.add_op(OpKind::kAttentionGrad, op.name + "/grad", inputs, outputs, op.attrs, region);
    for (size_t index = 0; index < differentiable; ++index) {
      accumulate(op.inputs[index], outputs[index], region);
    }
  }

  void emit_vjp(const Op& op, int region) {
    std::vector<TensorId> grad_outs;
    bool any = false;
    for (const TensorId output : op.outputs) {
      const TensorId grad = grads_.find(output);
      grad_outs.push_back(grad);
      any = any || grad >= 0;
    }
    if (!any) {
      return;
    }
    const TensorId dy = grad_outs[0];
    auto grad_name = [&op] { return op.name + "/grad"; };
    switch (op.kind) {
      case OpKind::kEinsum:
        emit_einsum_grad(op, dy, region);
        return;
      case OpKind::kElementwise:
        emit_elementwise_grad(op, dy, region);
        return;
      case OpKind::kRmsNorm:
      case OpKind::kLayerNorm:
        emit_with_input_grads(OpKind::kNormGrad, op, dy, region);
        return;
      case OpKind::kRope: {
        const TensorId grad = simple_op(OpKind::kRope, grad_name(), {dy},
                                        graph_.tensor(op.inputs[0]), region, op.attrs);
        accumulate(op.inputs[0], grad, region);
        return;
      }
      case OpKind::kAttention:
        emit_attention_grad(op, dy, region);
        return;
      case OpKind::kEmbeddingLookup: {
        const TensorId grad = simple_op(OpKind::kEmbeddingGrad, grad_name(), {dy, op.inputs[0]},
                                        graph_.tensor(op.inputs[1]), region, op.attrs);
        accumulate(op.inputs[1], grad, region);
        return;
      }
      case OpKind::kCrossEntropy: {
        const TensorId grad = simple_op(OpKind::kCrossEntropyGrad, grad_name(),
                                        {available(op.inputs[0], region), op.inputs[1]},
                                        graph_.tensor(op.inputs[0]), region, op.attrs);
        accumulate(op.inputs[0], grad, region);
        return;
      }
      case OpKind::kMoeDispatch: {
        // Gradient of a dispatch is a combine of the gradient (unweighted gather back).
        const TensorId grad =
            simple_op(OpKind::kMoeCombine, grad_name(), {dy, available(op.inputs[1], region)},
                      graph_.tensor(op.inputs[0]), region, op.attrs);
        accumulate(op.inputs[0], grad, region);
        return;
      }
      case OpKind::kMoeCombine: {
        const TensorId routing = available(op.inputs[1], region);
        const TensorId grad_experts = simple_op(OpKind::kMoeDispatch, grad_name(), {dy, routing},
                                                graph_.tensor(op.inputs[0]), region, op.attrs);
        accumulate(op.inputs[0], grad_experts, region);
        const TensorId grad_routing = simple_op(OpKind::kRouterGrad, op.name + "/grad_weights",
                                                {dy, available(op.inputs[0], region), routing},
                                                graph_.tensor(op.inputs[1]), region, op.attrs);
        accumulate(op.inputs[1], grad_routing, region);
        return;
      }
      case OpKind::kMoeRouter:
        emit_with_input_grads(OpKind::kRouterGrad, op, dy, region, load_balance_counts(op),
                              bias_load(op, region));
        return;
      case OpKind::kReduceSum: {
        // A forward sum over dims (mHC's streams): every summed element gets dy, broadcast back.
        OpAttrs attrs;
        attrs.function = ElementwiseFn::kAdd;
        const TensorId grad = simple_op(OpKind::kElementwise, grad_name(), {dy},
                                        graph_.tensor(op.inputs[0]), region, attrs);
        accumulate(op.inputs[0], grad, region);
        return;
      }
      case OpKind::kSinkhorn: {
        const TensorId grad =
            simple_op(OpKind::kSinkhornGrad, grad_name(), {dy, available(op.inputs[0], region)},
                      graph_.tensor(op.inputs[0]), region, op.attrs);
        accumulate(op.inputs[0], grad, region);
        return;
      }
      case OpKind::kBlockPool:
        emit_with_input_grads(OpKind::kBlockPoolGrad, op, dy, region);
        return;
      case OpKind::kHostOffload:
      case OpKind::kHostLoad:
        return;
      // No VJP: kinds that only backward, optimizer or partitioned programs hold.
      case OpKind::kNormGrad:
      case OpKind::kAttentionGrad:
      case OpKind::kEmbeddingGrad:
      case OpKind::kCrossEntropyGrad:
      case OpKind::kRouterGrad:
      case OpKind::kBlockPoolGrad:
      case OpKind::kBlockTopK:  // its selection gets no gradient (emit_attention_grad)
      case OpKind::kNormStatistics:
      case OpKind::kCrossEntropyStatistics:
      case OpKind::kDynamicSlice:
      case OpKind::kAdamUpdate:
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
      case OpKind::kAllReduce:
      case OpKind::kAllToAll:
      case OpKind::kCollectivePermute:
      case OpKind::kSinkhornGrad:
        break;
    }
    throw std::logic_error(std::string("no VJP for op kind ") + op_kind_name(op.kind));
  }

  // Emits the backward region of forward region `region`; returns the gradient of its input.
  TensorId differentiate_region(int region, TensorId incoming, TrainingStep& step) {
    const Region info = graph_.region(region);  // a copy: add_region may move the storage
    const int backward = graph_.add_region(info.name + "/grad", info.repeat, Phase::kBackward,
                                           region, info.shared_parameters);
    graph_.mutable_region(backward).pipeline = info.pipeline;
    step.backward_regions.push_back(backward);
    const auto [input, output] = region_io(region);
    materialized_.clear();
    if (region != forward_.head_region) {
      const Tensor& out = graph_.tensor(output);
      const TensorId seed = graph_.add_tensor(out.name + "/grad_in", out.dims, out.dtype,
                                              TensorKind::kGradient, backward);
      graph_.add_carry(incoming, seed);
      grads_.set(output, seed);
    } else {
      // d loss / d loss = 1: cross_entropy_grad produces the logits gradient directly.
      grads_.set(output, output);
    }
    // The graph keeps ops in a deque: the ops emitted below leave these pointers valid.
    std::vector<const Op*> ops;
    for (const Op& op : graph_.ops()) {
      if (op.region == region) {
        ops.push_back(&op);
      }
    }
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      emit_vjp(**it, backward);
    }
    if (input < 0) {
      return -1;
    }
    const TensorId grad_input = grads_.at(input);
    // Scanned layers hand the input gradient to the previous layer's iteration; the chunks of a
    // tiled head are independent (each writes its part of the input gradient).
    if (info.repeat > 1 && !info.shared_parameters) {
      graph_.add_carry(grad_input, grads_.at(output));
    }
    return grad_input;
  }

  void build_optimizer(TrainingStep& step) {
    std::map<int, int> optimizer_region_for;
    // The tensors before the optimizer's own (a deque: references stay valid as it grows).
    const size_t tensors = graph_.tensors().size();
    for (size_t index = 0; index < tensors; ++index) {
      const Tensor& parameter = graph_.tensors()[index];
      if (parameter.kind != TensorKind::kParameter) {
        continue;
      }
      const TensorId grad = parameter_grads_.find(parameter.id);
      if (grad < 0) {
        // No gradient reaches it (DeepSeek-V4's indexer, whose scores end in top-k indices):
        // MaxText's optimizer still holds its Adam moments (zero gradients each step), so they
        // are kept as state no op reads.
        for (const char* moment : {"/mu", "/nu"}) {
          graph_.add_tensor(parameter.name + moment, parameter.dims, dtypes_.moment,
                            TensorKind::kOptimizerState, parameter.region);
        }
        continue;
      }
      if (!optimizer_region_for.contains(parameter.region)) {
        const Region& owner = graph_.region(parameter.region);
        optimizer_region_for[parameter.region] = graph_.add_region(
            "optimizer/" + owner.name, owner.parameter_sets(), Phase::kOptimizer, parameter.region);
        step.optimizer_regions.push_back(optimizer_region_for[parameter.region]);
      }
      const int region = optimizer_region_for[parameter.region];
      std::vector<TensorId> outputs;
      std::vector<TensorId> inputs = {parameter.id, grad};
      for (const char* moment : {"/mu", "/nu"}) {
        inputs.push_back(graph_.add_tensor(parameter.name + moment, parameter.dims, dtypes_.moment,
                                           TensorKind::kOptimizerState, parameter.region));
      }
      // A router bias with routed_bias_update_rate: its step's expert loads, for the update
      // after AdamW (sim/functional/kernels/optimizer.cpp).
      if (const TensorId load = bias_loads_.find(parameter.id); load >= 0) {
        inputs.push_back(load);
      }
      for (const TensorId state : {parameter.id, inputs[2], inputs[3]}) {
        const Tensor& tensor = graph_.tensor(state);
        outputs.push_back(graph_.add_tensor(tensor.name + "/new", tensor.dims, tensor.dtype,
                                            tensor.kind, region));
      }
      graph_.add_op(OpKind::kAdamUpdate, parameter.name + "/adamw", inputs, outputs, {}, region);
    }
  }

  ForwardGraph forward_;
  Graph& graph_;
  RematPolicy policy_;
  OptimizerDTypes dtypes_;
  bool balance_biases_ = false;  // bias_balance_from_config
  TensorMap grads_;              // activation -> its gradient
  TensorMap parameter_grads_;    // parameter -> its gradient
  TensorMap bias_loads_;         // router bias -> its expert loads (bias_load)
  TensorMap materialized_;       // forward tensor -> readable in this region
  std::map<TensorId, RematDecision> saved_;
};

}  // namespace

TrainingStep build_training_step(const Config& config, int64_t batch, LayerOrder order) {
  return BackwardBuilder(config, build_forward(config, batch, order)).build();
}

}  // namespace tpusim
