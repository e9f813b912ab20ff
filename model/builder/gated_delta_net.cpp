// model/builder/gated_delta_net.cpp: the Gated DeltaNet layer of qwen3_next and qwen3_5, linear
// attention by the chunked gated delta rule, built in three steps: the projections (with the
// stand-ins for the conv, the L2 norms and the decay), the chunked delta rule as one einsum per
// matmul over all chunks, and the gated RMSNorm with the out projection.
//
// Example (qwen3-next-80b-a3b, max_target_length=2048, one layer):
//   x [batch, length=2048, embed=2048] -> [batch, gdn_chunks=32, gdn_chunk=64, embed]
//   query, key [.., gdn_heads=16, gdn_key_dim=128]; value, z [.., 16, gdn_group=2, 128]
//   gdn/state [batch, 32, 16, 2, gdn_key_dim=128, gdn_value_dim=128] (one per chunk)
//   out = (norm(o) * silu(z)) . gdn/out -> [batch, length, embed]
#include "model/builder/forward_builder_impl.h"
#include "model/config.h"

namespace tpusim::builder_detail {

// The dims of a Gated DeltaNet layer's chunked tensors: [batch, gdn_chunks, position, rest...],
// position a chunk's row (gdn_chunk) or, for the same tokens as the columns of a chunk's [C x C]
// matrices, gdn_chunk_key.
struct GdnDims {
  int64_t key_heads = 0;
  int64_t group = 0;  // value heads per key head
  Dim batch;
  Dim chunks;
  Dim row;
  Dim column;
  Dim heads;
  Dim groups;
  Dim key_dim;
  Dim value_dim;
  Dim embed;

