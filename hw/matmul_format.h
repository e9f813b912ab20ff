// hw/matmul_format.h: the number format a MaxText `quantization` value runs its matmuls in on the
// MXU, read in one place by the step model (sim/perf/perf_options.cpp), `tpusim op` and the chip's
// peak for that format (ChipSpec::peak_flops_for_quantization).
//
// MaxText's values (its quantizations.py): "int8" and "intmp" are AQT integer matmuls (intmp's
// default bits are 8), "fp8", "fp8_full" and "nanoo_fp8" are 8-bit floats, "" leaves the matmuls
// in the activation dtype. "fp4" and "int4" are not modeled: model/config_rules.cpp refuses them
// by name before anything is priced.
//
// Example:
//   matmul_format("fp8_full");   // MatmulFormat::kFp8
//   matmul_format("intmp");      // MatmulFormat::kInt8
//   matmul_format("");           // MatmulFormat::kBf16
#pragma once

#include <string>

namespace tpusim {

enum class MatmulFormat { kBf16, kInt8, kFp8 };

// kBf16 for "" and any value that is not an 8-bit format.
MatmulFormat matmul_format(const std::string& quantization);

}  // namespace tpusim
