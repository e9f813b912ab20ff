// GPU fused attention priced from the catalog's measured kernel table (configs/hw/*.yml
// attention_kernel, figures of the FlashAttention-3 paper's cuDNN bars), and TPU attention left
// as it was.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/mechanisms.h"
#include "hw/catalog.h"
#include "model/config.h"
#include "model/ir/graph.h"
#include "sim/estimate/estimate.h"
#include "sim/perf/op_cost.h"

namespace tpusim {
namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kHeads = 32;
constexpr int64_t kHeadDim = 128;

// One attention op (forward, or its gradient) of llama-like shapes at `length` tokens.
struct AttentionOp {
  Graph graph;
  int op = -1;
  AttentionOp(int64_t length, AttentionMask mask, bool backward) {
    const int region = graph.add_region("layer", 1, backward ? Phase::kBackward : Phase::kForward);
    auto activation = [&](const std::string& name) {
      return graph.add_tensor(
          name,
          {Dim("batch", kBatch, "activation_batch"), Dim("length", length, "activation_length"),
           Dim("heads", kHeads, "activation_heads"), Dim("head_dim", kHeadDim, "activation_kv")},
          DType::kBF16, TensorKind::kActivation, region);
    };
    OpAttrs attrs;
    attrs.mask = mask;
    const TensorId query = activation("q");
    const TensorId key = activation("k");
    const TensorId value = activation("v");
    if (backward) {
      op = graph.add_op(OpKind::kAttentionGrad, "attention_grad",
                        {activation("d_out"), query, key, value},
                        {activation("dq"), activation("dk"), activation("dv")}, attrs, region);
    } else {
      op = graph.add_op(OpKind::kAttention, "attention", {query, key, value}, {activation("out")},
                        attrs, region);
    }
  }
  double seconds(const std::string& chip, const MechanismSet& mechanisms = MechanismSet()) const {
    CostContext context;
    context.chip = &HardwareCatalog::builtin().chip(chip);
    context.mechanisms = mechanisms;
    return cost_compute_op(graph, graph.ops().at(static_cast<size_t>(op)), context, false).seconds;
  }
};

// Attention FLOPs as the table counts them: 4 x seq^2 x head_dim per head, half under a causal
// mask, 2.5 times that for the backward.
double table_flops(int64_t length, bool causal, bool backward) {
  const auto seq = static_cast<double>(length);
  return 4.0 * kBatch * kHeads * seq * seq * kHeadDim * (causal ? 0.5 : 1.0) *
         (backward ? 2.5 : 1.0);
}

constexpr double kOverheadSeconds = 3e-6;  // h100-sxm.yml op_overhead_us

// At a measured length the op takes the table's FLOPs at the table's rate (H100 cuDNN, [FA3]):
// causal forward 518 TFLOP/s at 4k, non-causal 609; backward 499, causal backward assumed at the
// forward's causal/non-causal ratio.
TEST(GpuAttention, MeasuredLengthsTakeTheTableRate) {
  const double forward_causal =
      AttentionOp(4096, AttentionMask::kCausal, false).seconds("h100-sxm");
  EXPECT_NEAR(forward_causal, table_flops(4096, true, false) / 518e12 + kOverheadSeconds, 1e-9);
  const double forward = AttentionOp(4096, AttentionMask::kNone, false).seconds("h100-sxm");
  EXPECT_NEAR(forward, table_flops(4096, false, false) / 609e12 + kOverheadSeconds, 1e-9);
  const double backward = AttentionOp(2048, AttentionMask::kNone, true).seconds("h100-sxm");
  EXPECT_NEAR(backward, table_flops(2048, false, true) / 465e12 + kOverheadSeconds, 1e-9);
  const double backward_causal =
      AttentionOp(4096, AttentionMask::kCausal, true).seconds("h100-sxm");
  EXPECT_NEAR(backward_causal,
              table_flops(4096, true, true) / (499e12 * 518.0 / 609.0) + kOverheadSeconds, 1e-9);
}

// Between two measured lengths the rate is linear in log(length): at the geometric mean of 2k and
// 4k it is the mean of their rates, (484 + 518) / 2 = 501 TFLOP/s for the causal forward.
TEST(GpuAttention, RateInterpolatesInLogLength) {
  const auto length = static_cast<int64_t>(std::round(std::sqrt(2048.0 * 4096.0)));  // 2896
  const double seconds = AttentionOp(length, AttentionMask::kCausal, false).seconds("h100-sxm");
  EXPECT_NEAR(seconds / (table_flops(length, true, false) / 501e12 + kOverheadSeconds), 1.0, 1e-4);
}

// The table's rate sits well below the GEMM rate: switching the mechanism off prices the kernel
// at 0.8 x 989 TFLOP/s again, so attention gets faster (by 20% or more at 4k, causal forward).
TEST(GpuAttention, WithoutTheMechanismAttentionRunsNearTheGemmRate) {
  const AttentionOp op(4096, AttentionMask::kCausal, false);
  const double with_table = op.seconds("h100-sxm");
  const double without =
      op.seconds("h100-sxm", MechanismSet::without({"gpu_attention_kernel_rates"}));
  EXPECT_GT(with_table / without, 1.2);
}

// H200 runs the H100's kernels (same die and clocks): same attention time. B200 takes the H100
// curve times 2.01 (b200-sxm.yml rate_scale, from [FA4]'s cuDNN comparison).
TEST(GpuAttention, H200MatchesH100AndB200ScalesTheCurve) {
  const AttentionOp op(8192, AttentionMask::kCausal, false);
  EXPECT_DOUBLE_EQ(op.seconds("h200-sxm"), op.seconds("h100-sxm"));
  const double b200_busy = op.seconds("b200-sxm") - kOverheadSeconds;
  EXPECT_NEAR(b200_busy, table_flops(8192, true, false) / (529e12 * 2.01), 1e-9);
}

// TPU attention does not consult the GPU table: the mechanism switched off changes nothing.
TEST(GpuAttention, TpuAttentionIsUntouched) {
  for (const char* chip : {"v5p", "v6e", "v7x"}) {
    const AttentionOp op(4096, AttentionMask::kCausal, true);
    EXPECT_EQ(op.seconds(chip),
              op.seconds(chip, MechanismSet::without({"gpu_attention_kernel_rates"})))
        << chip;
  }
  const std::vector<std::string> args = {"model_name=llama2-7b", "compile_topology=v5p-8",
                                         "max_target_length=4096"};
  const Estimate with = estimate_config(Config::load("", args));
  const Estimate without = estimate_config(Config::load("", args),
                                           MechanismSet::without({"gpu_attention_kernel_rates"}));
  EXPECT_EQ(with.timing.step_seconds, without.timing.step_seconds);
}

}  // namespace
}  // namespace tpusim