  // [batch, gdn_chunks, position, rest...]
  std::vector<Dim> chunked(const Dim& position, std::vector<Dim> rest) const {
    std::vector<Dim> out = {batch, chunks, position};
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
  }
};

// What the projections yield, per token of [batch, gdn_chunks, gdn_chunk, ...]: the query and key
// of each key head, and per value head the value, the output gate z, beta and the decay.
struct GdnInputs {
  TensorId query = -1;
  TensorId key = -1;
  TensorId value = -1;
  TensorId output_gate = -1;
  TensorId beta = -1;
  TensorId decay = -1;
};

// A Gated DeltaNet layer (qwen3_next, qwen3_5: Yang, Kautz, Hatamizadeh, "Gated Delta
// Networks", arXiv:2412.06464; Hugging Face Qwen3NextGatedDeltaNet and its
// torch_chunk_gated_delta_rule). Per token: q, k (Hk key heads of dk), v, z (Hv = G.Hk value
// heads of dv), beta and the decay a (one per value head) are projected from x; q, k, v pass a
// causal depthwise conv of width gdn_conv_kernel_dim and SiLU, q and k an L2 norm; the chunked
// delta rule mixes the tokens; the result passes a gated RMSNorm, norm(o) * silu(z), and
// out_proj. The layer works on the sequence cut into n = S / C chunks of C = gdn_chunk_size
// tokens ([batch, gdn_chunks, gdn_chunk, ...], reshapes at its ends), so that every matmul of
// the chunked rule is an einsum (gdn_delta_rule).
TensorId ForwardBuilder::build_gated_delta_net(int region, TensorId x) {
  const GdnDims d = gdn_dims();
  const GdnInputs in = gdn_projections(region, d, x);
  const TensorId out = gdn_delta_rule(region, d, in);
  return gdn_gated_output(region, d, out, in.output_gate);
}

GdnDims ForwardBuilder::gdn_dims() const {
  GdnDims d;
  d.key_heads = dims_.gdn_num_key_heads;
  d.group = dims_.gdn_num_value_heads / d.key_heads;
  const int64_t chunk = dims_.gdn_chunk_size;
  d.batch = act("batch", batch_, batch_logical_);
  d.chunks = act("gdn_chunks", length_ / chunk, "activation_length");
  d.row = act("gdn_chunk", chunk, "");
  d.column = act("gdn_chunk_key", chunk, "");
  d.heads = act("gdn_heads", d.key_heads, "activation_heads");
  d.groups = act("gdn_group", d.group, "");
  d.key_dim = act("gdn_key_dim", dims_.gdn_key_head_dim, "");
  d.value_dim = act("gdn_value_dim", dims_.gdn_value_head_dim, "");
  d.embed = act("embed", dims_.emb_dim, "activation_embed");
  return d;
}

// The input cut into chunks, its projections, and what the delta rule reads of them. Stand-ins,
// each the same kind of work as what it replaces: the conv and SiLU as one SiLU (the conv's
// K.(2.Hk.dk + Hv.dv) weights are left out: 0.002% of qwen3-next-80b-a3b's parameters), the L2
// norms as RMSNorms (with a [dk] scale), the decay -exp(A_log).softplus(a + dt_bias) and its
// cumulative sum within the chunk as sigmoid(a + dt_bias) (A_log left out).
GdnInputs ForwardBuilder::gdn_projections(int region, const GdnDims& d, TensorId x) {
  const TensorId xc = reshape("gdn/chunked_input", x, d.chunked(d.row, {d.embed}), region);
  // The projections (MaxText in_proj_qkvz and in_proj_ba, kernel axes (embed, gdn_head)).
  auto project = [&](const std::string& name, std::vector<Dim> features) {
    std::vector<Dim> w_dims = {Dim{"embed", dims_.emb_dim, "embed"}};
    for (const Dim& feature : features) {
      w_dims.emplace_back(feature.name, feature.size,
                          feature.name == "gdn_heads" ? "gdn_head" : "");
    }
    const TensorId w = weight("gdn/" + name, w_dims, region, dense(dims_.emb_dim));
    return einsum("gdn/" + name, xc, w, {"embed"}, d.chunked(d.row, std::move(features)), region);
  };
  GdnInputs in;
  in.query = project("query", {d.heads, d.key_dim});
  in.key = project("key", {d.heads, d.key_dim});
  in.value = project("value", {d.heads, d.groups, d.value_dim});
  in.output_gate = project("output_gate", {d.heads, d.groups, d.value_dim});
  const TensorId beta_logit = project("beta", {d.heads, d.groups});
  const TensorId decay_logit = project("decay", {d.heads, d.groups});
  in.query = elementwise("gdn/query_conv_silu", ElementwiseFn::kSilu, {in.query}, region);
  in.key = elementwise("gdn/key_conv_silu", ElementwiseFn::kSilu, {in.key}, region);
  in.value = elementwise("gdn/value_conv_silu", ElementwiseFn::kSilu, {in.value}, region);
  if (options_.use_qk_norm_in_gdn) {
    in.query = norm("gdn/query_l2norm", in.query, region);
    in.key = norm("gdn/key_l2norm", in.key, region);
  }
  in.beta = elementwise("gdn/beta", ElementwiseFn::kSigmoid, {beta_logit}, region);
  // Hugging Face initializes dt_bias to ones.
  const TensorId dt_bias = parameter_tensor(
      "gdn/dt_bias", {Dim{"gdn_heads", d.key_heads, "gdn_head"}, Dim{"gdn_group", d.group, ""}},
      region, constant_init(1));
  in.decay = elementwise(
      "gdn/decay", ElementwiseFn::kSigmoid,
      {elementwise("gdn/decay_bias", ElementwiseFn::kAdd, {decay_logit, dt_bias}, region)}, region);
  return in;
}

// The chunked delta rule. Per chunk and value head (value heads share their key head's q and k;
// gdn_chunk indexes a chunk's rows, gdn_chunk_key its columns):
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
// Stand-ins: exp(g) and the masks as products with the decay.
TensorId ForwardBuilder::gdn_delta_rule(int region, const GdnDims& d, const GdnInputs& in) {
  const std::vector<Dim> key_per_value_head = d.chunked(d.row, {d.heads, d.groups, d.key_dim});
  const TensorId key_beta = elementwise_to("gdn/key_beta", ElementwiseFn::kMul, {in.key, in.beta},
                                           key_per_value_head, region);
  const TensorId value_beta =
      elementwise("gdn/value_beta", ElementwiseFn::kMul, {in.value, in.beta}, region);
  const TensorId key_beta_decayed =
      elementwise("gdn/key_beta_decayed", ElementwiseFn::kMul, {key_beta, in.decay}, region);
  const TensorId query_decayed = elementwise_to("gdn/query_decayed", ElementwiseFn::kMul,
                                                {in.query, in.decay}, key_per_value_head, region);
  // The same tokens as the columns of a chunk's [C x C] matrices.
  const TensorId key_columns =
      reshape("gdn/key_columns", in.key, d.chunked(d.column, {d.heads, d.key_dim}), region);
  const TensorId value_beta_columns =
      reshape("gdn/value_beta_columns", value_beta,
              d.chunked(d.column, {d.heads, d.groups, d.value_dim}), region);
  const TensorId key_beta_decayed_columns =
      reshape("gdn/key_beta_decayed_columns", key_beta_decayed,
              d.chunked(d.column, {d.heads, d.groups, d.key_dim}), region);
  const std::vector<Dim> square = d.chunked(d.row, {d.heads, d.groups, d.column});
  const std::vector<Dim> values = d.chunked(d.row, {d.heads, d.groups, d.value_dim});
  TensorId key_key = einsum("gdn/key_key", key_beta, key_columns, {"gdn_key_dim"}, square, region);
  key_key = elementwise("gdn/key_key_masked", ElementwiseFn::kMul, {key_key, in.decay}, region);
  const TensorId solved_values =
      einsum("gdn/solve_values", key_key, value_beta_columns, {"gdn_chunk_key"}, values, region);
  const TensorId solved_keys = einsum("gdn/solve_keys", key_key, key_beta_decayed_columns,
                                      {"gdn_chunk_key"}, key_per_value_head, region);
  const TensorId state =
      einsum("gdn/state", in.key, solved_values, {"gdn_chunk"},
             {d.batch, d.chunks, d.heads, d.groups, d.key_dim, d.value_dim}, region);
  const TensorId state_values =
      einsum("gdn/state_values", solved_keys, state, {"gdn_key_dim"}, values, region);
  const TensorId new_values =
      elementwise("gdn/new_values", ElementwiseFn::kAdd, {solved_values, state_values}, region);
  const TensorId new_value_columns =
      reshape("gdn/new_value_columns", new_values,
              d.chunked(d.column, {d.heads, d.groups, d.value_dim}), region);
  TensorId scores =
      einsum("gdn/query_key", query_decayed, key_columns, {"gdn_key_dim"}, square, region);
  scores = elementwise("gdn/query_key_masked", ElementwiseFn::kMul, {scores, in.decay}, region);
  const TensorId from_state =
      einsum("gdn/state_output", query_decayed, state, {"gdn_key_dim"}, values, region);
  const TensorId from_chunk =
      einsum("gdn/chunk_output", scores, new_value_columns, {"gdn_chunk_key"}, values, region);
  return elementwise("gdn/output", ElementwiseFn::kAdd, {from_state, from_chunk}, region);
}

// The gated RMSNorm (Qwen3NextRMSNormGated): norm over dv, times silu(z); then out_proj, and the
// chunks back into the sequence.
TensorId ForwardBuilder::gdn_gated_output(int region, const GdnDims& d, TensorId out,
                                          TensorId output_gate) {
  out = norm("gdn/output_norm", out, region);
  out = elementwise(
      "gdn/output_gated", ElementwiseFn::kMul,
      {out, elementwise("gdn/output_gate_silu", ElementwiseFn::kSilu, {output_gate}, region)},
      region);
  const TensorId w_out = weight(
      "gdn/out",
      {Dim{"gdn_heads", d.key_heads, "gdn_head"}, Dim{"gdn_group", d.group, ""},
       Dim{"gdn_value_dim", dims_.gdn_value_head_dim, ""}, Dim{"embed", dims_.emb_dim, "embed"}},
      region, dense(dims_.gdn_num_value_heads * dims_.gdn_value_head_dim));
  const TensorId projected =
      einsum("gdn/out", out, w_out, {"gdn_heads", "gdn_group", "gdn_value_dim"},
             d.chunked(d.row, {d.embed}), region);
  return reshape("gdn/layer_output", projected, activation_dims(), region);
}

}  // namespace tpusim::builder_detail
