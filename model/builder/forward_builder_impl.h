// model/builder/forward_builder_impl.h: ForwardBuilder, the class behind build_forward
// (forward_builder.h), for the files of model/builder/ that define its members; not an interface
// for anything outside model/builder/.
//
// It holds the config-derived sizes the layers share and the graph being built. Its members are
// defined by concept, one file per layer kind:
//   forward_builder.cpp       the build() driver: embedding, layer assembly, head
//   forward_builder_ops.cpp   the graph primitives every layer uses (weights, einsums, norms)
//   attention_block.cpp       GQA/MHA attention, RoPE, the attention op, the out projection
//   mla_block.cpp             DeepSeek's multi-head latent attention
//   gated_delta_net.cpp       qwen3-next's Gated DeltaNet linear attention
//   compressed_attention.cpp  DeepSeek-V4's compressed attention, indexer, grouped out projection
//   hyper_connections.cpp     DeepSeek-V4's mHC residual streams and its decoder layer
//   feed_forward_block.cpp    the MLP and the routed mixture of experts
//
// Example:
//   ForwardGraph forward = builder_detail::ForwardBuilder(config, /*batch=*/8).build();
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/builder/build_options.h"
#include "model/builder/forward_builder.h"
#include "model/builder/initializers.h"
#include "model/builder/layer_plan.h"
#include "model/ir/graph.h"
#include "model/model_dims.h"
#include "model/pipeline_schedule.h"

namespace tpusim {

class Config;

namespace builder_detail {

// The rows of a dropless MoE's grouped tensors: whose expert each row is, and the fraction of
// rows balanced routing fills (see model/ir/op.h). row_experts < 0: not ragged.
struct Ragged {
  TensorId row_experts = -1;
  double routed_fraction = 1;
};

// The shared dims of a Gated DeltaNet layer's chunked tensors and its projected inputs
// (gated_delta_net.cpp).
struct GdnDims;
struct GdnInputs;

// Builds one model into a ForwardGraph; holds the config-derived sizes the layers share.
class ForwardBuilder {
 public:
  ForwardBuilder(const Config& config, int64_t batch, LayerOrder order);

  ForwardGraph build();

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

  // The graph primitives (forward_builder_ops.cpp).

  // A parameter as a matmul reads it: MaxText keeps weights in weight_dtype and casts them to
  // dtype inside the layer; the cast runs on each device's shard, so FSDP gathers move dtype bytes.
  TensorId weight(const std::string& name, std::vector<Dim> dims, int region,
                  const ParameterInit& init);
  // A parameter used as is (norm scales and biases, embedding tables).
  TensorId parameter_tensor(const std::string& name, std::vector<Dim> dims, int region,
                            const ParameterInit& init);
  // MaxText's dense kernels: variance scaling over `fan_in` (the contracted axes), truncated
  // normal; the attention kernels of a family with normal_attention_init (GPT-3:
  // Gpt3MultiHeadAttention) draw from a plain normal.
  ParameterInit dense(int64_t fan_in, double divisor = 1, bool attention_kernel = false) const;
  TensorId activation(const std::string& name, std::vector<Dim> dims, int region,
                      const std::string& remat_name = "") {
    return graph().add_tensor(name, std::move(dims), activation_dtype_, TensorKind::kActivation,
                              region, remat_name);
  }
  TensorId einsum(const std::string& name, TensorId lhs, TensorId rhs,
                  std::vector<std::string> contracted, std::vector<Dim> out_dims, int region,
                  const std::string& remat_name = "", const Ragged& ragged = {});
  TensorId elementwise(const std::string& name, ElementwiseFn fn, std::vector<TensorId> inputs,
                       int region, const std::string& remat_name = "");
  // An elementwise op whose output has `dims` (inputs broadcast along the dims they lack).
  TensorId elementwise_to(const std::string& name, ElementwiseFn fn, std::vector<TensorId> inputs,
                          std::vector<Dim> dims, int region);
  // The elements of `x` under other dims (ElementwiseFn::kReshape).
  TensorId reshape(const std::string& name, TensorId x, std::vector<Dim> dims, int region) {
    return elementwise_to(name, ElementwiseFn::kReshape, {x}, std::move(dims), region);
  }
  // An RMSNorm (LayerNorm by family) over x's last dim; with_scale false: DeepSeek-V4's
  // unweighted RMSNorm (no scale parameter).
  TensorId norm(const std::string& name, TensorId x, int region, bool with_scale = true);

  // The model's ends and the decoder layer (forward_builder.cpp).

  TensorId build_embedding();
  TensorId build_layer(const LayerGroup& group, int region, TensorId x);
  TensorId build_per_layer_input(int region, TensorId x);
  TensorId add_per_layer_input(int region, TensorId output, TensorId per_layer_input);
  void build_head();

  // Attention (attention_block.cpp).

