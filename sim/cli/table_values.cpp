#include "sim/cli/table_values.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "common/error.h"

namespace tpusim {

double parse_table_number(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(value)) {
      throw std::invalid_argument(text);
    }
    return value;
  } catch (const std::exception&) {
    throw UserError(what + ": '" + text + "' is not a number");
  }
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream stream(text);
  std::string word;
  while (stream >> word) {
    words.push_back(word);
  }
  return words;
}

double median(std::vector<double> values) {
  if (values.empty()) {
    return 0;
  }
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

}  // namespace tpusim
