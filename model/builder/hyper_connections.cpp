// model/builder/hyper_connections.cpp: DeepSeek-V4's manifold-constrained hyper-connections (mHC;
// MaxText layers/mhc.py, mhc_expansion_rate = n streams) and the deepseek4 decoder layer built on
// them. The residual stream is n copies of [embed] ([batch, length, streams, embed]); around the
// attention and around the MoE, a hyper-connection
//   normalizes the flattened streams (RMSNorm over n x embed, with its scale) and maps them to
//     pre  = sigmoid(s_pre . (x W_pre) + b_pre)          [n]
//     post = 2 sigmoid(s_post . (x W_post) + b_post)     [n]
//     res  = sinkhorn(s_res . (x W_res) + b_res)         [n, n] (kSinkhorn: a softmax over each
//            row, then sinkhorn_iterations row and column normalizations, eps 1e-6)
//   with s_* trainable scalars (0.01 at init), b_* biases (0 at init);
//   feeds the block sum_k pre_k x_k (then the block's own pre-norm);
//   returns sum_k res_km x_k + post_m block_out for each stream m.
// The embedding is copied into the n streams and the head sums them (MaxText get_functions:
// expand, reduce). Per hyper-connection 3 + 2n + n^2 numbers beside the norm and the three W.
//
// Example (deepseek4-284b, per token): streams [4, 4096]; mhc_attention/norm over 16384;
// W_pre, W_post [16384, 4], W_res [16384, 16]; pre [4] . streams -> the attention's input [4096].
#include <functional>

#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {
namespace {

// MaxText mhc.py `sinkhorn`: the epsilon of its softmax and first column pass.
constexpr double kSinkhornEpsilon = 1e-6;
// MaxText initializers.py default_scalar_init: the alpha scales start at 0.01.
constexpr double kAlphaScaleInit = 0.01;

}  // namespace

std::vector<Dim> ForwardBuilder::residual_dims() const {
  const int64_t streams = dims_.residual_streams();
  if (streams <= 1) {
    return activation_dims();
  }
  return {act("batch", batch_, batch_logical_), act("length", length_, "activation_length"),
          act("streams", streams, ""), act("embed", dims_.emb_dim, "activation_embed")};
}

TensorId ForwardBuilder::expand_streams(int region, TensorId x) {
  if (dims_.residual_streams() <= 1) {
    return x;
  }
  return elementwise_to("mhc/expand", ElementwiseFn::kAdd, {x}, residual_dims(), region);
}

// The sum over the streams (a kReduceSum; its VJP copies dy into every stream).
TensorId ForwardBuilder::reduce_streams(int region, TensorId x) {
  if (dims_.residual_streams() <= 1) {
    return x;
  }
  const TensorId out = activation("mhc/reduce", activation_dims(), region);
  OpAttrs attrs;
  attrs.contracted = {"streams"};
  graph().add_op(OpKind::kReduceSum, "mhc/reduce", {x}, {out}, attrs, region);
  return out;
}

// scale x (normed . alpha) + beta for one of a hyper-connection's three maps (`kind` pre, post or
// res; MaxText mhc.py `mapping` and `res_mapping`): alpha [n x embed, outputs] reads the
// normalized streams, its output reshaped to `out_dims` ([streams] or [streams, streams_out]);
// scale is a scalar, beta has out_dims.
TensorId ForwardBuilder::mhc_mapping(const std::string& prefix, const std::string& kind, int region,
                                     TensorId normed, const std::vector<Dim>& out_dims) {
  const int64_t width = graph().tensor(normed).dims.back().size;
  int64_t outputs = 1;
  std::vector<Dim> token_out = token_dims();
  std::vector<Dim> beta_dims;
  for (const Dim& dim : out_dims) {
    outputs *= dim.size;
    token_out.push_back(act(dim.name, dim.size, ""));
    beta_dims.emplace_back(dim.name, dim.size, "");
  }
  const std::string name = prefix + "/" + kind;
  const std::string flat_name = out_dims.size() == 1 ? out_dims[0].name : "mhc_mix";
  // nd_dense_init(1.0, "fan_in", "normal"): a plain normal of std 1 / sqrt(n x embed).
  const TensorId alpha =
      weight(name + "_alpha", {Dim{"mhc", width, "activation_embed"}, Dim{flat_name, outputs, ""}},
             region, kernel_init(static_cast<double>(width), 1, InitDistribution::kNormal));
  TensorId projected = einsum(name + "_alpha", normed, alpha, {"mhc"},
                              with_last(activation_dims(), {act(flat_name, outputs, "")}), region);
  if (out_dims.size() > 1) {
    projected = reshape(name + "_matrix", projected, token_out, region);
  }
  const TensorId scale = weight(name + "_alpha_scale", {}, region, constant_init(kAlphaScaleInit));
  const TensorId scaled = einsum(name + "_scaled", projected, scale, {}, token_out, region);
  const TensorId beta = weight(name + "_beta", beta_dims, region, constant_init(0));
  return elementwise_to(name + "_biased", ElementwiseFn::kAdd, {scaled, beta}, token_out, region);
}

