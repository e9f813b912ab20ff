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
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sim/functional/kernels/library_gemm.h"
#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

// C = A B over named dims by explicit loops, in double, operands rounded to bf16 or not.
std::vector<double> product(const Tensor& a, const TensorData& a_values, const Tensor& b,
                            const TensorData& b_values, const Tensor& c, bool round) {
  const auto value = [round](float x) { return static_cast<double>(round ? to_bf16(x) : x); };
  std::vector<std::string> names;
  std::map<std::string, int64_t> sizes;
  for (const Tensor* tensor : {&a, &b, &c}) {
    for (const Dim& d : tensor->dims) {
      if (sizes.emplace(d.name, d.size).second) {
        names.push_back(d.name);
      }
    }
  }
  const TensorData out = TensorData::zeros(c);
  std::vector<double> result(static_cast<size_t>(out.size()), 0.0);
  std::map<std::string, int64_t> index;
  const auto at = [&](const Tensor& tensor) {
    std::vector<int64_t> position;
    for (const Dim& d : tensor.dims) {
      position.push_back(index[d.name]);
    }
    return position;
  };
  for (int64_t flat = 0;; ++flat) {
    int64_t rest = flat;
    for (size_t d = names.size(); d-- > 0;) {
      index[names[d]] = rest % sizes[names[d]];
      rest /= sizes[names[d]];
    }
    if (rest > 0) {
      return result;
    }
    result[static_cast<size_t>(out.offset(at(c)))] +=
        value(a_values.at(at(a))) * value(b_values.at(at(b)));
  }
}

bool capped_below_bf16() {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  return isa != nullptr && std::string(isa) == "AVX512_CORE";
}

// A projection (the product cut into blocks of rows) and a weight gradient (its operands read
// transposed, the product cut into blocks of columns, the last block shorter).
TEST(Bf16GemmPath, FastEinsumEqualsFp32GemmOfBf16RoundedOperands) {
  struct Shape {
    const char* name;
    std::vector<Dim> a, b, c;
    std::vector<std::string> contracted;
  };
  const std::vector<Shape> shapes = {
      {"projection",
       {dim("batch", 2), dim("length", 64), dim("embed", 96)},
       {dim("embed", 96), dim("mlp", 48)},
       {dim("batch", 2), dim("length", 64), dim("mlp", 48)},
       {"embed"}},
      {"weight_gradient",
       {dim("batch", 2), dim("length", 64), dim("embed", 32)},
       {dim("batch", 2), dim("length", 64), dim("mlp", 160)},
       {dim("embed", 32), dim("mlp", 160)},
       {"batch", "length"}},
  };
  std::mt19937 rng(34);
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.name);
    Case c;
    const TensorId a = c.tensor("a", shape.a);
    const TensorId b = c.tensor("b", shape.b);
    const TensorId out = c.tensor("c", shape.c);
    OpAttrs attrs;
    attrs.contracted = shape.contracted;
    const Op& op = c.op(OpKind::kEinsum, {a, b}, {out}, attrs);
    const TensorData a_values = random_data(c.info(a), rng);
    const TensorData b_values = random_data(c.info(b), rng);
    DeviceContext device;
    device.bf16_matmul_inputs = true;
    device.fast_kernels = true;
    const TensorData result = run(c.graph, op, {a_values, b_values}, device)[0];
    const std::vector<double> rounded =
        product(c.info(a), a_values, c.info(b), b_values, c.info(out), true);
    const std::vector<double> unrounded =
        product(c.info(a), a_values, c.info(b), b_values, c.info(out), false);
    // fp32 accumulation of exact bf16 x bf16 products: within fp32's rounding of the sums.
    EXPECT_LT(max_relative_error(result.values, rounded), 1e-5);
    // The operands were rounded: unrounded ones would be off by bf16's rounding, far above that.
    EXPECT_GT(max_relative_error(result.values, unrounded), 1e-4);
  }
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
