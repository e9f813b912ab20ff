// common/utf8.h: whether text is well-formed UTF-8 (no stray continuation bytes, no truncated or
// overlong sequences, no surrogates). User text that ends up in JSON output (config strings, XLA
// flag names) must be, or nlohmann::json::dump throws.
//
// Example:
//   if (!is_valid_utf8(value)) throw UserError(key + ": the value is not valid UTF-8", key);
#pragma once

#include <string_view>

namespace tpusim {

bool is_valid_utf8(std::string_view text);

}  // namespace tpusim
