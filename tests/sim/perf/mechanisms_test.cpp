// The named cost mechanisms of common/mechanisms.h: each against a hand-computed case, each
// switched off to show it is what moves the number, and the v7x optimization guide's ablations
// (docs/reference/hardware.md §4) in the direction the guide reports.
#include "common/mechanisms.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "hw/catalog.h"
#include "hw/slice.h"
#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/mesh.h"
#include "sim/estimate/estimate.h"
#include "sim/perf/collective_cost.h"
#include "sim/perf/op_cost.h"

namespace tpusim {
namespace {

// The MXU's fill and drain of one matmul, from the chip's catalog entry (cycles at its clock).
double fill_drain_seconds(const ChipSpec& chip) {
  return chip.mxu_fill_drain_cycles / (chip.clock_ghz * 1e9);
}

const ChipSpec& chip(const char* name) {
  return HardwareCatalog::builtin().chip(name);
}

double bf16_flops_per_device(const ChipSpec& spec) {
  return spec.peak_bf16_tflops * 1e12 / spec.devices_per_chip * spec.mxu_achievable_fraction;
}

double hbm_bytes_per_device(const ChipSpec& spec) {
  return spec.hbm_bandwidth_gbps * 1e9 * spec.hbm_achievable_fraction / spec.devices_per_chip;
}

// The forward grouped matmul of a dropless MoE: rows[experts, expert_tokens, embed] x
// wi[experts, embed, mlp], every expert's `rows_per_expert` rows routed; the op is named `name`.
Graph grouped_matmul_graph(int64_t experts, int64_t rows_per_expert, int64_t embed, int64_t mlp,
                           const std::string& name = "moe/experts/wi_0") {
  Graph graph;
  const int region = graph.add_region("moe", 1, Phase::kForward);
  const TensorId rows =
      graph.add_tensor("moe/dispatched",
                       {Dim{"experts", experts, ""}, Dim{"expert_tokens", rows_per_expert, ""},
                        Dim{"embed", embed, ""}},
                       DType::kBF16, TensorKind::kActivation, region);
  const TensorId weight =
      graph.add_tensor("moe/experts/wi_0/cast",
                       {Dim{"experts", experts, ""}, Dim{"embed", embed, ""}, Dim{"mlp", mlp, ""}},
                       DType::kBF16, TensorKind::kActivation, region);
  const TensorId out = graph.add_tensor(
      "moe/experts/wi_0",
      {Dim{"experts", experts, ""}, Dim{"expert_tokens", rows_per_expert, ""}, Dim{"mlp", mlp, ""}},
      DType::kBF16, TensorKind::kActivation, region);
  OpAttrs attrs;
  attrs.contracted = {"embed"};
  attrs.routed_fraction = 1.0;
  graph.add_op(OpKind::kEinsum, name, {rows, weight}, {out}, attrs, region);
  return graph;
}

CostContext megablox_context(const ChipSpec& spec, int64_t tile_rows, int64_t tile_embed,
                             int64_t tile_mlp) {
  CostContext context;
  context.chip = &spec;
  context.megablox = true;
  for (auto& weight : context.megablox_tiles) {
    for (GroupedMatmulTiles& tiles : weight) {
      tiles = {tile_rows, tile_embed, tile_mlp};
    }
  }
  return context;
}

// 8 experts x 1024 rows in 512-row tiles: 16 tiles of work, but 7 expert boundaries that do not
// fall on a tile edge... here they do (1024 = 2 x 512), yet megablox still visits a boundary tile
// once per expert it holds: ceil(8192 / 512) + 8 - 1 = 23 visits of 512 x 1024 x 1024.
TEST(GroupedMatmulTiles, VisitsOneRowTilePerExpertItStraddles) {
  const ChipSpec& v7x = chip("v7x");
  const Graph graph = grouped_matmul_graph(8, 1024, 1024, 1024);
  const CostContext context = megablox_context(v7x, 512, 1024, 1024);
  const OpCost cost = cost_compute_op(graph, graph.ops().front(), context, false);
  const double fill = fill_drain_seconds(v7x);
  const double executed = 2.0 * 23 * 512 * 1024 * 1024;
  EXPECT_NEAR((cost.mxu_seconds - fill) / (executed / bf16_flops_per_device(v7x)), 1.0, 1e-9);
  // The useful FLOPs stay the routed rows' (what the functional engine multiplies).
  EXPECT_DOUBLE_EQ(cost.matmul_flops, 2.0 * 8 * 1024 * 1024 * 1024);
  // Switched off, the grouped matmul is costed as a dense matmul of the routed rows: 16/23.
  CostContext without = context;
  without.mechanisms = MechanismSet::without({"grouped_matmul_tiles"});
  const OpCost plain = cost_compute_op(graph, graph.ops().front(), without, false);
  EXPECT_NEAR((plain.mxu_seconds - fill) / (cost.mxu_seconds - fill), 16.0 / 23.0, 1e-9);
}

// Tiles wider than a dim pad nothing (MaxText clamps them); a dim that is not a multiple of its
// tile pads up to whole tiles: mlp 1536 in 1024-wide tiles computes 2048 columns.
TEST(GroupedMatmulTiles, PadsDimsToWholeTiles) {
  const ChipSpec& v7x = chip("v7x");
  const Graph graph = grouped_matmul_graph(4, 2048, 4096, 1536);
  const double fill = fill_drain_seconds(v7x);
  const OpCost padded =
      cost_compute_op(graph, graph.ops().front(), megablox_context(v7x, 2048, 4096, 1024), false);
  const OpCost whole =
      cost_compute_op(graph, graph.ops().front(), megablox_context(v7x, 2048, 4096, 1536), false);
  EXPECT_NEAR((padded.mxu_seconds - fill) / (whole.mxu_seconds - fill), 2048.0 / 1536.0, 1e-9);
}

// With the whole contraction in one tile, an expert's weight stays in VMEM across its row
// tiles (fetched once per expert); split in two, it is fetched again for every row tile.
TEST(GroupedMatmulTiles, WholeContractionTileFetchesWeightsOnce) {
  const ChipSpec& v7x = chip("v7x");
  const Graph graph = grouped_matmul_graph(8, 1024, 2048, 1024);
  const double visits = 8192.0 / 256 + 8 - 1;
  const double rows_read = visits * 256 * 2048 * 2;  // one column tile
  const double out_written = visits * 256 * 1024 * 2;
  const OpCost once =
      cost_compute_op(graph, graph.ops().front(), megablox_context(v7x, 256, 2048, 1024), false);
  EXPECT_NEAR(once.hbm_seconds * hbm_bytes_per_device(v7x),
              rows_read + out_written + 8.0 * 2048 * 1024 * 2, 1.0);
  const OpCost every =
      cost_compute_op(graph, graph.ops().front(), megablox_context(v7x, 256, 1024, 1024), false);
  EXPECT_NEAR(every.hbm_seconds * hbm_bytes_per_device(v7x),
              rows_read + out_written + visits * 2048 * 1024 * 2, 1.0);
}

// A lone weight matmul (no token dims anywhere: the forward pass) under fp8 on v7x runs at the
// fp8 rate; with absmax scales it first reads both bf16 operands once more.
TEST(QuantizeScalePass, AbsmaxReadsEachOperandOnce) {
  const ChipSpec& v7x = chip("v7x");
  Graph graph;
  const int region = graph.add_region("r", 1, Phase::kForward);
  const TensorId x = graph.add_tensor("x", {Dim{"m", 8192, ""}, Dim{"k", 8192, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  const TensorId w = graph.add_tensor("w", {Dim{"k", 8192, ""}, Dim{"n", 8192, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  const TensorId y = graph.add_tensor("y", {Dim{"m", 8192, ""}, Dim{"n", 8192, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  OpAttrs attrs;
  attrs.contracted = {"k"};
  graph.add_op(OpKind::kEinsum, "y", {x, w}, {y}, attrs, region);
  CostContext context;
  context.chip = &v7x;
  const OpCost bf16 = cost_compute_op(graph, graph.ops().front(), context, false);
  context.fp8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] = true;
  context.dynamic_scale_weights = false;
  context.dynamic_scale_activations = false;
  const OpCost fixed = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(fixed.mxu_seconds / bf16.mxu_seconds, 0.5, 1e-3);  // fp8 doubles the MXU rate
  context.dynamic_scale_weights = true;
  context.dynamic_scale_activations = true;
  const OpCost absmax = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR((absmax.seconds - fixed.seconds) * hbm_bytes_per_device(v7x), 2.0 * 8192 * 8192 * 2,
              1.0);
  context.mechanisms = MechanismSet::without({"quantize_scale_pass"});
  EXPECT_DOUBLE_EQ(cost_compute_op(graph, graph.ops().front(), context, false).seconds,
                   fixed.seconds);
}

// The input-gradient matmul of a weight under AQT int8 on v6e: dx[batch, k] = dy[batch, n] x
// w[k, n]. With stochastic rounding the gradient dy gets a float32 noise tensor, written and read
// back (8 bytes per element of dy); the weight (no token dims, not a gradient) gets none.
TEST(AqtStochasticRounding, NoiseWrittenAndReadPerGradientElement) {
  const ChipSpec& v6e = chip("v6e");
  Graph graph;
  const int region = graph.add_region("r", 1, Phase::kBackward);
  const TensorId dy = graph.add_tensor("dy", {Dim{"batch", 8192, ""}, Dim{"n", 4096, ""}},
                                       DType::kBF16, TensorKind::kGradient, region);
  const TensorId w = graph.add_tensor("w", {Dim{"k", 2048, ""}, Dim{"n", 4096, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  const TensorId dx = graph.add_tensor("dx", {Dim{"batch", 8192, ""}, Dim{"k", 2048, ""}},
                                       DType::kBF16, TensorKind::kGradient, region);
  OpAttrs attrs;
  attrs.contracted = {"n"};
  graph.add_op(OpKind::kEinsum, "dx", {dy, w}, {dx}, attrs, region);
  CostContext context;
  context.chip = &v6e;
  context.int8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kInputGrad)] = true;
  const OpCost plain = cost_compute_op(graph, graph.ops().front(), context, false);
  context.stochastic_rounding_gradients = true;
  const OpCost noisy = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR((noisy.seconds - plain.seconds) * hbm_bytes_per_device(v6e), 8.0 * 8192 * 4096, 1.0);
  context.mechanisms = MechanismSet::without({"aqt_stochastic_rounding"});
  EXPECT_DOUBLE_EQ(cost_compute_op(graph, graph.ops().front(), context, false).seconds,
                   plain.seconds);
}

// A forward weight matmul whose bf16 weight is all-gathered from a 1/8 shard: its absmax scale
// pass reads the activation whole but only the weight's shard.
TEST(WeightScaleOnShard, ScalePassReadsTheWeightShard) {
  const ChipSpec& v7x = chip("v7x");
  Graph graph;
  const int region = graph.add_region("r", 1, Phase::kForward);
  const TensorId x = graph.add_tensor("x", {Dim{"batch", 8192, ""}, Dim{"k", 8192, ""}},
                                      DType::kBF16, TensorKind::kActivation, region);
  const TensorId shard = graph.add_tensor("w_shard", {Dim{"k", 1024, ""}, Dim{"n", 8192, ""}},
                                          DType::kBF16, TensorKind::kActivation, region);
  const TensorId w = graph.add_tensor("w", {Dim{"k", 8192, ""}, Dim{"n", 8192, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  const TensorId y = graph.add_tensor("y", {Dim{"batch", 8192, ""}, Dim{"n", 8192, ""}},
                                      DType::kBF16, TensorKind::kActivation, region);
  graph.add_op(OpKind::kAllGather, "w", {shard}, {w}, OpAttrs{}, region);
  OpAttrs attrs;
  attrs.contracted = {"k"};
  graph.add_op(OpKind::kEinsum, "y", {x, w}, {y}, attrs, region);
  const Op& einsum = graph.ops().back();
  CostContext context;
  context.chip = &v7x;
  context.fp8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] = true;
  context.dynamic_scale_weights = false;
  context.dynamic_scale_activations = false;
  const OpCost fixed = cost_compute_op(graph, einsum, context, false);
  context.dynamic_scale_weights = true;
  context.dynamic_scale_activations = true;
  const OpCost on_shard = cost_compute_op(graph, einsum, context, false);
  const double activation_bytes = 8192.0 * 8192 * 2;
  EXPECT_NEAR((on_shard.seconds - fixed.seconds) * hbm_bytes_per_device(v7x),
              activation_bytes + activation_bytes / 8, 1.0);
  context.mechanisms = MechanismSet::without({"weight_scale_on_shard"});
  const OpCost gathered = cost_compute_op(graph, einsum, context, false);
  EXPECT_NEAR((gathered.seconds - fixed.seconds) * hbm_bytes_per_device(v7x), 2 * activation_bytes,
              1.0);
}

// How each quantization mode is read (MaxText quantizations.py, pyconfig.py, fp8_ops): AQT int8
// runs all three passes int8 and rounds gradients stochastically; quantization_local_shard_count=0
// keeps its weight gradient bf16; qwix int8 has no noise; GPU fp8's delayed scaling has no pass
// before the matmul.
TEST(QuantizationModes, WhichPassesRunNarrowAndWhatTheyPay) {
  auto options = [](std::vector<std::string> overrides) {
    overrides.emplace_back("model_name=llama3.1-8b");
    const Config config = Config::load("", overrides);
    return perf_options_from_config(config, *build_step_program(config).slice.chip).cost;
  };
  const size_t drhs = static_cast<size_t>(MatmulPass::kWeightGrad);
  const CostContext aqt = options({"compile_topology=v6e-8", "quantization=int8"});
  EXPECT_TRUE(aqt.quantized_pass[drhs]);
  EXPECT_TRUE(aqt.stochastic_rounding_gradients);
  const CostContext local =
      options({"compile_topology=v6e-8", "quantization=int8", "quantization_local_shard_count=0"});
  EXPECT_FALSE(local.quantized_pass[drhs]);
  EXPECT_TRUE(local.quantized_pass[static_cast<size_t>(MatmulPass::kInputGrad)]);
  const CostContext qwix =
      options({"compile_topology=v6e-8", "quantization=int8", "use_qwix_quantization=true"});
  EXPECT_TRUE(qwix.quantized_pass[drhs]);
  EXPECT_FALSE(qwix.stochastic_rounding_gradients);
  const CostContext tpu_fp8 = options({"compile_topology=tpu7x-16", "quantization=fp8_full"});
  EXPECT_FALSE(tpu_fp8.stochastic_rounding_gradients);
  EXPECT_TRUE(tpu_fp8.dynamic_scale_weights && tpu_fp8.dynamic_scale_gradients);
  const CostContext gpu_fp8 = options({"hardware=gpu", "compile_topology=a3", "quantization=fp8"});
  EXPECT_FALSE(gpu_fp8.dynamic_scale_weights || gpu_fp8.dynamic_scale_activations ||
               gpu_fp8.dynamic_scale_gradients);
}

// Which dropless expert matmuls MaxText quantizes (moe.py gmm, megablox/ops.py): AQT leaves
// jax.lax.ragged_dot (no megablox/tokamax) bf16 in training; under qwix only fp8_full has a rule
// for the grouped matmul; AQT through megablox quantizes in the kernel.
TEST(Bf16ExpertMatmuls, WhichQuantizationsReachTheExperts) {
  auto options = [](std::vector<std::string> overrides) {
    overrides.emplace_back("model_name=mixtral-8x7b");
    overrides.emplace_back("compile_topology=v6e-256");
    const Config config = Config::load("", overrides);
    return perf_options_from_config(config, *build_step_program(config).slice.chip).cost;
  };
  EXPECT_TRUE(options({"quantization=int8", "megablox=false"}).unquantized_experts);
  EXPECT_FALSE(options({"quantization=int8", "megablox=true"}).unquantized_experts);
  EXPECT_FALSE(
      options({"quantization=int8", "megablox=false", "sparse_matmul=false"}).unquantized_experts);
  EXPECT_TRUE(options({"quantization=fp8", "use_qwix_quantization=true"}).unquantized_experts);
  EXPECT_FALSE(options({"quantization=fp8_full", "use_qwix_quantization=true", "megablox=false"})
                   .unquantized_experts);
  EXPECT_TRUE(options({"quantization=int8", "use_qwix_quantization=true", "megablox=false"})
                  .unquantized_experts);
  EXPECT_FALSE(
      options({"quantization=fp8_full", "use_qwix_quantization=true"}).unquantized_experts);
  EXPECT_FALSE(options({"megablox=false"}).unquantized_experts);
  EXPECT_TRUE(options({"quantization=fp8_full", "use_qwix_quantization=true"}).quantized_residuals);
  EXPECT_FALSE(options({"quantization=fp8_full"}).quantized_residuals);
}

// An expert matmul left unquantized costs what it does in bf16: no int8 rate, no scale pass;
// switched off, it runs int8 and pays the scale pass.
TEST(Bf16ExpertMatmuls, UnquantizedExpertsCostTheirBf16Time) {
  const ChipSpec& v6e = chip("v6e");
  const Graph graph = grouped_matmul_graph(8, 4096, 4096, 14336);
  CostContext context;
  context.chip = &v6e;
  const OpCost bf16 = cost_compute_op(graph, graph.ops().front(), context, false);
  context.int8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] = true;
  context.unquantized_experts = true;
  EXPECT_DOUBLE_EQ(cost_compute_op(graph, graph.ops().front(), context, false).seconds,
                   bf16.seconds);
  context.mechanisms = MechanismSet::without({"bf16_expert_matmuls"});
  const OpCost narrow = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(
      narrow.mxu_seconds - fill_drain_seconds(v6e),
      (bf16.mxu_seconds - fill_drain_seconds(v6e)) * v6e.peak_bf16_tflops / v6e.peak_int8_tops,
      1e-12);
}

// A forward fp8 grouped matmul with fixed scales (no absmax pass): XLA casts the bf16 rows and
// the gathered weight to 1 byte before the kernel (read 2, write 1 per element) and the kernel
// reads both at 1 byte. wi_1 shares wi_0's input, so only its weight is cast.
TEST(GroupedMatmulQuantizePass, CastsEachOperandBeforeTheKernel) {
  const ChipSpec& v7x = chip("v7x");
  const Graph graph = grouped_matmul_graph(8, 1024, 2048, 1024);
  CostContext context = megablox_context(v7x, 256, 2048, 1024);
  context.fp8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] = true;
  context.dynamic_scale_weights = false;
  context.dynamic_scale_activations = false;
  const double visits = 8192.0 / 256 + 8 - 1;
  const double out_written = visits * 256 * 1024 * 2;
  const double rows = 8.0 * 1024 * 2048;
  const double weights = 8.0 * 2048 * 1024;
  const OpCost cast = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(cast.hbm_seconds * hbm_bytes_per_device(v7x),
              visits * 256 * 2048 * 1 + out_written + weights * 1 + 3 * rows + 3 * weights, 1.0);
  context.mechanisms = MechanismSet::without({"grouped_matmul_quantize_pass"});
  const OpCost uncast = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(uncast.hbm_seconds * hbm_bytes_per_device(v7x),
              visits * 256 * 2048 * 2 + out_written + weights * 1, 1.0);
  const Graph wi_1 = grouped_matmul_graph(8, 1024, 2048, 1024, "moe/experts/wi_1");
  context.mechanisms = MechanismSet();
  EXPECT_NEAR(
      (cast.hbm_seconds - cost_compute_op(wi_1, wi_1.ops().front(), context, false).hbm_seconds) *
          hbm_bytes_per_device(v7x),
      3 * rows, 1.0);
}

// Mixtral 8x7B's forward dispatch on one v6e device of the int8 run (MaxText's dense MoE path:
// per-device batch 8 x 4096 tokens, 8 experts x capacity 1280, embed 4096): a one-hot einsum
// tokens x mask -> [experts, batch, capacity, embed]. Under AQT int8 it is a quantized einsum, so
// its matmul runs at the int8 rate after the absmax passes over its operands. MaxText PR #1036
// measured the forward dispatch of an int8 run at 2.455 ms quantized against 3.739 ms in bf16
// (0.657); switched off, the MXU time is the bf16 one.
TEST(NarrowDenseMoeExchange, QuantizedDispatchRunsAtTheInt8Rate) {
  const ChipSpec& v6e = chip("v6e");
  Graph graph;
  const int region = graph.add_region("moe", 1, Phase::kForward);
  const TensorId tokens = graph.add_tensor(
      "pre_mlp_norm", {Dim{"batch", 8, ""}, Dim{"length", 4096, ""}, Dim{"embed", 4096, ""}},
      DType::kBF16, TensorKind::kActivation, region);
  const TensorId mask = graph.add_tensor("moe/dispatch_mask",
                                         {Dim{"batch", 8, ""}, Dim{"length", 4096, ""},
                                          Dim{"experts", 8, ""}, Dim{"capacity", 1280, ""}},
                                         DType::kBF16, TensorKind::kActivation, region);
  const TensorId dispatched = graph.add_tensor("moe/dispatched",
                                               {Dim{"experts", 8, ""}, Dim{"batch", 8, ""},
                                                Dim{"capacity", 1280, ""}, Dim{"embed", 4096, ""}},
                                               DType::kBF16, TensorKind::kActivation, region);
  OpAttrs attrs;
  attrs.capacity_factor = 1.25;
  graph.add_op(OpKind::kMoeDispatch, "moe/dispatch", {tokens, mask}, {dispatched}, attrs, region);
  const Op& dispatch = graph.ops().front();
  CostContext context;
  context.chip = &v6e;
  const OpCost bf16 = cost_compute_op(graph, dispatch, context, false);
  context.int8_matmuls = true;
  for (bool& quantized : context.quantized_pass) {
    quantized = true;
  }
  context.dynamic_scale_activations = true;
  context.dynamic_scale_weights = true;
  context.stochastic_rounding_gradients = true;
  const OpCost int8 = cost_compute_op(graph, dispatch, context, false);
  EXPECT_NEAR(int8.mxu_seconds / bf16.mxu_seconds, v6e.peak_bf16_tflops / v6e.peak_int8_tops,
              1e-12);
  EXPECT_NEAR(int8.seconds / bf16.seconds, 2.455 / 3.739, 0.1);
  context.mechanisms = MechanismSet::without({"narrow_dense_moe_exchange"});
  const OpCost off = cost_compute_op(graph, dispatch, context, false);
  EXPECT_DOUBLE_EQ(off.mxu_seconds, bf16.mxu_seconds);
  EXPECT_GT(off.seconds, bf16.seconds);  // bf16 matmul plus the quantize passes
}

// The weight-gradient matmul of a dense layer under qwix fp8_full with absmax scales: dW = x^T dy.
// The forward's quantized x is its residual (qwix bwd_use_original_residuals=False), so the
// absmax pass reads dy only; switched off, x as well.
TEST(QuantizedResiduals, WeightGradientScalesOnlyTheGradient) {
  const ChipSpec& v7x = chip("v7x");
  Graph graph;
  const int region = graph.add_region("r", 1, Phase::kBackward);
  const TensorId x = graph.add_tensor("x", {Dim{"batch", 8192, ""}, Dim{"k", 4096, ""}},
                                      DType::kBF16, TensorKind::kActivation, region);
  const TensorId dy = graph.add_tensor("dy", {Dim{"batch", 8192, ""}, Dim{"n", 2048, ""}},
                                       DType::kBF16, TensorKind::kGradient, region);
  const TensorId dw = graph.add_tensor("dw", {Dim{"k", 4096, ""}, Dim{"n", 2048, ""}}, DType::kBF16,
                                       TensorKind::kParameterGrad, region);
  OpAttrs attrs;
  attrs.contracted = {"batch"};
  graph.add_op(OpKind::kEinsum, "dw", {x, dy}, {dw}, attrs, region);
  CostContext context;
  context.chip = &v7x;
  context.fp8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kWeightGrad)] = true;
  context.quantized_residuals = true;
  context.mechanisms = MechanismSet::without({"quantize_scale_pass"});
  const OpCost no_pass = cost_compute_op(graph, graph.ops().front(), context, false);
  context.mechanisms = MechanismSet();
  const OpCost reused = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR((reused.seconds - no_pass.seconds) * hbm_bytes_per_device(v7x), 8192.0 * 2048 * 2,
              1.0);
  context.mechanisms = MechanismSet::without({"quantized_residuals"});
  const OpCost rescaled = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR((rescaled.seconds - no_pass.seconds) * hbm_bytes_per_device(v7x),
              8192.0 * 2048 * 2 + 8192.0 * 4096 * 2, 1.0);
}

double profiled_seconds(const Estimate& estimate, const std::string& op_prefix) {
  double seconds = 0;
  for (const OpProfile& op : estimate.timing.profile) {
    if (op.op.rfind(op_prefix, 0) == 0) {
      seconds += op.seconds;
    }
  }
  return seconds;
}

// A mechanism that keeps some ops of an fp8_full step at the bf16 rate: llama3.1-8b at 8k on
// tpu7x-16, the seconds of the ops named `op_prefix` in bf16, in fp8_full, and in fp8_full with
// `mechanism` switched off.
struct Fp8Seconds {
  double bf16 = 0;
  double fp8 = 0;
  double fp8_without = 0;
  double mlp_bf16 = 0;  // of the MLP's einsums, which fp8 does speed up
  double mlp_fp8 = 0;
};

Fp8Seconds fp8_seconds(const std::string& op_prefix, const std::string& mechanism) {
  const std::vector<std::string> base = {"model_name=llama3.1-8b", "compile_topology=tpu7x-16",
                                         "max_target_length=8192", "per_device_batch_size=1"};
  std::vector<std::string> fp8 = base;
  fp8.emplace_back("quantization=fp8_full");
  const Estimate plain = estimate_config(Config::load("", base));
  const Estimate quantized = estimate_config(Config::load("", fp8));
  const Estimate without =
      estimate_config(Config::load("", fp8), MechanismSet::without({mechanism}));
  return {profiled_seconds(plain, op_prefix), profiled_seconds(quantized, op_prefix),
          profiled_seconds(without, op_prefix), profiled_seconds(plain, "einsum mlp/"),
          profiled_seconds(quantized, "einsum mlp/")};
}

// fp8_full quantizes the layers' matmuls, not the splash attention kernel.
TEST(Bf16Attention, Fp8LeavesAttentionAlone) {
  const Fp8Seconds attention = fp8_seconds("attention", "bf16_attention");
  ASSERT_GT(attention.bf16, 0);
  EXPECT_DOUBLE_EQ(attention.fp8, attention.bf16);
  EXPECT_LT(attention.mlp_fp8, 0.8 * attention.mlp_bf16);  // the layers' matmuls speed up
  EXPECT_LT(attention.fp8_without, 0.9 * attention.bf16);
}

// MaxText does not quantize the logits matmul (decoders.py), so under fp8_full the unembedding
// and its two gradients keep their bf16 time while the layers' matmuls speed up.
TEST(Bf16Logits, Fp8LeavesTheLogitsMatmulAlone) {
  const Fp8Seconds logits = fp8_seconds("einsum logits", "bf16_logits");
  ASSERT_GT(logits.bf16, 0);
  EXPECT_DOUBLE_EQ(logits.fp8, logits.bf16);
  EXPECT_LT(logits.fp8_without, 0.8 * logits.bf16);
}

// An all-gather over the chiplet pair and the torus: each chip must bring in all it lacks over
// its torus links, however fast D2D is: (N - 2)/N x V over the chip's 2 x (per-device) links.
TEST(ChipIngressBound, ChipletPairCannotCarryTheTorusShare) {
  const Slice v7x = parse_slice("tpu7x-128");  // 4x4x4 chips, every axis wraps
  const DeviceMesh mesh =
      place_mesh(resolve_mesh(Config::load("", {"compile_topology=tpu7x-128"}), v7x), v7x);
  const double bytes = 1e9;
  const CollectiveTime time = collective_time(OpKind::kAllGather, bytes, {"fsdp"}, mesh, v7x);
  const ChipSpec& spec = *v7x.chip;
  const double per_device_torus =
      3 * 2 * spec.ici_link_bandwidth_uni_gbps * 1e9 * spec.ici_achievable_fraction / 2;
  EXPECT_NEAR(time.ici_seconds, 126.0 / 128 * bytes / (2 * per_device_torus), 1e-9);
  const MechanismSet off = MechanismSet::without({"chip_ingress_bound"});
  EXPECT_LT(collective_time(OpKind::kAllGather, bytes, {"fsdp"}, mesh, v7x, off).ici_seconds,
            0.6 * time.ici_seconds);
}

// The mesh of `overrides` placed on `slice`.
DeviceMesh mesh_on(const Slice& slice, const std::vector<std::string>& overrides) {
  return place_mesh(resolve_mesh(Config::load("", overrides), slice), slice);
}

// A chip's achievable DCN bandwidth per chip, from its catalog entry.
double dcn_bytes_per_second(const ChipSpec& spec) {
  return spec.dcn_bandwidth_per_chip_gbps * 1e9 * spec.dcn_achievable_fraction;
}

// FSDP across two slices: each device swaps its 1/512 shard over DCN, then ICI gathers the rest.
TEST(DcnShardsFirst, GatherAcrossSlicesMovesShardsOverDcn) {
  const Slice two = parse_slice("v6e-256", 2);
  const DeviceMesh mesh = mesh_on(two, {"compile_topology=v6e-256", "compile_topology_num_slices=2",
                                        "dcn_fsdp_parallelism=2", "dcn_data_parallelism=1"});
  const double bytes = 1e9;
  const CollectiveTime time = collective_time(OpKind::kAllGather, bytes, {"fsdp"}, mesh, two);
  const ChipSpec& spec = *two.chip;
  const double dcn = dcn_bytes_per_second(spec);
  const double one_step = spec.dcn_latency_us * 1e-6;  // one ring step across two slices
  EXPECT_NEAR(time.dcn_seconds, one_step + 0.5 * bytes / 256 / dcn, 1e-9);
  const MechanismSet off = MechanismSet::without({"dcn_shards_first"});
  EXPECT_NEAR(collective_time(OpKind::kAllGather, bytes, {"fsdp"}, mesh, two, off).dcn_seconds,
              one_step + 0.5 * bytes / dcn, 1e-9);
}

double step_seconds(const std::vector<std::string>& overrides,
                    const MechanismSet& mechanisms = MechanismSet()) {
  return estimate_config(Config::load("", overrides), mechanisms).step_seconds;
}

// A gradient all-reduce across 8 slices: 2 x 7 ring steps, each paying the DCN message latency
// on top of its bytes; without the mechanism, the larger of the latency and the bytes' time.
TEST(DcnStepLatency, RingStepsAcrossSlicesAddTheirLatency) {
  const Slice eight = parse_slice("v5e-256", 8);
  const DeviceMesh mesh =
      mesh_on(eight, {"compile_topology=v5e-256", "compile_topology_num_slices=8",
                      "dcn_data_parallelism=8", "ici_fsdp_parallelism=256"});
  const double bytes = 4e6;  // one layer's gradient shard on one chip
  const ChipSpec& spec = *eight.chip;
  const double dcn = dcn_bytes_per_second(spec);
  const double alpha = spec.dcn_latency_us * 1e-6;
  const double bandwidth_term = 2 * 7.0 / 8 * bytes / dcn;
  const CollectiveTime time = collective_time(OpKind::kAllReduce, bytes, {"data"}, mesh, eight);
  EXPECT_NEAR(time.dcn_seconds, 14 * alpha + bandwidth_term, 1e-12);
  EXPECT_NEAR(time.dcn_latency_seconds, 14 * alpha, 1e-12);
  const MechanismSet off = MechanismSet::without({"dcn_step_latency"});
  const CollectiveTime without =
      collective_time(OpKind::kAllReduce, bytes, {"data"}, mesh, eight, off);
  EXPECT_NEAR(without.dcn_seconds, 2 * std::max(7 * alpha, 7.0 / 8 * bytes / dcn), 1e-12);
  EXPECT_EQ(without.dcn_latency_seconds, 0.0);
  // A GPU cluster's fabric pipelines its steps: no latency on top.
  const Slice gpus = parse_slice("a3", 4);
  const DeviceMesh gpu_mesh =
      mesh_on(gpus, {"hardware=gpu", "compile_topology=a3", "compile_topology_num_slices=4",
                     "dcn_data_parallelism=4"});
  EXPECT_EQ(
      collective_time(OpKind::kAllReduce, bytes, {"data"}, gpu_mesh, gpus).dcn_latency_seconds,
      0.0);
}

// The TensorCore waits out the ring steps of each layer's gradient reductions across slices, so
// going from 1 to 32 slices costs at least their latency, and the latency and the bytes add up
// where without the mechanism only the larger counts.
TEST(DcnStepLatency, MoreSlicesWaitOutMoreSteps) {
  auto with_slices = [](int slices) {
    std::vector<std::string> overrides = {"model_name=llama2-7b", "compile_topology=v5e-256",
                                          "per_device_batch_size=2", "ici_fsdp_parallelism=256",
                                          "compile_topology_num_slices=" + std::to_string(slices)};
    if (slices > 1) {
      overrides.push_back("dcn_data_parallelism=" + std::to_string(slices));
    }
    return overrides;
  };
  // llama2-7b: 32 layers, each reducing its 7 weight gradients across slices in 2 x 31 steps.
  const double alpha = chip("v5e").dcn_latency_us * 1e-6;
  const double one = step_seconds(with_slices(1));
  const double many = step_seconds(with_slices(32));
  EXPECT_GT(many - one, 32 * 7 * 62 * alpha);
  const MechanismSet off = MechanismSet::without({"dcn_step_latency"});
  EXPECT_GT(many, step_seconds(with_slices(32), off));
}

// The v7x guide (64-chip slice, docs/reference/hardware.md §4 [MT-7]): SparseCore collective
// offload -22% for a dense model under 20B at 8k, -5% at 128k and -15% for a 110B MoE. With the
// offload off the collectives run as continuation fusion and the XLA fusions that carry their
// steps take continuation_fusion_tensorcore_share longer; that share was fitted to the two dense
// figures, the MoE one held out. The configurations are validation/pairs.csv's, fixed before the
// mechanism was measured against them; the bar is 5 points of the guide's figure each.
TEST(V7xGuideAblations, SparseCoreOffloadWithinFivePointsOfTheGuide) {
  const std::vector<std::string> dense = {"model_name=llama3.1-8b", "compile_topology=tpu7x-128",
                                          "remat_policy=full", "attention=flash"};
  auto with = [](std::vector<std::string> keys, const std::vector<std::string>& more) {
    keys.insert(keys.end(), more.begin(), more.end());
    return keys;
  };
  struct Ablation {
    std::vector<std::string> keys;
    double guide_ratio;  // step time with the offload over step time without
  };
  const std::vector<Ablation> ablations = {
      {with(dense,
            {"max_target_length=8192", "per_device_batch_size=2", "ici_fsdp_parallelism=-1"}),
       0.78},
      {with(dense, {"max_target_length=131072", "per_device_batch_size=0.25",
                    "ici_context_parallelism=4", "ici_fsdp_parallelism=-1"}),
       0.95},
      {{"model_name=llama4-17b-16e", "compile_topology=tpu7x-128", "max_target_length=8192",
        "per_device_batch_size=1", "ici_fsdp_parallelism=-1", "remat_policy=full",
        "attention=flash", "sparse_matmul=true", "megablox=true"},
       0.85},
  };
  const MechanismSet without = MechanismSet::without({"tensorcore_driven_collectives"});
  for (const Ablation& ablation : ablations) {
    SCOPED_TRACE(ablation.keys[0] + " " + ablation.keys[4]);
    const auto on = with(ablation.keys, {"sparse_core_collective_offload=on"});
    const auto off = with(ablation.keys, {"sparse_core_collective_offload=off"});
    EXPECT_NEAR(step_seconds(on) / step_seconds(off), ablation.guide_ratio, 0.05);
    // Without the mechanism the offload moves these steps by under 1%: it is what moves them.
    EXPECT_NEAR(step_seconds(on, without) / step_seconds(off, without), 1.0, 0.01);
  }
}

// Continuation fusion puts collective steps into XLA fusions only: splash attention (a Pallas
// kernel) takes as long with the offload off, a matmul fusion longer.
TEST(TensorCoreDrivenCollectives, PallasKernelsCarryNoCollectiveSteps) {
  const std::vector<std::string> keys = {"model_name=llama3.1-8b",  "compile_topology=tpu7x-16",
                                         "max_target_length=8192",  "per_device_batch_size=1",
                                         "ici_fsdp_parallelism=-1", "attention=flash"};
  auto seconds_of = [&](const char* offload, const char* op) {
    std::vector<std::string> run = keys;
    run.emplace_back(std::string("sparse_core_collective_offload=") + offload);
    double seconds = 0;
    for (const OpProfile& profile : estimate_config(Config::load("", run)).timing.profile) {
      seconds += profile.op == op ? profile.seconds : 0.0;
    }
    return seconds;
  };
  EXPECT_GT(seconds_of("on", "attention attention"), 0);
  EXPECT_DOUBLE_EQ(seconds_of("off", "attention attention"),
                   seconds_of("on", "attention attention"));
  EXPECT_GT(seconds_of("off", "einsum mlp/wi_0"), 1.2 * seconds_of("on", "einsum mlp/wi_0"));
}

TEST(V7xGuideAblations, TensorParallelOnTheChipletPairBeatsMoreContext) {
  const std::vector<std::string> base = {"model_name=llama3.1-8b",  "compile_topology=tpu7x-128",
                                         "max_target_length=32768", "per_device_batch_size=0.25",
                                         "remat_policy=full",       "ici_fsdp_parallelism=-1"};
  std::vector<std::string> tp_cp = base;
  tp_cp.insert(tp_cp.end(), {"ici_tensor_parallelism=2", "ici_context_parallelism=2"});
  std::vector<std::string> cp = base;
  cp.emplace_back("ici_context_parallelism=4");
  EXPECT_LT(step_seconds(tp_cp), step_seconds(cp));
}

// Splash with kv compute sub-blocks overlaps one sub-block's softmax with the next's matmuls.
TEST(AttentionSubblockPipelining, SubBlocksHideTheSoftmax) {
  const std::vector<std::string> base = {"model_name=llama3.1-8b",  "compile_topology=tpu7x-16",
                                         "max_target_length=32768", "per_device_batch_size=0.5",
                                         "sa_block_q=2048",         "sa_block_kv=2048"};
  std::vector<std::string> one = base;
  one.emplace_back("sa_block_kv_compute=2048");
  std::vector<std::string> four = base;
  four.emplace_back("sa_block_kv_compute=512");
  const double serial = profiled_seconds(estimate_config(Config::load("", one)), "attention");
  const double pipelined = profiled_seconds(estimate_config(Config::load("", four)), "attention");
  EXPECT_LT(pipelined, 0.9 * serial);
  const MechanismSet off = MechanismSet::without({"attention_subblock_pipelining"});
  EXPECT_DOUBLE_EQ(profiled_seconds(estimate_config(Config::load("", four), off), "attention"),
                   serial);
}

// gpt-oss-120b as the Ironwood README abbreviates its run (I-11 of validation/published.csv held
// these args until it took the recipe's, which offloads activations) ran on real TPUs: the logits'
// gradient written over the saved logits keeps it in HBM; without that reuse it does not fit.
TEST(InPlaceBuffers, PublishedGptOssRunFits) {
  const std::vector<std::string> run = {"model_name=gpt-oss-120b", "compile_topology=tpu7x-512",
                                        "max_target_length=8192",  "per_device_batch_size=10",
                                        "ici_data_parallelism=8",  "ici_fsdp_parallelism=64",
                                        "remat_policy=custom",     "attention=flash",
                                        "sparse_matmul=true"};
  EXPECT_TRUE(estimate_config(Config::load("", run)).memory.fits);
  EXPECT_FALSE(estimate_config(Config::load("", run), MechanismSet::without({"in_place_buffers"}))
                   .memory.fits);
  // A config that really cannot fit still does not.
  EXPECT_FALSE(
      estimate_config(Config::load("", {"model_name=llama3.1-405b", "compile_topology=v5e-8"}))
          .memory.fits);
}

// A dropless MoE's dispatch of 4096 tokens (top-8) into 64 experts x 512 rows of width 2048. With
// routed_row_gathers its routed side (64 x 512 x 2048 bf16 = 128 MiB, written row by row) moves at
// the catalog's routed_row_hbm_fraction of the HBM roofline; the tokens it reads stream at the
// roofline. GPUs keep the roofline (fraction 1: no MaxText MoE measurement there).
TEST(RoutedRowGathers, RoutedRowsMoveAtTheCatalogFraction) {
  Graph graph;
  const int region = graph.add_region("moe", 1, Phase::kForward);
  const TensorId tokens = graph.add_tensor(
      "pre_mlp_norm", {Dim{"batch", 2, ""}, Dim{"length", 2048, ""}, Dim{"embed", 2048, ""}},
      DType::kBF16, TensorKind::kActivation, region);
  const TensorId routing = graph.add_tensor(
      "moe/routing",
      {Dim{"batch", 2, ""}, Dim{"length", 2048, ""}, Dim{"top_k", 8, ""}, Dim{"route", 2, ""}},
      DType::kBF16, TensorKind::kActivation, region);
  const TensorId dispatched = graph.add_tensor(
      "moe/dispatched",
      {Dim{"experts", 64, ""}, Dim{"expert_tokens", 512, ""}, Dim{"embed", 2048, ""}}, DType::kBF16,
      TensorKind::kActivation, region);
  const TensorId row_experts =
      graph.add_tensor("moe/row_experts", {Dim{"experts", 64, ""}, Dim{"expert_tokens", 512, ""}},
                       DType::kI32, TensorKind::kActivation, region);
  graph.add_op(OpKind::kMoeDispatch, "moe/dispatch", {tokens, routing}, {dispatched, row_experts},
               OpAttrs{}, region);
  const Op& dispatch = graph.ops().back();
  const double routed_bytes = 64.0 * 512 * 2048 * 2;
  for (const char* name : {"v5p", "v7x", "h100-sxm"}) {
    const ChipSpec& spec = chip(name);
    CostContext context;
    context.chip = &spec;
    const OpCost on = cost_compute_op(graph, dispatch, context, false);
    context.mechanisms = MechanismSet::without({"routed_row_gathers"});
    const OpCost off = cost_compute_op(graph, dispatch, context, false);
    const double extra =
        routed_bytes / hbm_bytes_per_device(spec) * (1.0 / spec.routed_row_hbm_fraction - 1.0);
    EXPECT_NEAR(on.hbm_seconds - off.hbm_seconds, extra, 1e-9 * on.hbm_seconds) << name;
    if (spec.is_gpu()) {
      EXPECT_EQ(on.seconds, off.seconds) << name;
    } else {
      EXPECT_LT(spec.routed_row_hbm_fraction, 0.5) << name;
      EXPECT_GT(on.seconds, 5.0 * off.seconds) << name;
    }
  }
}

// Under fp8 quantization the expert weights reach the grouped matmul as fp8 (qwix quantizes them
// before the kernel): the weight reads of WholeContractionTileFetchesWeightsOnce at one byte.
// Without grouped_matmul_quantize_pass (GroupedMatmulQuantizePass below adds the casts and the
// narrow rows), only the weights are narrow.
TEST(GroupedMatmulTiles, QuantizedWeightsAreReadNarrow) {
  const ChipSpec& v7x = chip("v7x");
  const Graph graph = grouped_matmul_graph(8, 1024, 2048, 1024);
  const double visits = 8192.0 / 256 + 8 - 1;
  CostContext context = megablox_context(v7x, 256, 2048, 1024);
  context.mechanisms = MechanismSet::without({"grouped_matmul_quantize_pass"});
  context.fp8_matmuls = true;
  context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] = true;
  context.dynamic_scale_weights = false;
  context.dynamic_scale_activations = false;
  const OpCost cost = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(cost.hbm_seconds * hbm_bytes_per_device(v7x),
              visits * 256 * 2048 * 2 + visits * 256 * 1024 * 2 + 8.0 * 2048 * 1024 * 1, 1.0);
}

// A 128-row tile on v7x's 256-wide MXU takes it as long as a 256-row tile: 16 experts x 512
// balanced rows in 128-row tiles are 64 visits, each costed as 2 x 256 x 1024 x 1024. On v5p
// (128-wide) a 128-row tile fills the array and nothing changes.
TEST(GroupedMatmulMxuRows, RowTilesNarrowerThanTheMxuTakeAFullWidthPass) {
  const Graph graph = grouped_matmul_graph(16, 512, 1024, 1024);
  for (const char* name : {"v7x", "v5p"}) {
    const ChipSpec& spec = chip(name);
    CostContext context = megablox_context(spec, 128, 1024, 1024);
    context.balanced_groups = true;
    const double fill = fill_drain_seconds(spec);
    const OpCost on = cost_compute_op(graph, graph.ops().front(), context, false);
    const double rows_per_pass = std::max(128.0, spec.mxu_dim);
    const double executed = 2.0 * 64 * rows_per_pass * 1024 * 1024;
    EXPECT_NEAR((on.mxu_seconds - fill) / (executed / bf16_flops_per_device(spec)), 1.0, 1e-9)
        << name;
    context.mechanisms = MechanismSet::without({"grouped_matmul_mxu_rows"});
    const OpCost off = cost_compute_op(graph, graph.ops().front(), context, false);
    EXPECT_NEAR((on.mxu_seconds - fill) / (off.mxu_seconds - fill), rows_per_pass / 128.0, 1e-9)
        << name;
  }
}

// tokamax's gmm_v2 pays the chip's gmm_v2_grid_step_us per step of its (n tile, row tile, k tile)
// grid, on the MXU's side of the roofline, and a 128-row tile on v7x's 256-wide MXU costs its own
// rows: 16 experts x 512 balanced rows in 128-row tiles are 64 row visits; with the whole k and n
// in one tile that is 64 steps, with k split in two 128. Switched off, gmm_v2 is costed as
// megablox (a full-width pass per short tile, no step cost). The weight wait of
// gmm_v2_weight_prefetch is left out of both.
TEST(GmmV2GridSteps, EachGridStepCostsTheChipsStepTime) {
  const ChipSpec& v7x = chip("v7x");
  ASSERT_GT(v7x.gmm_v2_grid_step_us, 0.0);
  const Graph graph = grouped_matmul_graph(16, 512, 1024, 1024);
  const double fill = fill_drain_seconds(v7x);
  const double matmul = 2.0 * 64 * 128 * 1024 * 1024 / bf16_flops_per_device(v7x);
  for (const auto& [tile_k, steps] : {std::pair{1024, 64.0}, std::pair{512, 128.0}}) {
    CostContext context = megablox_context(v7x, 128, tile_k, 1024);
    context.balanced_groups = true;
    context.gmm_v2 = true;
    context.mechanisms = MechanismSet::without({"gmm_v2_weight_prefetch"});
    const OpCost on = cost_compute_op(graph, graph.ops().front(), context, false);
    EXPECT_NEAR(on.mxu_seconds, fill + matmul + steps * v7x.gmm_v2_grid_step_us * 1e-6, 1e-12)
        << tile_k;
    context.mechanisms = MechanismSet::without({"gmm_v2_grid_steps", "gmm_v2_weight_prefetch"});
    const OpCost off = cost_compute_op(graph, graph.ops().front(), context, false);
    EXPECT_NEAR(off.mxu_seconds, fill + 2.0 * matmul, 1e-12) << tile_k;
  }
}

// tokamax's gmm_v2 pipelines with Pallas's standard schedule, which fetches the next expert's
// weight block only in the grid step before that expert's first row tile. 4 v6e experts x 1024
// balanced rows in 128-row tiles with k 7168 and n 1024 whole are 8 steps per expert: each expert
// waits for 7 steps of its predecessor (matmul + step cost), the 14.7 MB block and the row and
// output tiles of the step in flight. That chain is longer than the 8 steps themselves (the
// mechanism binds); with 1024-row tiles (one step per expert, every step fetches a block: the HBM
// roofline's case) or switched off, the MXU side is the steps alone.
TEST(GmmV2WeightPrefetch, AnExpertWithMoreThanOneRowTileWaitsForItsWeights) {
  const ChipSpec& v6e = chip("v6e");
  const Graph graph = grouped_matmul_graph(4, 1024, 7168, 1024);
  const double fill = fill_drain_seconds(v6e);
  const double step_cost = v6e.gmm_v2_grid_step_us * 1e-6;
  const double step = 2.0 * 128 * 7168 * 1024 / bf16_flops_per_device(v6e) + step_cost;
  const double block = 7168.0 * 1024 * 2 / hbm_bytes_per_device(v6e);
  const double stream = (128.0 * 7168 * 2 + 128.0 * 1024 * 2) / hbm_bytes_per_device(v6e);
  CostContext context = megablox_context(v6e, 128, 7168, 1024);
  context.balanced_groups = true;
  context.gmm_v2 = true;
  const OpCost on = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(on.mxu_seconds, fill + 4 * (7 * step + block + stream), 1e-12);
  EXPECT_GT(on.mxu_seconds, fill + 4 * 8 * step);
  context.mechanisms = MechanismSet::without({"gmm_v2_weight_prefetch"});
  const OpCost off = cost_compute_op(graph, graph.ops().front(), context, false);
  EXPECT_NEAR(off.mxu_seconds, fill + 4 * 8 * step, 1e-12);

  CostContext whole = megablox_context(v6e, 1024, 7168, 1024);
  whole.balanced_groups = true;
  whole.gmm_v2 = true;
  const OpCost one_step = cost_compute_op(graph, graph.ops().front(), whole, false);
  const double whole_step = 2.0 * 1024 * 7168 * 1024 / bf16_flops_per_device(v6e) + step_cost;
  EXPECT_NEAR(one_step.mxu_seconds, fill + 4 * whole_step, 1e-12);
}

// gmm_v2 has no parallel grid dimension, so on a megacore device (v5p: two TensorCores per JAX
// device) Pallas runs it on one TensorCore: its matmuls take twice the device-rate time, its
// step costs and HBM bytes are unchanged. On v7x (one TensorCore per device) nothing changes;
// switched off, v5p's kernel runs at the device's rate.
TEST(GmmV2OneTensorCore, OnAMegacoreDeviceTheKernelHasHalfTheMxus) {
  const Graph graph = grouped_matmul_graph(16, 512, 1024, 1024);
  for (const char* name : {"v4", "v5p", "v7x"}) {
    const ChipSpec& spec = chip(name);
    const double cores_per_device = spec.tensorcores_per_chip / spec.devices_per_chip;
    const double fill = fill_drain_seconds(spec);
    const double matmul = 2.0 * 64 * 128 * 1024 * 1024 / bf16_flops_per_device(spec);
    const double steps = 64 * spec.gmm_v2_grid_step_us * 1e-6;
    CostContext context = megablox_context(spec, 128, 1024, 1024);
    context.balanced_groups = true;
    context.gmm_v2 = true;
    context.mechanisms = MechanismSet::without({"gmm_v2_weight_prefetch"});
    const OpCost on = cost_compute_op(graph, graph.ops().front(), context, false);
    EXPECT_NEAR(on.mxu_seconds, fill + cores_per_device * matmul + steps, 1e-12) << name;
    context.mechanisms = MechanismSet::without({"gmm_v2_weight_prefetch", "gmm_v2_one_tensorcore"});
    const OpCost off = cost_compute_op(graph, graph.ops().front(), context, false);
    EXPECT_NEAR(off.mxu_seconds, fill + matmul + steps, 1e-12) << name;
    EXPECT_DOUBLE_EQ(on.hbm_seconds, off.hbm_seconds) << name;
  }
  EXPECT_EQ(chip("v4").tensorcores_per_chip / chip("v4").devices_per_chip, 2.0);
  EXPECT_EQ(chip("v5p").tensorcores_per_chip / chip("v5p").devices_per_chip, 2.0);
}

// Balanced groups (a kernel benchmark's) visit a tile twice only where a group boundary falls
// inside it: 8 x 1024 rows in 512-row tiles are 16 visits, not the ragged 16 + 8 - 1 = 23; in
// 768-row tiles 5 of the 7 boundaries (all but 3072 and 6144) fall inside a tile: 11 + 5 = 16
// visits of 768 rows.
TEST(GroupedMatmulTiles, BalancedGroupsStraddleOnlyUnalignedBoundaries) {
  const ChipSpec& v7x = chip("v7x");
  const Graph graph = grouped_matmul_graph(8, 1024, 1024, 1024);
  const double fill = fill_drain_seconds(v7x);
  const double per_visit = 2.0 * 1024 * 1024 / bf16_flops_per_device(v7x);
  for (const auto& [tile, visits] : {std::pair{512.0, 16.0}, std::pair{768.0, 16.0}}) {
    CostContext context = megablox_context(v7x, static_cast<int64_t>(tile), 1024, 1024);
    context.balanced_groups = true;
    const OpCost cost = cost_compute_op(graph, graph.ops().front(), context, false);
    EXPECT_NEAR((cost.mxu_seconds - fill) / (visits * tile * per_visit), 1.0, 1e-9) << tile;
  }
}

// Without MaxText's custom sort VJP the gradient of a routing gather is a scatter-add: its
// routed rows cost 3.07x the gather's (the Marin v5p pair in op_cost.cpp). A forward gather, a
// gradient with the custom VJP, and the mechanism switched off are all costed as the gather.
TEST(RoutingScatterGradients, GradientsOfTheRoutingGathersScatterAdd) {
  Graph graph;
  const int region = graph.add_region("moe/grad", 1, Phase::kBackward);
  const TensorId grad_out = graph.add_tensor(
      "moe/combined/grad", {Dim{"batch", 2, ""}, Dim{"length", 2048, ""}, Dim{"embed", 2048, ""}},
      DType::kBF16, TensorKind::kGradient, region);
  const TensorId routing = graph.add_tensor(
      "moe/routing",
      {Dim{"batch", 2, ""}, Dim{"length", 2048, ""}, Dim{"top_k", 8, ""}, Dim{"route", 2, ""}},
      DType::kBF16, TensorKind::kActivation, region);
  const std::vector<Dim> grouped = {Dim{"experts", 64, ""}, Dim{"expert_tokens", 512, ""},
                                    Dim{"embed", 2048, ""}};
  const TensorId grad_rows =
      graph.add_tensor("moe/experts/wo/grad", grouped, DType::kBF16, TensorKind::kGradient, region);
  const TensorId rows =
      graph.add_tensor("moe/dispatched", grouped, DType::kBF16, TensorKind::kActivation, region);
  graph.add_op(OpKind::kMoeDispatch, "moe/combine/grad", {grad_out, routing}, {grad_rows},
               OpAttrs{}, region);
  graph.add_op(OpKind::kMoeDispatch, "moe/dispatch", {grad_out, routing}, {rows}, OpAttrs{},
               region);
  const Op& gradient = graph.ops()[0];
  const Op& recomputed = graph.ops()[1];
  const ChipSpec& v5p = chip("v5p");
  CostContext context;
  context.chip = &v5p;
  const OpCost gather = cost_compute_op(graph, gradient, context, false);
  context.custom_sort_vjp = false;
  const OpCost scatter = cost_compute_op(graph, gradient, context, false);
  const double routed_bytes = 64.0 * 512 * 2048 * 2;
  const double gather_row_seconds =
      routed_bytes / hbm_bytes_per_device(v5p) / v5p.routed_row_hbm_fraction;
  EXPECT_NEAR(scatter.hbm_seconds - gather.hbm_seconds, 2.07 * gather_row_seconds,
              1e-9 * scatter.hbm_seconds);
  CostContext with_vjp;
  with_vjp.chip = &v5p;
  EXPECT_EQ(cost_compute_op(graph, recomputed, context, false).seconds,
            cost_compute_op(graph, recomputed, with_vjp, false).seconds);
  context.mechanisms = MechanismSet::without({"routing_scatter_gradients"});
  EXPECT_EQ(cost_compute_op(graph, gradient, context, false).seconds, gather.seconds);
}

// With mlp_bias on the dropless path every routed row adds its expert's biases, gathered by expert
// id (MaxText moe.py transform_bias); their gradients are scatter-adds of the expert matmuls'
// routed output-gradient rows into [experts, width]. Each weight-gradient grouped matmul (x^T dY)
// carries its bias's: dY's 16 x 1024 x 1536 bf16 rows at the routing scatter-add's rate (3.07x a
// routed-row gather, at routed_row_hbm_fraction of the roofline). The forward matmul, a run
// without mlp_bias and the mechanism switched off pay nothing.
TEST(ExpertBiasScatterGradients, WeightGradientsCarryTheirBiasScatterAdd) {
  Graph graph;
  const int region = graph.add_region("moe/grad", 1, Phase::kBackward);
  const Dim experts{"experts", 16, ""};
  const Dim rows{"expert_tokens", 1024, ""};
  const Dim embed{"embed", 2048, ""};
  const Dim mlp{"mlp", 1536, ""};
  const TensorId x = graph.add_tensor("moe/dispatched", {experts, rows, embed}, DType::kBF16,
                                      TensorKind::kActivation, region);
  const TensorId dy = graph.add_tensor("moe/experts/wi_0/grad", {experts, rows, mlp}, DType::kBF16,
                                       TensorKind::kGradient, region);
  const TensorId dw = graph.add_tensor("moe/experts/wi_0/cast/grad", {experts, embed, mlp},
                                       DType::kBF16, TensorKind::kParameterGrad, region);
  OpAttrs attrs;
  attrs.contracted = {"expert_tokens"};
  attrs.routed_fraction = 0.75;
  graph.add_op(OpKind::kEinsum, "moe/experts/wi_0/grad_moe/experts/wi_0/cast", {x, dy}, {dw}, attrs,
               region);
  const Graph forward = grouped_matmul_graph(16, 1024, 2048, 1536);
  for (const char* name : {"v5p", "v7x"}) {
    const ChipSpec& spec = chip(name);
    CostContext plain = megablox_context(spec, 512, 1024, 1024);
    CostContext biased = plain;
    biased.routed_expert_biases = true;
    const OpCost without_bias = cost_compute_op(graph, graph.ops().front(), plain, false);
    const OpCost with_bias = cost_compute_op(graph, graph.ops().front(), biased, false);
    const double routed_gradient_bytes = 16.0 * 1024 * 1536 * 2 * 0.75;
    const double scatter_seconds =
        routed_gradient_bytes / hbm_bytes_per_device(spec) * 3.07 / spec.routed_row_hbm_fraction;
    EXPECT_NEAR(with_bias.seconds - without_bias.seconds, scatter_seconds, 1e-9 * scatter_seconds)
        << name;
    EXPECT_NEAR(with_bias.hbm_seconds - without_bias.hbm_seconds, scatter_seconds,
                1e-9 * scatter_seconds)
        << name;
    EXPECT_EQ(cost_compute_op(forward, forward.ops().front(), biased, false).seconds,
              cost_compute_op(forward, forward.ops().front(), plain, false).seconds)
        << name;
    biased.mechanisms = MechanismSet::without({"expert_bias_scatter_gradients"});
    EXPECT_EQ(cost_compute_op(graph, graph.ops().front(), biased, false).seconds,
              without_bias.seconds)
        << name;
  }
}

// End to end: gpt-oss-20b (mlp_bias true in MaxText's preset) on the dropless path pays the bias
// scatter-adds in its weight-gradient grouped matmuls, three per MoE layer (wi_0, wi_1, wo): their
// time grows by the routed gradient rows at the scatter-add's rate. On the dense dropping path
// (sparse_matmul=false) the biases broadcast over the capacity slots instead of being gathered,
// and nothing changes. (Op time, not step time: the step also moves with what the longer weight
// gradients hide of the FSDP collectives.)
TEST(ExpertBiasScatterGradients, OnlyTheDroplessPathOfABiasedMoePays) {
  const std::vector<std::string> dropless = {"model_name=gpt-oss-20b", "compile_topology=v5p-8",
                                             "max_target_length=2048", "per_device_batch_size=1"};
  std::vector<std::string> dropping = dropless;
  dropping.emplace_back("sparse_matmul=false");
  dropping.emplace_back("capacity_factor=1.25");
  const MechanismSet off = MechanismSet::without({"expert_bias_scatter_gradients"});
  const std::string experts = "einsum moe/experts/";
  const double on_seconds = profiled_seconds(estimate_config(Config::load("", dropless)), experts);
  const double off_seconds =
      profiled_seconds(estimate_config(Config::load("", dropless), off), experts);
  ASSERT_GT(off_seconds, 0);
  EXPECT_GT(on_seconds, 1.1 * off_seconds);
  const double dropping_on = profiled_seconds(estimate_config(Config::load("", dropping)), experts);
  ASSERT_GT(dropping_on, 0);
  EXPECT_EQ(dropping_on,
            profiled_seconds(estimate_config(Config::load("", dropping), off), experts));
}

// MaxText's unquantized tokamax path passes no tiling, so tokamax's own tiles apply whatever the
// tile keys say: its tuned (512, 2944, 1536) for gpt-oss-120b's forward wi on v7x (327680 rows of
// 128 experts, 2880 x 2880), tokamax's 128 x 128 x 128 default for a shape its table lacks.
// Switched off, the tile keys are used as for megablox.
TEST(TokamaxGmmTiles, UnquantizedTokamaxCallsIgnoreTheTileKeys) {
  const ChipSpec& v7x = chip("v7x");
  const Graph gpt_oss = grouped_matmul_graph(128, 2560, 2880, 2880);
  const Op& op = gpt_oss.ops().front();
  CostContext context = megablox_context(v7x, 512, 1024, 1024);
  context.tokamax_own_tiles = true;
  const OpCost own = cost_compute_op(gpt_oss, op, context, false);
  const OpCost tuned = cost_compute_op(gpt_oss, op, megablox_context(v7x, 512, 2944, 1536), false);
  EXPECT_EQ(own.seconds, tuned.seconds);
  EXPECT_EQ(own.hbm_seconds, tuned.hbm_seconds);
  CostContext other_keys = megablox_context(v7x, 256, 7168, 512);
  other_keys.tokamax_own_tiles = true;
  EXPECT_EQ(cost_compute_op(gpt_oss, op, other_keys, false).seconds, own.seconds);
  context.mechanisms = MechanismSet::without({"tokamax_gmm_tiles"});
  const OpCost keys = cost_compute_op(gpt_oss, op, context, false);
  EXPECT_EQ(keys.seconds,
            cost_compute_op(gpt_oss, op, megablox_context(v7x, 512, 1024, 1024), false).seconds);
  EXPECT_NE(keys.seconds, own.seconds);

  const Graph untuned = grouped_matmul_graph(8, 1024, 1024, 1024);
  CostContext fallback = megablox_context(v7x, 512, 1024, 1024);
  fallback.tokamax_own_tiles = true;
  EXPECT_EQ(
      cost_compute_op(untuned, untuned.ops().front(), fallback, false).seconds,
      cost_compute_op(untuned, untuned.ops().front(), megablox_context(v7x, 128, 128, 128), false)
          .seconds);
}

// Which calls take tokamax's own tiles (moe.py gmm): use_tokamax_gmm without quantization or
// use_gmm_v2. Quantized calls and use_gmm_v2 go through the megablox wrapper with the tile keys.
TEST(TokamaxGmmTiles, OnlyUnquantizedTokamaxCallsWithoutGmmV2) {
  auto own_tiles = [](std::vector<std::string> keys) {
    keys.insert(keys.end(), {"model_name=gpt-oss-120b", "compile_topology=tpu7x-128"});
    const Config config = Config::load("", keys);
    return perf_options_from_config(config, chip("v7x")).cost.tokamax_own_tiles;
  };
  EXPECT_TRUE(own_tiles({"use_tokamax_gmm=true"}));
  EXPECT_FALSE(own_tiles({}));
  EXPECT_FALSE(own_tiles({"use_tokamax_gmm=true", "use_gmm_v2=true"}));
  EXPECT_FALSE(own_tiles({"use_tokamax_gmm=true", "quantization=fp8_full"}));
  EXPECT_FALSE(own_tiles({"use_tokamax_gmm=true", "sparse_matmul=false"}));
}

TEST(Mechanisms, UnknownNameIsAUserErrorAndSetsAreValues) {
  EXPECT_THROW(MechanismSet::without({"grouped_matmul_tile"}), UserError);
  const MechanismSet off = MechanismSet::without({"in_place_buffers"});
  EXPECT_FALSE(off.enabled(Mechanism::kInPlaceBuffers));
  EXPECT_TRUE(off.enabled(Mechanism::kGroupedMatmulTiles));
  EXPECT_EQ(off.disabled_names(), std::vector<std::string>{"in_place_buffers"});
  EXPECT_TRUE(MechanismSet().enabled(Mechanism::kInPlaceBuffers));
  EXPECT_TRUE(MechanismSet().disabled_names().empty());
  EXPECT_FALSE(off == MechanismSet());
  // The names come back in the order of Mechanism, whatever order they were given in.
  EXPECT_EQ(MechanismSet::without({"in_place_buffers", "grouped_matmul_tiles"}).disabled_names(),
            (std::vector<std::string>{"grouped_matmul_tiles", "in_place_buffers"}));
}

// The cost cache keys on the mechanisms: one StepSimulator run with a mechanism off and then on
// gives what fresh simulators give (a cache that ignored them would hand back the first run's
// costs), for op costs (attention_subblock_pipelining) and collective costs (chip_ingress_bound).
TEST(Mechanisms, CachedCostsKeyOnTheMechanisms) {
  const Config config = Config::load(
      "", {"model_name=llama3.1-8b", "compile_topology=tpu7x-128", "max_target_length=8192",
           "per_device_batch_size=1", "ici_tensor_parallelism=2", "sa_block_kv_compute=256"});
  const StepProgram program = build_step_program(config);
  const PerfOptions on = perf_options_from_config(config, *program.slice.chip);
  PerfOptions off = on;
  off.cost.mechanisms =
      MechanismSet::without({"attention_subblock_pipelining", "chip_ingress_bound"});
  const double fresh_on = simulate_step(program, on).step_seconds;
  const double fresh_off = simulate_step(program, off).step_seconds;
  ASSERT_NE(fresh_on, fresh_off);
  StepSimulator simulator(program);
  EXPECT_EQ(simulator.run(off).step_seconds, fresh_off);
  EXPECT_EQ(simulator.run(on).step_seconds, fresh_on);
  EXPECT_EQ(simulator.run(off).step_seconds, fresh_off);
}

}  // namespace
}  // namespace tpusim
