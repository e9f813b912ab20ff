#include "sim/functional/kernels/library_gemm.h"

#include <bit>
#include <cstring>
#include <string>

#ifdef TPUSIM_WITH_DNNL
#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace tpusim::kernels {

void to_bf16(const float* values, uint16_t* out, int64_t count) {
  for (int64_t index = 0; index < count; ++index) {
    uint32_t bits = std::bit_cast<uint32_t>(values[index]);
    if ((bits & 0x7f800000u) != 0x7f800000u) {
      bits += 0x7fffu + ((bits >> 16) & 1u);
    } else if ((bits & 0x007fffffu) != 0) {
      bits |= 0x00400000u;  // a NaN stays a NaN once truncated
    }
    out[index] = static_cast<uint16_t>(bits >> 16);
  }
}

GemmPrecision fast_gemm_precision(bool bf16_inputs) {
  return bf16_inputs && library_gemm_available(GemmPrecision::kBfloat16Inputs)
             ? GemmPrecision::kBfloat16Inputs
             : GemmPrecision::kFloat32;
}

#ifdef TPUSIM_WITH_DNNL
namespace {

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t>;

struct Kernel {
  dnnl::matmul::primitive_desc descriptor;
  dnnl::matmul primitive;
  size_t scratchpad_bytes = 0;
  bool jit = false;  // false: oneDNN's only kernel for this layout is its reference loop
};

// oneDNN's JIT matmuls want the result's rows contiguous: a column-major C = A B is computed as
// the row-major C^T = B^T A^T (the same products and sums, the operands' roles swapped).
struct Problem {
  int64_t m, n, k;
  GemmOperand a, b;
  GemmResult c;
};

Problem with_row_major_result(int64_t m, int64_t n, int64_t k, const GemmOperand& a,
                              const GemmOperand& b, const GemmResult& c) {
  if (c.col_stride == 1 || c.row_stride != 1) {
    return {m, n, k, a, b, c};
  }
  return {n,
          m,
          k,
          {b.data, b.col_stride, b.row_stride},
          {a.data, a.col_stride, a.row_stride},
          {c.data, c.col_stride, c.row_stride}};
}

dnnl::memory::data_type input_type(GemmPrecision precision) {
  return precision == GemmPrecision::kFloat32 ? dnnl::memory::data_type::f32
                                              : dnnl::memory::data_type::bf16;
}

bool is_jit(const std::string& implementation) {
  return implementation != "none" && implementation.rfind("ref", 0) != 0;
}

// The process's one CPU engine and its primitives, by shapes and strides.
class Library {
 public:
  static Library& instance() {
    static Library library;
    return library;
  }

  const dnnl::engine& engine() const { return engine_; }

  // oneDNN's best kernel for `precision` on this CPU ("none" if it has none, or for bf16 inputs
  // if this CPU has no native bf16 dot products), probed once.
  const std::string& implementation(GemmPrecision precision) const {
    return names_[static_cast<int>(precision)];
  }

  // The instruction set oneDNN generates code for here, e.g. "avx512_core".
  const std::string& isa() const { return isa_; }
  bool native_bf16() const { return native_bf16_; }

