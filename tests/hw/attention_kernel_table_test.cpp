// hw/attention_kernel_table: interpolation of the measured kernel rates and the loader's errors.
#include "hw/attention_kernel_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/error.h"
#include "hw/catalog.h"

namespace tpusim {
namespace {

const AttentionKernelTable& h100_table() {
  return HardwareCatalog::builtin().chip("h100-sxm").attention_kernel;
}

// The H100 cuDNN figures of the FlashAttention-3 paper (docs/reference/gpu.md §3).
TEST(AttentionKernelTable, MeasuredLengthsGiveTheMeasuredRates) {
  const AttentionKernelTable& table = h100_table();
  EXPECT_DOUBLE_EQ(attention_kernel_tflops(table, 4096, AttentionPass::kForward, true), 518);
  EXPECT_DOUBLE_EQ(attention_kernel_tflops(table, 512, AttentionPass::kForward, false), 497);
  EXPECT_DOUBLE_EQ(attention_kernel_tflops(table, 16384, AttentionPass::kBackward, false), 516);
}

TEST(AttentionKernelTable, LogLinearBetweenAndHeldOutside) {
  const AttentionKernelTable& table = h100_table();
  // The geometric mean of 1k and 2k gets the mean of their rates.
  EXPECT_NEAR(
      attention_kernel_tflops(table, std::sqrt(1024.0 * 2048.0), AttentionPass::kForward, false),
      (574.0 + 617.0) / 2, 1e-9);
  EXPECT_DOUBLE_EQ(attention_kernel_tflops(table, 128, AttentionPass::kForward, true), 315);
  EXPECT_DOUBLE_EQ(attention_kernel_tflops(table, 131072, AttentionPass::kForward, true), 539);
}

// No causal backward was measured: it keeps the forward's causal/non-causal ratio.
TEST(AttentionKernelTable, CausalBackwardKeepsTheForwardRatio) {
  EXPECT_NEAR(attention_kernel_tflops(h100_table(), 8192, AttentionPass::kBackward, true),
              518.0 * 529.0 / 600.0, 1e-9);
}

TEST(AttentionKernelTable, RateScaleMultiplies) {
  const AttentionKernelTable& b200 = HardwareCatalog::builtin().chip("b200-sxm").attention_kernel;
  EXPECT_TRUE(b200.rate_scale_is_assumption);
  EXPECT_NEAR(attention_kernel_tflops(b200, 2048, AttentionPass::kForward, false), 617 * 2.01,
              1e-9);
}

std::string error_of(const std::string& text) {
  try {
    (void)parse_attention_kernel_table(YAML::Load(text), "x.yml: attention_kernel");
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(AttentionKernelTable, BadTablesNameTheKey) {
  const std::string head = "{kernel: k, source: s, ";
  const std::string rates =
      "forward_tflops: [1, 2], forward_causal_tflops: [1, 2], backward_tflops: [1, 2], ";
  const std::string scale = "rate_scale: {value: 1, source: s}}";
  EXPECT_EQ(error_of(head + "seq_lengths: [512, 1024], " + rates + scale), "");
  EXPECT_NE(error_of(head + "seq_lengths: [512], " + rates + scale).find("one rate per"),
            std::string::npos);
  EXPECT_NE(error_of(head + "seq_lengths: [1024, 512], " + rates + scale).find("seq_lengths"),
            std::string::npos);
  EXPECT_NE(error_of(head + "seq_lengths: [512, 1024], " + rates + "rate_scale: {value: 1}}")
                .find("rate_scale"),
            std::string::npos);
  EXPECT_NE(error_of(head + "seq_lengths: [512, -1], " + rates + scale).find("positive"),
            std::string::npos);
  EXPECT_NE(error_of("{source: s}").find("kernel"), std::string::npos);
}

}  // namespace
}  // namespace tpusim
