// tests/sim/functional/bf16_gemm_path_test.cpp: functional_dtype=bfloat16_matmul on the fast
// kernels equals an fp32 GEMM of the operands rounded to bf16, on every CPU.
//
// ctest runs this executable twice: as the machine is, and as "NoNativeBf16." with
// ONEDNN_MAX_CPU_ISA=AVX512_CORE, which hides AVX512-BF16 and AMX from oneDNN as on a Xeon
// without them. There the bf16 einsums must round their operands and take the fp32 kernels
// (kernels/library_gemm.h): emulated bf16 kernels run 2.4x slower than fp32 ones (issue 34).
// Skipping the rounding fails the first test (the rounding moves the products by ~1e-3, the
// tolerance is 1e-5).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "sim/functional/kernels/library_gemm.h"
#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

// C[batch, m, n] = sum_k A[batch, m, k] B[k, n] in double, operands rounded to bf16 or not.
std::vector<double> product(const TensorData& a, const TensorData& b, int64_t batch, int64_t m,
                            int64_t k, int64_t n, bool round) {
  const auto value = [round](float x) { return static_cast<double>(round ? to_bf16(x) : x); };
  std::vector<double> c(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          sum += value(a.values[static_cast<size_t>((s * m + i) * k + l)]) *
                 value(b.values[static_cast<size_t>(l * n + j)]);
        }
        c[static_cast<size_t>((s * m + i) * n + j)] = sum;
      }
    }
  }
  return c;
}

bool capped_below_bf16() {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  return isa != nullptr && std::string(isa) == "AVX512_CORE";
}

TEST(Bf16GemmPath, FastEinsumEqualsFp32GemmOfBf16RoundedOperands) {
  constexpr int64_t kBatch = 2;
  constexpr int64_t kRows = 64;
  constexpr int64_t kInner = 96;
  constexpr int64_t kCols = 48;
  std::mt19937 rng(34);
  Case c;
  const TensorId a =
      c.tensor("a", {dim("batch", kBatch), dim("length", kRows), dim("embed", kInner)});
  const TensorId b = c.tensor("b", {dim("embed", kInner), dim("mlp", kCols)});
  const TensorId out =
      c.tensor("c", {dim("batch", kBatch), dim("length", kRows), dim("mlp", kCols)});
  OpAttrs attrs;
  attrs.contracted = {"embed"};
  const Op& op = c.op(OpKind::kEinsum, {a, b}, {out}, attrs);
  const TensorData a_values = random_data(c.info(a), rng);
  const TensorData b_values = random_data(c.info(b), rng);
  DeviceContext device;
  device.bf16_matmul_inputs = true;
  device.fast_kernels = true;
  const TensorData result = run(c.graph, op, {a_values, b_values}, device)[0];
  const std::vector<double> rounded =
      product(a_values, b_values, kBatch, kRows, kInner, kCols, true);
  const std::vector<double> unrounded =
      product(a_values, b_values, kBatch, kRows, kInner, kCols, false);
  // fp32 accumulation of exact bf16 x bf16 products: within fp32's rounding of the sums.
  EXPECT_LT(max_relative_error(result.values, rounded), 1e-5);
  // The operands were rounded: unrounded ones would be off by bf16's rounding, far above that.
  EXPECT_GT(max_relative_error(result.values, unrounded), 1e-4);
}

TEST(Bf16GemmPath, TrainSaysWhichGemmPathRuns) {
  const std::string bf16_line = kernels::gemm_path_line(true, true);
  const std::string fp32_line = kernels::gemm_path_line(false, true);
  EXPECT_NE(fp32_line.find("fp32"), std::string::npos) << fp32_line;
  EXPECT_EQ(fp32_line.find("bf16-rounded"), std::string::npos) << fp32_line;
  EXPECT_EQ(fp32_line.find("bf16 inputs"), std::string::npos) << fp32_line;
  EXPECT_EQ(kernels::gemm_path_line(true, false),
            "reference kernels (functional_precision=reference)");
  if (capped_below_bf16()) {
    // No native bf16 dot products: no bf16 kernel is used, the fp32 one takes rounded operands.
    EXPECT_FALSE(kernels::library_gemm_available(kernels::GemmPrecision::kBfloat16Inputs));
    EXPECT_EQ(kernels::fast_gemm_precision(true), kernels::GemmPrecision::kFloat32);
    EXPECT_NE(bf16_line.find("fp32 on bf16-rounded operands"), std::string::npos) << bf16_line;
  } else if (kernels::library_gemm_available(kernels::GemmPrecision::kBfloat16Inputs)) {
    EXPECT_NE(bf16_line.find("bf16 inputs, fp32 accumulation"), std::string::npos) << bf16_line;
  } else {
    EXPECT_NE(bf16_line.find("bf16-rounded operands"), std::string::npos) << bf16_line;
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
