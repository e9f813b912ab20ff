// sim/perf/op_cost.h: how long one compute op of the per-device program takes on a TensorCore.
//
// Matmuls (einsums) are tiled onto the MXUs: every dim pads up to the array (rows to 8-row passes,
// the contracted and output columns to 128 or 256), so a matmul runs at
//   peak x mxu_achievable_fraction x prod(d / roundup(d, tile))
// and is charged the HBM traffic of the VMEM blocking that fits: with square-ish output blocks of
// b x b and the whole contraction resident, each operand is re-read once per block of the other.
// The op's time is max(MXU, HBM, VPU) + op_overhead_us. Elementwise ops, norms and the optimizer
// are VPU- or HBM-bound; elementwise ops that directly consume a matmul's only output are fused
// into it (no extra HBM round trip, as XLA's output fusion). Attention is costed as the kernel
// the config selects: flash/splash keeps scores in VMEM, skips fully masked causal blocks and
// re-reads K/V once per query block (sa_block_q); dot_product materializes the scores in HBM and
// computes the whole square. Attention always runs at the bf16 rate; within a block its softmax
// (VPU) and matmuls (MXU) add, unless the kv block is split into compute sub-blocks
// (sa_block_kv_compute), which pipelines them: max + min / sub-blocks.
// Dropless MoE grouped matmuls under megablox/tokamax are costed as the tiled kernel runs them
// (MaxText's wi_tile_* / wo_tile_* keys, or tokamax's own tiles when MaxText passes none):
// ceil(rows / tm) + experts - 1 row tiles, embed and mlp padded to whole tiles, the expert's
// weight refetched per row tile unless the contraction is one tile. Quantized matmuls (fp8 and
// AQT int8: forward, dlhs and drhs; int8 with quantization_local_shard_count=0: forward and dlhs)
// run at the narrow MXU rate and, with absmax calibration, first read each bf16 operand for its
// scale; AQT int8 also writes and reads a 32-bit stochastic-rounding noise tensor for each
// gradient operand of a backward matmul.
// Each of these refinements is a mechanism (common/mechanisms.h, `--without NAME` switches it
// off): among them tokamax gmm_v2's fixed cost per step of its pipeline grid (gmm_v2_grid_steps),
// the XLA cast of a Pallas grouped matmul's narrow operands before the kernel
// (grouped_matmul_quantize_pass), fp8_full's backward reusing the forward's quantized operands
// (quantized_residuals), the quantized dropping-MoE dispatch and combine einsums at the narrow
// rate (narrow_dense_moe_exchange), dropless routed rows moved below the HBM roofline
// (routed_row_gathers) and the scatter-add of routing gradients (routing_scatter_gradients).
//
// Example:
//   OpCost cost = cost_compute_op(graph, op, context, /*fused=*/false);
//   cost.seconds;  cost.mxu_seconds;  cost.hbm_seconds;
#pragma once

#include <string>
#include <vector>

#include "common/mechanisms.h"
#include "hw/chip_spec.h"
#include "model/ir/graph.h"

