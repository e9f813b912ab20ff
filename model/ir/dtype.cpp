#include "model/ir/dtype.h"

#include "common/error.h"

namespace tpusim {

int dtype_bytes(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kInt8:
    case DType::kFp8:
      return 1;
  }
  return 4;
}

const char* dtype_name(DType type) {
  switch (type) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kInt8:
      return "s8";
    case DType::kFp8:
      return "f8";
    case DType::kI32:
      return "s32";
  }
  return "?";
}

DType parse_dtype(std::string_view name, std::string_view key) {
  if (name == "float32") {
    return DType::kF32;
  }
  if (name == "bfloat16") {
    return DType::kBF16;
  }
  if (name == "float16") {
    return DType::kF16;
  }
  throw UserError(std::string(key) + ": '" + std::string(name) +
                  "' is not a dtype (float32, bfloat16, float16)");
}

}  // namespace tpusim
