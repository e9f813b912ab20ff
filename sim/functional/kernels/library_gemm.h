// sim/functional/kernels/library_gemm.h: one GEMM block of the fast einsum through oneDNN's JIT
// matmul kernels (brgemm), fp32 or bf16 inputs with fp32 output, when tpusim was built with
// oneDNN (Debian's libdnnl-dev; TPUSIM_WITH_DNNL) and this CPU has a JIT kernel for the type.
//
// Why a library: measured side by side on the development machine (reports/performance.md,
// benchmarks/train_benchmark.cpp's GEMM rows), oneDNN's fp32 kernels beat Eigen's by about 1.3x on
// the step's shapes, and its bf16 kernels (AVX512-BF16 dot products, fp32 accumulation, as the
// MXU does) double that again; Eigen has no bf16 GEMM of that kind.
//
// Each call runs on the calling thread alone (oneDNN's OpenMP team is held at one thread), so the
// fast einsum's own cut of the work into items decides the parallelism, and the result of an item
// depends only on its shapes and strides: bitwise the same for any num_threads and run to run.
//
// bf16 inputs run on oneDNN's bf16 kernels only where the CPU has native bf16 dot products
// (AVX512-BF16 or AMX, as oneDNN sees it: ONEDNN_MAX_CPU_ISA caps it). Elsewhere oneDNN would
// emulate them, 2.4x slower than its fp32 kernels on an AVX-512 Xeon without AVX512-BF16 (issue
// 34), so library_gemm_available(kBfloat16Inputs) is false and callers round the operands to bf16
// and multiply them with the fp32 kernels instead: the same products (a bf16 x bf16 product is
// exact in fp32) summed in fp32, as the MXU sums them.
//
// When the library is missing, or its best kernel for a type on this CPU would be its slow
// reference loop, library_gemm_available() is false and the caller keeps its own path (Eigen for
// fp32); library_gemm_supports() says the same of one product's layout.
//
// Example:
//   // C[2 x 3] = A[2 x 4] B[4 x 3], all row-major fp32:
//   if (library_gemm_supports(GemmPrecision::kFloat32, 2, 3, 4, {a, 4, 1}, {b, 3, 1}, {c, 3, 1})) {
//     (void)library_gemm(GemmPrecision::kFloat32, 2, 3, 4, {a, 4, 1}, {b, 3, 1}, {c, 3, 1});
//   }
//   // bf16 inputs: convert once (round to nearest even), then multiply the converted copies.
//   std::vector<uint16_t> a16(8), b16(12);
//   to_bf16(a, a16.data(), 8);
//   to_bf16(b, b16.data(), 12);
//   const bool done = library_gemm(GemmPrecision::kBfloat16Inputs, 2, 3, 4, {a16.data(), 4, 1},
//                                  {b16.data(), 3, 1}, {c, 3, 1});  // false: use another path
#pragma once

#include <cstdint>
#include <string>

namespace tpusim::kernels {

enum class GemmPrecision {
  kFloat32,         // fp32 operands, fp32 accumulation
  kBfloat16Inputs,  // bf16 operands (uint16_t bit patterns), fp32 accumulation
};

// A strided matrix operand: element (i, j) at data[i * row_stride + j * col_stride], of float
// (kFloat32) or of bf16 bit patterns (uint16_t, kBfloat16Inputs).
struct GemmOperand {
  const void* data;
  int64_t row_stride;
  int64_t col_stride;
};

// The fp32 result, strided the same way.
struct GemmResult {
  float* data;
  int64_t row_stride;
  int64_t col_stride;
};

// Whether library_gemm runs `precision` on this machine with a JIT kernel (decided once).
bool library_gemm_available(GemmPrecision precision);

// Whether library_gemm has a JIT kernel for this product's shapes and strides (oneDNN may have
// only its reference loop for some layouts). The data pointers are not read.
bool library_gemm_supports(GemmPrecision precision, int64_t m, int64_t n, int64_t k, GemmOperand a,
                           GemmOperand b, GemmResult c);

// c (m x n) = a (m x k) b (k x n) on a JIT kernel. Returns false, writing nothing, when there is
// none for this precision, shapes and strides (library_gemm_supports() says so beforehand).
[[nodiscard]] bool library_gemm(GemmPrecision precision, int64_t m, int64_t n, int64_t k,
                                GemmOperand a, GemmOperand b, GemmResult c);

// Rounds `count` floats to bf16 bit patterns, round-to-nearest-even (the MXU's rounding and
// round_bf16's in kernels/context.h); inf and NaN keep their class.
void to_bf16(const float* values, uint16_t* out, int64_t count);

// What runs the fast einsum's GEMMs here, for reports: e.g. "oneDNN brg:avx512_core_bf16" or
// "Eigen".
const char* library_gemm_name(GemmPrecision precision);

// The precision the fast kernels multiply with: kBfloat16Inputs for bf16 operands on a CPU with
// native bf16 kernels, else kFloat32 (bf16 operands then rounded to bf16 first by the caller).
GemmPrecision fast_gemm_precision(bool bf16_inputs);

// One line for train's start, saying which GEMM path runs, e.g.
//   "oneDNN avx512_core fp32 (brg:avx512_core)"
//   "oneDNN avx512_core fp32 on bf16-rounded operands (no native bf16 dot products on this CPU)"
//   "oneDNN avx512_core_bf16 bf16 inputs, fp32 accumulation (brg:avx512_core_bf16)"
//   "reference kernels (functional_precision=reference)"
std::string gemm_path_line(bool bf16_inputs, bool fast_kernels);

}  // namespace tpusim::kernels