namespace tpusim {

// What bounds an op, for the step breakdown.
enum class CostCategory { kMxu, kHbm, kVpu, kOverhead };

const char* cost_category_name(CostCategory category);

// MaxText's megablox tile sizes for one grouped matmul (wi_tile_fwd_batch_seq, ...): rows of the
// token dim, and the tiles of the embed and mlp dims.
struct GroupedMatmulTiles {
  int64_t batch_seq = 512;
  int64_t embed = 1024;
  int64_t mlp = 1024;
  bool operator==(const GroupedMatmulTiles&) const = default;
};

// The three matmuls of a layer's weight: forward, input gradient (dlhs), weight gradient (drhs).
enum class MatmulPass { kForward = 0, kInputGrad = 1, kWeightGrad = 2 };

struct CostContext {
  const ChipSpec* chip = nullptr;
  bool flash_attention = true;  // attention=flash/autoselected vs dot_product
  // Splash blocks as MaxText's keys set them: forward query and key/value blocks and the
  // key/value compute sub-block (sa_block_q, sa_block_kv, sa_block_kv_compute), the backward dK/dV
  // kernel's key/value block and sub-block (sa_block_kv_dkv, sa_block_kv_dkv_compute). With more
  // than one compute sub-block per key/value block, the kernel's Q.K^T of one sub-block overlaps
  // the softmax of the previous one.
  int64_t block_q = 512;
  int64_t block_kv = 512;
  int64_t block_kv_compute = 512;
  int64_t block_kv_dkv = 512;
  int64_t block_kv_dkv_compute = 512;
  // The same for the sliding-window layers (local_sa_block_*); 0 (MaxText's None) takes the value
  // above.
  int64_t local_block_q = 0;
  int64_t local_block_kv = 0;
  int64_t local_block_kv_compute = 0;
  int64_t local_block_kv_dkv = 0;
  int64_t local_block_kv_dkv_compute = 0;
  // The quantization's matmul format (hw/matmul_format.h: int8 and intmp, or fp8, fp8_full and
  // nanoo_fp8); a chip without that MXU rate runs them at its bf16 peak.
  bool int8_matmuls = false;
  bool fp8_matmuls = false;
  // Which weight matmuls a quantization runs narrow (and pays a quantize pass for), by
  // MatmulPass: fp8 and AQT int8 all three (int8 leaves drhs bf16 when
  // quantization_local_shard_count=0). Attention kernels stay bf16.
  bool quantized_pass[3] = {false, false, false};
  // Whose scales are found at run time ("absmax" calibration: an extra read of the operand before
  // each quantized matmul) rather than fixed: weights, forward activations, gradients.
  bool dynamic_scale_weights = true;
  bool dynamic_scale_activations = true;
  bool dynamic_scale_gradients = true;
  // AQT int8 rounds the gradient operand of its backward matmuls stochastically (MaxText's
  // rng_type="jax.uniform"): one 32-bit noise element per gradient element, generated to HBM and
  // read back by the quantize fusion.
  bool stochastic_rounding_gradients = false;
  // The dropless MoE expert matmuls are left unquantized by MaxText (bf16 at any quantization):
  // jax.lax.ragged_dot (sparse_matmul without megablox/tokamax) under AQT, whose kernel is
  // quantized only when serving, and any grouped matmul under qwix other than fp8_full (the only
  // mode whose rule names gmm and ragged_dot).
  bool unquantized_experts = false;
  // The backward matmuls take the forward's quantized activation and weight as residuals (qwix
  // fp8_full: QtRule.bwd_use_original_residuals is False), so only the gradient is scaled there.
  bool quantized_residuals = false;
  // Dropless grouped matmuls run as megablox kernels (sparse_matmul and megablox): tiles by
  // weight (0: wi, 1: wo) and MatmulPass.
  bool megablox = false;
  GroupedMatmulTiles megablox_tiles[2][3];
  // Every expert gets the same number of rows, laid out back to back (a kernel benchmark's
  // balanced groups; `tpusim op matmul groups=G`): a row tile straddles two experts only where
  // their boundary falls inside it. Routed tokens in training are ragged: nearly every boundary
  // does.
  bool balanced_groups = false;
  // MaxText's use_custom_sort_vjp: the backward of the routing gathers applies the inverse
  // permutation (a gather) rather than XLA's scatter-add transpose of a gather.
  bool custom_sort_vjp = true;
  // MaxText's mlp_bias on the dropless path (sparse_matmul): each routed row adds its expert's
  // wi_0, wi_1 and wo biases, gathered by expert id (moe.py transform_bias), so the backward
  // scatter-adds every routed gradient row of the expert matmuls into its expert's bias.
  bool routed_expert_biases = false;
  // MaxText's unquantized tokamax path (use_tokamax_gmm, no quantization, use_gmm_v2=false) calls
  // tokamax.ragged_dot without a tiling: tokamax's own tiles (sim/perf/tokamax_gmm_tiling.h), not
  // megablox_tiles, under the tokamax_gmm_tiles mechanism.
  bool tokamax_own_tiles = false;
  // Grouped matmuls run as tokamax's gmm_v2 kernel (`tpusim op matmul groups=G`, as the published
  // kernel benchmarks time it; MaxText's use_gmm_v2): a fixed cost per step of its pipeline grid
  // under the gmm_v2_grid_steps mechanism.
  bool gmm_v2 = false;
  // Fraction of the isolated-kernel roofline reached inside a training program (the chip's
  // program_efficiency); 1 for a single op timed alone (`tpusim op`).
  double program_efficiency = 1.0;
  // The mechanisms of common/mechanisms.h switched on (all unless `--without`), for op costs and
  // the scheduler; part of the context, so costs cached per context tell them apart.
  MechanismSet mechanisms;
  bool operator==(const CostContext&) const = default;
};

struct OpCost {
  double seconds = 0;
  double mxu_seconds = 0;
  double hbm_seconds = 0;
  double vpu_seconds = 0;
  double matmul_flops = 0;  // executed on the MXU (with padding waste excluded)
  CostCategory bound = CostCategory::kOverhead;
};

// Cost of a non-collective op. `fused` marks an elementwise op fused into its producer.
OpCost cost_compute_op(const Graph& graph, const Op& op, const CostContext& context, bool fused);

// The tensors whose shapes, dtypes and kinds cost_compute_op reads for `op`, appended to `tensors`
// (repeats included): its inputs and outputs and, for the scale of a quantized weight, the chain
// each input is gathered or cast from (weight_scale_on_shard). With the same op attributes and
// context, the same shapes of these give the same cost (resized_op_costs.h memoizes on it).
void tensors_cost_reads(const Graph& graph, const Op& op, std::vector<TensorId>& tensors);

// True when `a` and `b` differ at most in the attention kernel and its splash blocks, which only
// attention ops' costs read (op_kind_traits' attention): every other op costs the same under both.
bool same_outside_attention(const CostContext& a, const CostContext& b);

// The MXU rate of a matmul per device, FLOP/s: the quantization's narrow type when `narrow` (chips
// without that MXU mode run it at the bf16 rate), else bf16.
double peak_flops_per_device(const CostContext& context, bool narrow);

// The achievable HBM bandwidth of one device, bytes/s (a cost's hbm_seconds are bytes over it).
double hbm_bytes_per_second(const ChipSpec& chip);
// The VPU rate of one device, FLOP/s (a cost's vpu_seconds are vector FLOPs over it).
double vpu_flops_per_second(const ChipSpec& chip);

// MXU padding efficiency of a matmul with m rows, k contracted and n output columns.
double mxu_padding_efficiency(const ChipSpec& chip, double m, double k, double n);

// HBM bytes a matmul moves with the VMEM blocking that fits (operands and output in bytes).
double blocked_matmul_hbm_bytes(const ChipSpec& chip, double m, double k, double n,
                                double lhs_element_bytes, double rhs_element_bytes,
                                double out_element_bytes);

}  // namespace tpusim
