// common/lowercase.h: ASCII lower case, for the values MaxText and its libraries read without
// regard to case (YAML booleans, qwix calibration methods).
//
// Example:
//   lowercase("FIXED,-224,224");   // "fixed,-224,224"
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace tpusim {

inline std::string lowercase(std::string_view text) {
  std::string lower(text);
  for (char& character : lower) {
    character = static_cast<char>(std::tolower(static_cast<unsigned char>(character)));
  }
  return lower;
}

}  // namespace tpusim