  const Kernel& kernel(GemmPrecision precision, int64_t m, int64_t n, int64_t k,
                       const GemmOperand& a, const GemmOperand& b, const GemmResult& c) {
    const Key key{static_cast<int>(precision),
                  m,
                  n,
                  k,
                  a.row_stride,
                  a.col_stride,
                  b.row_stride,
                  b.col_stride,
                  c.row_stride,
                  c.col_stride};
    {
      // Every call looks its kernel up; only the first of a shape builds it.
      const std::shared_lock<std::shared_mutex> lock(mutex_);
      const auto found = kernels_.find(key);
      if (found != kernels_.end()) {
        return *found->second;
      }
    }
    const std::unique_lock<std::shared_mutex> lock(mutex_);
    auto found = kernels_.find(key);
    if (found == kernels_.end()) {
      const dnnl::memory::data_type type = input_type(precision);
      const dnnl::memory::desc a_desc({m, k}, type, {a.row_stride, a.col_stride});
      const dnnl::memory::desc b_desc({k, n}, type, {b.row_stride, b.col_stride});
      const dnnl::memory::desc c_desc({m, n}, dnnl::memory::data_type::f32,
                                      {c.row_stride, c.col_stride});
      dnnl::primitive_attr attributes;
      // Each thread brings its own scratchpad: primitives run from several threads at once.
      attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      auto kernel = std::make_unique<Kernel>();
      kernel->descriptor = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_desc, b_desc, c_desc),
                                                        attributes, engine_);
      kernel->primitive = dnnl::matmul(kernel->descriptor);
      kernel->scratchpad_bytes = kernel->descriptor.scratchpad_desc().get_size();
      kernel->jit = is_jit(kernel->descriptor.impl_info_str());
      found = kernels_.emplace(key, std::move(kernel)).first;
    }
    return *found->second;
  }

 private:
  Library() : engine_(dnnl::engine::kind::cpu, 0) {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    isa_ = isa_name(isa);
    native_bf16_ = isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
    for (const GemmPrecision precision :
         {GemmPrecision::kFloat32, GemmPrecision::kBfloat16Inputs}) {
      std::string& name = names_[static_cast<int>(precision)];
      if (precision == GemmPrecision::kBfloat16Inputs && !native_bf16_) {
        name = "none";  // emulated bf16 is slower than rounding and the fp32 kernels
        continue;
      }
      try {
        const dnnl::memory::desc a({256, 256}, input_type(precision), dnnl::memory::format_tag::ab);
        const dnnl::memory::desc c({256, 256}, dnnl::memory::data_type::f32,
                                   dnnl::memory::format_tag::ab);
        name = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, c), engine_).impl_info_str();
      } catch (const dnnl::error&) {
        name = "none";
      }
    }
  }

  static std::string isa_name(dnnl::cpu_isa isa) {
    switch (isa) {
      case dnnl::cpu_isa::sse41:
        return "sse41";
      case dnnl::cpu_isa::avx:
        return "avx";
      case dnnl::cpu_isa::avx2:
        return "avx2";
      case dnnl::cpu_isa::avx2_vnni:
        return "avx2_vnni";
      case dnnl::cpu_isa::avx512_core:
        return "avx512_core";
      case dnnl::cpu_isa::avx512_core_vnni:
        return "avx512_core_vnni";
      case dnnl::cpu_isa::avx512_core_bf16:
        return "avx512_core_bf16";
      case dnnl::cpu_isa::avx512_core_amx:
        return "avx512_core_amx";
      default:
        return "isa " + std::to_string(static_cast<int>(isa));
    }
  }

  dnnl::engine engine_;
  std::shared_mutex mutex_;
  std::string isa_;
  bool native_bf16_ = false;
  std::string names_[2];
  std::map<Key, std::unique_ptr<Kernel>> kernels_;
};

}  // namespace

bool library_gemm_available(GemmPrecision precision) {
  return is_jit(Library::instance().implementation(precision));
}

const char* library_gemm_name(GemmPrecision precision) {
  static const std::string names[2] = {
      "oneDNN " + Library::instance().implementation(GemmPrecision::kFloat32),
      "oneDNN " + Library::instance().implementation(GemmPrecision::kBfloat16Inputs)};
  if (!library_gemm_available(precision)) {
    return precision == GemmPrecision::kFloat32 ? "Eigen" : "Eigen (reference kernels)";
  }
  return names[static_cast<int>(precision)].c_str();
}

