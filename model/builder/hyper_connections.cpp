// model/builder/hyper_connections.cpp: DeepSeek-V4's manifold-constrained hyper-connections (mHC;
// MaxText layers/mhc.py, mhc_expansion_rate = n streams) and the deepseek4 decoder layer built on
// them. The residual stream is n copies of [embed] ([batch, length, streams, embed]); around the
// attention and around the MoE, a hyper-connection
//   normalizes the flattened streams (RMSNorm over n x embed) and projects them to
//   pre = sigmoid(. W_pre) [n], post = 2 sigmoid(. W_post) [n] and res = sinkhorn(. W_res) [n, n];
//   feeds the block sum_k pre_k x_k (then the block's own pre-norm);
//   returns sum_k res_km x_k + post_m block_out for each stream m.
// The embedding is copied into the n streams and the head sums them (MaxText get_functions:
// expand, reduce). The sinkhorn normalization (20 row and column passes over n x n per token) is
// charged as one elementwise pass; the projections' scalar gains and biases (3 + 2n + n^2 numbers
// per hyper-connection) are left out.
//
// Example (deepseek4-284b, per token): streams [4, 4096]; mhc_attention/norm over 16384;
// W_pre, W_post [16384, 4], W_res [16384, 16]; pre [4] . streams -> the attention's input [4096].
#include <functional>

#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {

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

// The sum over the streams, as a product with an all-ones [streams] vector (a fixed parameter
// MaxText does not have: n numbers).
TensorId ForwardBuilder::reduce_streams(int region, TensorId x) {
  const int64_t streams = dims_.residual_streams();
  if (streams <= 1) {
    return x;
  }
  const TensorId ones =
      parameter_tensor("mhc/reduce", {Dim{"streams", streams, ""}}, region, constant_init(1));
  return einsum("mhc/reduce", x, ones, {"streams"}, activation_dims(), region);
}

// One hyper-connection around `block` (which maps [batch, length, embed] to the same).
TensorId ForwardBuilder::hyper_connection(const std::string& prefix, int region, TensorId x,
                                          const std::function<TensorId(TensorId)>& block) {
  const int64_t streams = dims_.residual_streams();
  const int64_t width = streams * dims_.emb_dim;
  const TensorId flat =
      reshape(prefix + "/flat", x, with_last(activation_dims(), {act("mhc", width, "")}), region);
  const TensorId normed = norm(prefix + "/norm", flat, region);
  auto mapping = [&](const std::string& name, int64_t outputs, const std::string& out_name) {
    const TensorId w = weight(prefix + "/" + name,
                              {Dim{"mhc", width, "activation_embed"}, Dim{out_name, outputs, ""}},
                              region, dense(width));
    return einsum(prefix + "/" + name, normed, w, {"mhc"},
                  with_last(activation_dims(), {act(out_name, outputs, "")}), region);
  };
  const TensorId pre = elementwise(prefix + "/pre_sigmoid", ElementwiseFn::kSigmoid,
                                   {mapping("pre_alpha", streams, "streams")}, region);
  const TensorId block_in = einsum(prefix + "/pre", x, pre, {"streams"}, activation_dims(), region);
  const TensorId block_out = block(block_in);
  const TensorId post = elementwise(prefix + "/post_sigmoid", ElementwiseFn::kSigmoid,
                                    {mapping("post_alpha", streams, "streams")}, region);
  const TensorId post_out = einsum(prefix + "/post", block_out, post, {}, residual_dims(), region);
  TensorId mix = mapping("res_alpha", streams * streams, "mhc_mix");
  mix = reshape(
      prefix + "/res_matrix", mix,
      with_last(activation_dims(), {act("streams", streams, ""), act("streams_out", streams, "")}),
      region);
  mix = elementwise(prefix + "/sinkhorn", ElementwiseFn::kSigmoid, {mix}, region);
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