  std::vector<Dim> head_dims(int64_t heads, const std::string& heads_name,
                             const std::string& activation_logical, const std::string& dim_name,
                             int64_t dim_size) const {
    return with_last(activation_dims(), {act(heads_name, heads, activation_logical),
                                         act(dim_name, dim_size, "activation_kv")});
  }
  TensorId attention_op(const LayerGroup& group, int region, std::vector<TensorId> inputs,
                        int64_t heads, const std::string& out_dim, int64_t out_dim_size,
                        double runtime_scale);
  // To emb_dim, or to `out_width` when positive (qwen3_custom_moe's attention_output_dim).
  TensorId out_projection(int region, TensorId context, const std::string& head_dim_name,
                          int64_t head_dim_size, int64_t out_width = 0);
  TensorId with_bias(const std::string& name, TensorId x, std::vector<Dim> bias_dims, int region);
  TensorId build_attention(const LayerGroup& group, int region, TensorId x);
  // RoPE on x's last dim; reverse: the rotation undone (DeepSeek-V4's attention output).
  TensorId rope(const std::string& name, TensorId x, int region, bool reverse = false);

  // DeepSeek-V4's compressed attention (compressed_attention.cpp).

  TensorId build_compressed_attention(const LayerGroup& group, int region, TensorId x);
  TensorId compressed_blocks(const std::string& prefix, int region, TensorId x, int64_t ratio,
                             int64_t head_dim);
  TensorId pool_blocks(const std::string& prefix, int region, TensorId kv, TensorId gate,
                       int64_t ratio, int64_t width, int64_t head_dim);
  TensorId build_indexer(int region, TensorId x, TensorId q_latent);
  TensorId compressed_attention_op(const std::string& name, int region,
                                   std::vector<TensorId> inputs, AttentionMask mask, int64_t window,
                                   double scale);
  TensorId grouped_out_projection(int region, TensorId context);
  TensorId compressed_rope(const std::string& name, TensorId x, int region, int64_t position_stride,
                           bool reverse = false);

  // DeepSeek-V4's hyper-connections and decoder layer (hyper_connections.cpp).

  // The residual stream between layers: [batch, length, streams, embed] with hyper-connections,
  // activation_dims() otherwise.
  std::vector<Dim> residual_dims() const;
  TensorId expand_streams(int region, TensorId x);
  TensorId reduce_streams(int region, TensorId x);
  TensorId hyper_connection(const std::string& prefix, int region, TensorId x,
                            const std::function<TensorId(TensorId)>& block);
  TensorId mhc_mapping(const std::string& prefix, const std::string& kind, int region,
                       TensorId normed, const std::vector<Dim>& out_dims);
  TensorId sinkhorn(const std::string& name, int region, TensorId logits);
  TensorId build_deepseek4_layer(const LayerGroup& group, int region, TensorId x);
  // qwen3_custom_moe's decoder layer (forward_builder.cpp).
  TensorId build_latent_moe_layer(const LayerGroup& group, int region, TensorId x);

  // Multi-head latent attention (mla_block.cpp).

  TensorId build_mla(int region, TensorId x);

  // Gated DeltaNet (gated_delta_net.cpp).

  TensorId build_gated_delta_net(int region, TensorId x);
  GdnDims gdn_dims() const;
  GdnInputs gdn_projections(int region, const GdnDims& d, TensorId x);
  TensorId gdn_delta_rule(int region, const GdnDims& d, const GdnInputs& in);
  TensorId gdn_gated_output(int region, const GdnDims& d, TensorId out, TensorId output_gate);

  // Feed-forward (feed_forward_block.cpp).

  TensorId build_mlp(const std::string& prefix, int region, TensorId x, int64_t mlp_dim,
                     const std::string& experts_prefix = "", const Ragged& ragged = {});
  // hash_routing: deepseek4's first first_num_hash_layers layers (experts by token id).
  TensorId build_moe(int region, TensorId x, bool hash_routing = false);
  // MaxText's load-balance loss of a routed MoE layer: OpAttrs::load_balance_scale of its
  // router (0 when the model has none), and the ops after the router's two extra outputs.
  double load_balance_scale() const;
  // UserError naming routed_bias_update_rate when a deepseek4 bias update meets a pipeline.
  void check_bias_update_without_pipeline() const;
  void build_load_balance_loss(int region, TensorId balance_probabilities, TensorId choices);

  const Config& config_;
  ModelDims dims_;
  BuildOptions options_ = BuildOptions::from_config(config_);  // before the members it sets
  int64_t batch_;
  int64_t length_;
  DType activation_dtype_;
  DType weight_dtype_;
  PipelineSchedule pipeline_;
  LayerOrder order_;  // how plan_layers groups the layers (layer_plan.h)
  // The batch dim's logical axis: the layers' (activation_batch), or outside a pipeline's layers
  // MaxText's activation_embed_and_logits_batch, which also shards over the stages.
  std::string batch_logical_ = "activation_batch";
  TensorId tokens_ = -1;
  TensorId table_ = -1;
  ForwardGraph result_;
};

}  // namespace builder_detail
}  // namespace tpusim
