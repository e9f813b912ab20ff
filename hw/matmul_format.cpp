#include "hw/matmul_format.h"

namespace tpusim {

MatmulFormat matmul_format(const std::string& quantization) {
  if (quantization == "int8" || quantization == "intmp") {
    return MatmulFormat::kInt8;
  }
  if (quantization == "fp8" || quantization == "fp8_full" || quantization == "nanoo_fp8") {
    return MatmulFormat::kFp8;
  }
  return MatmulFormat::kBf16;
}

}  // namespace tpusim
