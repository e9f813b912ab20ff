#include "sim/plan/global_batch.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/csv.h"
#include "common/embedded_files.h"
#include "common/error.h"
#include "common/suffixed_count.h"
#include "hw/slice.h"

namespace tpusim {
namespace {

constexpr const char* kPublishedRuns = "validation/published.csv";
// Where no published run of the model exists: 1M-16M tokens (decimal), an assumption stated in
// the output, not a recommendation for the model.
constexpr double kFallbackMinTokens = 1e6;
constexpr double kFallbackMaxTokens = 16e6;

double parse_tokens(const std::string& text, const std::string& whole) {
  const std::optional<double> value = parse_suffixed_count(text, "KMG");
  if (!value || *value <= 0) {
    throw UserError("--global-batch-tokens: '" + whole +
                    "' is not a positive token count or range (e.g. 1M-16M, 4194304)");
  }
  return *value;
}

std::map<std::string, std::string> keys_of(const std::string& args) {
  std::map<std::string, std::string> keys;
  std::istringstream in(args);
  for (std::string item; in >> item;) {
    const size_t equals = item.find('=');
    if (equals != std::string::npos) {
      keys[item.substr(0, equals)] = item.substr(equals + 1);
    }
  }
  return keys;
}

// Tokens per optimizer step of one published row, or 0 when its args do not say.
double row_batch_tokens(const std::string& args) {
  const std::map<std::string, std::string> keys = keys_of(args);
  const auto topology = keys.find("compile_topology");
  const auto batch = keys.find("per_device_batch_size");
  const auto length = keys.find("max_target_length");
  if (topology == keys.end() || batch == keys.end() || length == keys.end()) {
    return 0;
  }
  const auto slices = keys.find("compile_topology_num_slices");
  const auto accumulation = keys.find("gradient_accumulation_steps");
  const Slice slice =
      parse_slice(topology->second, slices == keys.end() ? 1 : std::stoi(slices->second));
  return std::stod(batch->second) * slice.total_devices() * std::stod(length->second) *
         (accumulation == keys.end() ? 1 : std::stod(accumulation->second));
}

}  // namespace

GlobalBatchRange parse_global_batch_range(const std::string& text) {
  const size_t dash = text.find('-', 1);
  GlobalBatchRange range;
  range.min_tokens = parse_tokens(text.substr(0, dash), text);
  range.max_tokens =
      dash == std::string::npos ? range.min_tokens : parse_tokens(text.substr(dash + 1), text);
  if (range.max_tokens < range.min_tokens) {
    throw UserError("--global-batch-tokens: '" + text + "' ends below its start");
  }
  range.source = "--global-batch-tokens";
  return range;
}

GlobalBatchRange default_global_batch_range(const std::string& model_name) {
  GlobalBatchRange range{kFallbackMinTokens, kFallbackMaxTokens,
                         "no published run of " + model_name + ": the default 1M-16M tokens"};
  const std::optional<std::string_view> text = embedded_file(kPublishedRuns);
  if (!text) {
    return range;
  }
  const CsvTable table = parse_csv(*text, kPublishedRuns);
  const size_t model = table.column("model");
  const size_t args = table.column("args");
  double low = 0;
  double high = 0;
  int rows = 0;
  for (const std::vector<std::string>& row : table.rows) {
    if (row[model] != model_name) {
      continue;
    }
    double tokens = 0;
    try {
      tokens = row_batch_tokens(row[args]);
    } catch (const std::exception&) {
      continue;  // a row whose slice this catalog does not know
    }
    if (tokens > 0) {
      low = rows == 0 ? tokens : std::min(low, tokens);
      high = std::max(high, tokens);
      ++rows;
    }
  }
  if (rows > 0) {
    range = {low, high,
             "the published " + model_name + " runs (" + kPublishedRuns + ", " +
                 std::to_string(rows) + " rows)"};
  }
  return range;
}

int64_t global_batch_sequences(const GlobalBatchRange& range, int64_t max_target_length) {
  const auto length = static_cast<double>(max_target_length);
  const auto most = static_cast<int64_t>(std::floor(range.max_tokens / length));
  const auto least = static_cast<int64_t>(std::ceil(range.min_tokens / length));
  if (most < 1 || most < least) {
    throw UserError("--global-batch-tokens: " + tokens_text(range.min_tokens) + "-" +
                    tokens_text(range.max_tokens) + " holds no whole number of sequences of " +
                    std::to_string(max_target_length) + " tokens (max_target_length)");
  }
  int64_t power = 1;
  while (power * 2 <= most) {
    power *= 2;
  }
  return power >= least ? power : most;
}

std::string tokens_text(double tokens) {
  char text[32];
  // The unit is picked on the value as printed: 999.7G with 3 digits is "1e+03G", so it is 1T.
  constexpr double kRoundsUp = 0.9995;
  if (tokens >= kRoundsUp * 1e12) {
    std::snprintf(text, sizeof(text), "%.4gT", tokens / 1e12);  // 1T, 15T, 1500T
  } else if (tokens >= kRoundsUp * 1e9) {
    std::snprintf(text, sizeof(text), "%.3gG", tokens / 1e9);
  } else if (tokens >= kRoundsUp * 1e6) {
    std::snprintf(text, sizeof(text), "%.3gM", tokens / 1e6);
  } else {
    std::snprintf(text, sizeof(text), "%.6g", tokens);  // 65536, or 0.5 as typed
  }
  return text;
}

}  // namespace tpusim
