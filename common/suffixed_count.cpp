#include "common/suffixed_count.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>

namespace tpusim {

std::optional<double> parse_suffixed_count(const std::string& text, std::string_view suffixes) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  double value = 0;
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (error != std::errc() || stop == begin) {
    return std::nullopt;
  }
  const char* used = stop;
  if (used + 1 == end) {
    const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(*used)));
    const size_t power = std::string_view("KMGT").find(suffix);
    if (power != std::string_view::npos && suffixes.find(suffix) != std::string_view::npos) {
      constexpr double kScale[] = {1e3, 1e6, 1e9, 1e12};
      value *= kScale[power];
      ++used;
    }
  }
  if (used != end || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace tpusim
