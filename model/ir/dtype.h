// model/ir/dtype.h: element types of IR tensors and their sizes.
//
// Example:
//   DType type = parse_dtype("bfloat16", "dtype");  // DType::kBF16
//   dtype_bytes(type);                              // 2
#pragma once

#include <string>
#include <string_view>

namespace tpusim {

enum class DType { kF32, kBF16, kF16, kInt8, kFp8, kI32 };

int dtype_bytes(DType type);
const char* dtype_name(DType type);  // "f32", "bf16", ...

// MaxText dtype names ("float32", "bfloat16", "float16"); UserError naming `key` otherwise.
DType parse_dtype(std::string_view name, std::string_view key);

}  // namespace tpusim
