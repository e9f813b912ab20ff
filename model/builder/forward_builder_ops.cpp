// model/builder/forward_builder_ops.cpp: the graph primitives every layer of ForwardBuilder
// builds with: parameters (cast to dtype when weight_dtype differs), einsums, elementwise ops and
// norms, each adding its output tensor and its op to the graph.
//
// Example:
//   const TensorId w = weight("mlp/wi", {embed, mlp}, region, dense(dims_.emb_dim));
//   TensorId hidden = einsum("mlp/wi", x, w, {"embed"}, hidden_dims, region, "mlpwi");
//   hidden = elementwise("mlp/silu", ElementwiseFn::kSilu, {hidden}, region);
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {

TensorId ForwardBuilder::weight(const std::string& name, std::vector<Dim> dims, int region,
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

TensorId ForwardBuilder::parameter_tensor(const std::string& name, std::vector<Dim> dims,
                                          int region, const ParameterInit& init) {
  result_.initializers[graph().region(region).name + "/" + name] = init;
  return graph().add_tensor(name, std::move(dims), weight_dtype_, TensorKind::kParameter, region);
}

ParameterInit ForwardBuilder::dense(int64_t fan_in, double divisor, bool attention_kernel) const {
  return kernel_init(static_cast<double>(fan_in), divisor,
                     attention_kernel && dims_.family().normal_attention_init
                         ? InitDistribution::kNormal
                         : InitDistribution::kTruncatedNormal);
}

TensorId ForwardBuilder::einsum(const std::string& name, TensorId lhs, TensorId rhs,
                                std::vector<std::string> contracted, std::vector<Dim> out_dims,
                                int region, const std::string& remat_name, const Ragged& ragged) {
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

TensorId ForwardBuilder::elementwise(const std::string& name, ElementwiseFn fn,
                                     std::vector<TensorId> inputs, int region,
                                     const std::string& remat_name) {
  const TensorId out = activation(name, graph().tensor(inputs.front()).dims, region, remat_name);
  OpAttrs attrs;
  attrs.function = fn;
  graph().add_op(OpKind::kElementwise, name, std::move(inputs), {out}, attrs, region);
  return out;
}

TensorId ForwardBuilder::elementwise_to(const std::string& name, ElementwiseFn fn,
                                        std::vector<TensorId> inputs, std::vector<Dim> dims,
                                        int region) {
  const TensorId out = activation(name, std::move(dims), region);
  OpAttrs attrs;
  attrs.function = fn;
  graph().add_op(OpKind::kElementwise, name, std::move(inputs), {out}, attrs, region);
  return out;
}

TensorId ForwardBuilder::norm(const std::string& name, TensorId x, int region, bool with_scale) {
  // Copies: adding tensors below may move the graph's storage.
  const std::vector<Dim> input_dims = graph().tensor(x).dims;
  const Dim& last = input_dims.back();
  const bool layer_norm = dims_.family().norm == NormKind::kLayerNorm;
  std::vector<TensorId> inputs = {x};
  if (with_scale || layer_norm) {
    inputs.push_back(parameter_tensor(name + "/scale", {Dim{last.name, last.size, "norm"}}, region,
                                      constant_init(1)));
  }
  if (layer_norm) {
    inputs.push_back(parameter_tensor(name + "/bias", {Dim{last.name, last.size, "norm"}}, region,
                                      constant_init(0)));
  }
  const TensorId out = activation(name, input_dims, region);
  OpAttrs attrs;
  attrs.contracted = {last.name};
  attrs.epsilon = options_.normalization_layer_epsilon;
  graph().add_op(layer_norm ? OpKind::kLayerNorm : OpKind::kRmsNorm, name, inputs, {out}, attrs,
                 region);
  return out;
}

}  // namespace tpusim::builder_detail