TensorId ForwardBuilder::sinkhorn(const std::string& name, int region, TensorId logits) {
  const std::vector<Dim> dims = graph().tensor(logits).dims;  // a copy: add_tensor may move it
  const TensorId out = activation(name, dims, region);
  OpAttrs attrs;
  attrs.epsilon = kSinkhornEpsilon;
  attrs.sinkhorn_iterations = dims_.sinkhorn_iterations;
  graph().add_op(OpKind::kSinkhorn, name, {logits}, {out}, attrs, region);
  return out;
}

// One hyper-connection around `block` (which maps [batch, length, embed] to the same).
TensorId ForwardBuilder::hyper_connection(const std::string& prefix, int region, TensorId x,
                                          const std::function<TensorId(TensorId)>& block) {
  const int64_t streams = dims_.residual_streams();
  const int64_t width = streams * dims_.emb_dim;
  // The flattened streams need all of embed on each device: a copy whose embed is not sharded
  // gathers it where activation_embed splits it (a reshape cannot merge a split dim).
  std::vector<Dim> whole_embed = residual_dims();
  whole_embed.back().logical = "";
  const TensorId gathered =
      elementwise_to(prefix + "/whole_embed", ElementwiseFn::kAdd, {x}, whole_embed, region);
  const TensorId flat = reshape(prefix + "/flat", gathered,
                                with_last(activation_dims(), {act("mhc", width, "")}), region);
  const TensorId normed = norm(prefix + "/norm", flat, region);
  const Dim stream_dim{"streams", streams, ""};
  const TensorId pre =
      elementwise(prefix + "/pre_sigmoid", ElementwiseFn::kSigmoid,
                  {mhc_mapping(prefix, "pre", region, normed, {stream_dim})}, region);
  const TensorId block_in = einsum(prefix + "/pre", x, pre, {"streams"}, activation_dims(), region);
  const TensorId block_out = block(block_in);
  const TensorId post_sigmoid =
      elementwise(prefix + "/post_sigmoid", ElementwiseFn::kSigmoid,
                  {mhc_mapping(prefix, "post", region, normed, {stream_dim})}, region);
  // 2 sigmoid as sigmoid + sigmoid: exact, and its VJP (dy to each input) gives 2 dy.
  const TensorId post = elementwise(prefix + "/post_double", ElementwiseFn::kAdd,
                                    {post_sigmoid, post_sigmoid}, region);
  const TensorId post_out = einsum(prefix + "/post", block_out, post, {}, residual_dims(), region);
  const TensorId mix = sinkhorn(
      prefix + "/sinkhorn", region,
      mhc_mapping(prefix, "res", region, normed, {stream_dim, Dim{"streams_out", streams, ""}}));
  std::vector<Dim> mixed_dims = residual_dims();
  mixed_dims[2].name = "streams_out";
  TensorId mixed = einsum(prefix + "/res", x, mix, {"streams"}, mixed_dims, region);
  mixed = reshape(prefix + "/res_out", mixed, residual_dims(), region);
  return elementwise(prefix + "/residual", ElementwiseFn::kAdd, {mixed, post_out}, region);
}

// deepseek4's decoder layer: attention and MoE, each behind its pre-norm inside a
// hyper-connection (a plain residual when mhc_expansion_rate is 1).
TensorId ForwardBuilder::build_deepseek4_layer(const LayerGroup& group, int region, TensorId x) {
  auto attention = [&](TensorId in) {
    return build_compressed_attention(group, region, norm("pre_attention_norm", in, region));
  };
  auto moe = [&](TensorId in) {
    const TensorId normed = norm("pre_mlp_norm", in, region);
    return group.feed_forward == FeedForwardKind::kMoe
               ? build_moe(region, normed, group.hash_routing)
               : build_mlp("mlp", region, normed, group.mlp_dim);
  };
  if (dims_.residual_streams() <= 1) {
    const TensorId residual =
        elementwise("attention_residual", ElementwiseFn::kAdd, {x, attention(x)}, region);
    return elementwise("mlp_residual", ElementwiseFn::kAdd, {residual, moe(residual)}, region);
  }
  const TensorId mid = hyper_connection("mhc_attention", region, x, attention);
  return hyper_connection("mhc_mlp", region, mid, moe);
}

}  // namespace tpusim::builder_detail