std::string gemm_path_line(bool bf16_inputs, bool fast_kernels) {
  if (!fast_kernels) {
    return "reference kernels (functional_precision=reference)";
  }
  const Library& library = Library::instance();
  const GemmPrecision precision = fast_gemm_precision(bf16_inputs);
  if (!library_gemm_available(GemmPrecision::kFloat32)) {
    return bf16_inputs ? "Eigen fp32 on bf16-rounded operands" : "Eigen fp32";
  }
  if (precision == GemmPrecision::kBfloat16Inputs) {
    return "oneDNN " + library.isa() + " bf16 inputs, fp32 accumulation (" +
           library.implementation(precision) + ")";
  }
  return "oneDNN " + library.isa() + " fp32" +
         (bf16_inputs ? " on bf16-rounded operands (no native bf16 dot products on this CPU)"
                      : "") +
         " (" + library.implementation(GemmPrecision::kFloat32) + ")";
}

bool library_gemm_supports(GemmPrecision precision, int64_t m, int64_t n, int64_t k, GemmOperand a,
                           GemmOperand b, GemmResult c) {
  if (!library_gemm_available(precision)) {
    return false;
  }
  if (m <= 0 || n <= 0 || k <= 0) {
    return true;
  }
  const Problem problem = with_row_major_result(m, n, k, a, b, c);
  return Library::instance()
      .kernel(precision, problem.m, problem.n, problem.k, problem.a, problem.b, problem.c)
      .jit;
}

bool library_gemm(GemmPrecision precision, int64_t m, int64_t n, int64_t k, GemmOperand a,
                  GemmOperand b, GemmResult c) {
  if (!library_gemm_available(precision)) {
    return false;
  }
  if (m <= 0 || n <= 0) {
    return true;
  }
  if (k <= 0) {
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t col = 0; col < n; ++col) {
        c.data[row * c.row_stride + col * c.col_stride] = 0.0f;
      }
    }
    return true;
  }
  // One OpenMP thread per call, whichever thread calls (the ICV is per thread).
  thread_local const bool one_thread = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)one_thread;
  const Problem problem = with_row_major_result(m, n, k, a, b, c);
  Library& library = Library::instance();
  const Kernel& kernel =
      library.kernel(precision, problem.m, problem.n, problem.k, problem.a, problem.b, problem.c);
  if (!kernel.jit) {
    return false;
  }
  thread_local dnnl::stream stream(library.engine());
  thread_local std::vector<unsigned char> scratchpad;
  if (scratchpad.size() < kernel.scratchpad_bytes) {
    scratchpad.resize(kernel.scratchpad_bytes);
  }
  const dnnl::memory a_memory(kernel.descriptor.src_desc(), library.engine(),
                              const_cast<void*>(problem.a.data));
  const dnnl::memory b_memory(kernel.descriptor.weights_desc(), library.engine(),
                              const_cast<void*>(problem.b.data));
  const dnnl::memory c_memory(kernel.descriptor.dst_desc(), library.engine(), problem.c.data);
  const dnnl::memory scratch(kernel.descriptor.scratchpad_desc(), library.engine(),
                             scratchpad.data());
  kernel.primitive.execute(stream, {{DNNL_ARG_SRC, a_memory},
                                    {DNNL_ARG_WEIGHTS, b_memory},
                                    {DNNL_ARG_DST, c_memory},
                                    {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
  return true;
}

#else  // built without oneDNN

bool library_gemm_available(GemmPrecision) {
  return false;
}

const char* library_gemm_name(GemmPrecision precision) {
  return precision == GemmPrecision::kFloat32 ? "Eigen" : "Eigen (reference kernels)";
}

std::string gemm_path_line(bool bf16_inputs, bool fast_kernels) {
  if (!fast_kernels) {
    return "reference kernels (functional_precision=reference)";
  }
  return bf16_inputs ? "Eigen fp32 on bf16-rounded operands (built without oneDNN)"
                     : "Eigen fp32 (built without oneDNN)";
}

bool library_gemm_supports(GemmPrecision, int64_t, int64_t, int64_t, GemmOperand, GemmOperand,
                           GemmResult) {
  return false;
}

bool library_gemm(GemmPrecision, int64_t, int64_t, int64_t, GemmOperand, GemmOperand, GemmResult) {
  return false;
}

#endif

}  // namespace tpusim::kernels
