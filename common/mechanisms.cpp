#include "common/mechanisms.h"

#include <array>
#include <cstddef>

#include "common/error.h"
#include "common/suggest.h"

namespace tpusim {
namespace {

constexpr auto kCount = static_cast<size_t>(Mechanism::kCount);

struct Description {
  const char* name;
  const char* summary;
};

constexpr std::array<Description, kCount> kDescriptions = {{
    {"grouped_matmul_tiles",
     "megablox/tokamax grouped matmuls visit ceil(rows/tm) + experts - 1 row tiles, pad "
     "embed/mlp to whole tiles and refetch an expert's weights per row tile"},
    {"quantize_scale_pass",
     "an absmax-calibrated quantized matmul first reads each bf16 operand for its scale"},
    {"bf16_attention", "attention kernels run at the bf16 MXU rate under fp8/int8 quantization"},
    {"bf16_logits",
     "the logits (unembedding) matmul and its gradients run at the bf16 MXU rate under fp8/int8 "
     "quantization: MaxText quantizes only the decoder layers' matmuls"},
    {"chip_ingress_bound",
     "a collective over the v7x chiplet pair and torus axes is bounded by the chip's torus links"},
    {"sparsecore_reduction",
     "offloaded reduce-scatters run on a SparseCore queue of their own, at the catalog's "
     "sparsecore_reduce_scatter_time_factor times their ICI roofline (1 since 2026-11-27)"},
    {"tensorcore_driven_collectives",
     "on v7x, collectives kept off the SparseCores run as continuation fusion: the XLA fusions "
     "carrying their steps take the catalog's continuation_fusion_tensorcore_share longer (Pallas "
     "kernels carry none; the share is fitted to the v7x guide's dense SparseCore offload "
     "ablations)"},
    {"dcn_shards_first",
     "a gather across slices moves shards over DCN, then the full array over ICI"},
    {"dcn_step_latency",
     "each ring step of a collective across slices pays the DCN message latency on top of its "
     "bytes (not the larger of the two), and the TensorCore driving a reduction's steps waits "
     "them out"},
    {"in_place_buffers",
     "an elementwise result reuses the buffer of an operand it reads for the last time"},
    {"attention_subblock_pipelining",
     "splash attention with several kv compute sub-blocks per block overlaps the softmax of one "
     "with the matmuls of the next"},
    {"reduction_reassociation",
     "a sum of reduce-scattered (or all-reduced) partial sums runs as one reduction of their sum "
     "(XLA's ReduceScatterReassociate): one tensor-parallel reduce-scatter of an input gradient "
     "where q, k and v (or wi_0 and wi_1) each had one"},
    {"gpu_attention_kernel_rates",
     "GPU fused attention (cudnn_flash_te) runs at the kernel's measured TFLOP/s for its "
     "sequence length and mask (the catalog's attention_kernel table), not at the GEMM rate"},
    {"routed_row_gathers",
     "dropless MoE's dispatch and combine (and their gradients) gather and scatter routed token "
     "rows at the catalog's routed_row_hbm_fraction of the HBM roofline, not at the roofline "
     "(the fraction is fitted to the dropless-MoE recipes: benchmarks/fit_routed_row_fraction.py)"},
    {"aqt_stochastic_rounding",
     "AQT int8 (quantization=int8 without qwix) rounds the gradient operand of each quantized "
     "backward matmul stochastically: a 32-bit uniform noise tensor of the gradient's shape is "
     "written to HBM and read back before the matmul"},
    {"weight_scale_on_shard",
     "the absmax scale of an FSDP-gathered weight is found on the device's shard before the "
     "all-gather (XLA keeps the max reduction in the operand's sharding), so its scale pass "
     "reads the shard, not the gathered weight"},
    {"grouped_matmul_mxu_rows",
     "a megablox/tokamax row tile of fewer rows than the MXU is wide (tile_m 128 on a 256-wide "
     "MXU) takes the MXU as long as a full-width tile"},
    {"routing_scatter_gradients",
     "with use_custom_sort_vjp=false the backward of the routing gathers is XLA's generic gather "
     "transpose, a scatter-add about 3x as slow as the gather (Marin v5p measurement)"},
    {"tokamax_gmm_tiles",
     "unquantized use_tokamax_gmm calls tokamax.ragged_dot without MaxText's tile keys: tokamax's "
     "tuned tile table for its shape, else 128 x 128 x 128 tiles"},
    {"bf16_expert_matmuls",
     "dropless MoE expert matmuls that MaxText's quantization does not reach run at the bf16 "
     "rate: jax.lax.ragged_dot (no megablox/tokamax) without qwix takes a quantized kernel only "
     "when serving, and under qwix only fp8_full has a rule for the grouped matmul"},
    {"grouped_matmul_quantize_pass",
     "an operand a quantized megablox/tokamax grouped matmul reads narrow is cast by an XLA "
     "fusion of its own first (bf16 read, 1-byte copy written, the copy read by the kernel); a "
     "weight gathered already quantized (QAG) is cast on its shard"},
    {"quantized_residuals",
     "under qwix fp8_full the backward matmuls reuse the forward's quantized activation and "
     "weight (QtRule bwd_use_original_residuals=False): only the incoming gradient is scaled"},
    {"narrow_dense_moe_exchange",
     "under quantization the dense MoE path's dispatch and combine are quantized einsums like "
     "the experts' (MaxText moe get_einsum): their one-hot matmuls run at the int8/fp8 MXU rate, "
     "after the passes that quantize their operands"},
    {"gmm_v2_grid_steps",
     "tokamax's gmm_v2 kernel (tpusim op matmul groups=G, use_gmm_v2) pays the chip's "
     "gmm_v2_grid_step_us once per step of its (n, group x row tile, k) pipeline grid, and a row "
     "tile narrower than the MXU costs only its rows (tokamax PR #1221's tile_m speed-ups)"},
    {"gmm_v2_weight_prefetch",
     "tokamax's gmm_v2 kernel fetches the next expert's weight block in the grid step before its "
     "first row tile (Pallas's standard pipeline schedule; lookahead is off): an expert with more "
     "than one row tile waits for it behind its own compute (the MXU side is at least that "
     "chain)"},
    {"expert_bias_scatter_gradients",
     "with mlp_bias a dropless MoE gathers each routed row's expert biases (MaxText moe.py "
     "transform_bias); the backward of each gather is a scatter-add of the routed gradient rows "
     "into the [experts, width] bias, at the routing scatter-add's rate "
     "(routing_scatter_gradients)"},
    {"gmm_v2_one_tensorcore",
     "tokamax's gmm_v2 is a pallas_call with no grid and an emit_pipeline with no core axis, so "
     "on a megacore device (v4, v5p: two TensorCores per JAX device) it runs on one TensorCore, "
     "at half the device's MXU rate (Pallas: without dimension_semantics one TensorCore is used)"},
}};

}  // namespace

const char* mechanism_name(Mechanism mechanism) {
  return kDescriptions.at(static_cast<size_t>(mechanism)).name;
}

const char* mechanism_summary(Mechanism mechanism) {
  return kDescriptions.at(static_cast<size_t>(mechanism)).summary;
}

std::string mechanism_names_joined() {
  std::string names;
  for (const Description& description : kDescriptions) {
    names += names.empty() ? "" : ", ";
    names += description.name;
  }
  return names;
}

MechanismSet MechanismSet::without(const std::vector<std::string>& names) {
  MechanismSet set;
  for (const std::string& name : names) {
    bool found = false;
    for (size_t index = 0; index < kCount; ++index) {
      if (name == kDescriptions.at(index).name) {
        set.off_.at(index) = true;
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> known;
      std::string listed;
      for (const Description& description : kDescriptions) {
        known.emplace_back(description.name);
        listed += (listed.empty() ? "" : ", ") + known.back();
      }
      throw UserError("--without: unknown mechanism '" + name + "'" + did_you_mean(name, known) +
                          "; known: " + listed,
                      name);
    }
  }
  return set;
}

bool MechanismSet::enabled(Mechanism mechanism) const {
  return !off_.at(static_cast<size_t>(mechanism));
}

std::vector<std::string> MechanismSet::disabled_names() const {
  std::vector<std::string> names;
  for (size_t index = 0; index < kCount; ++index) {
    if (off_.at(index)) {
      names.emplace_back(kDescriptions.at(index).name);
    }
  }
  return names;
}

}  // namespace tpusim
