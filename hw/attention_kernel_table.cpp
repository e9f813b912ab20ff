#include "hw/attention_kernel_table.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "common/error.h"

namespace tpusim {
namespace {

std::vector<double> parse_positive_list(const YAML::Node& node, const std::string& where) {
  if (!node || !node.IsSequence() || node.size() == 0) {
    throw UserError(where + " must be a non-empty list of numbers");
  }
  std::vector<double> values;
  for (const YAML::Node& item : node) {
    double value = 0;
    try {
      value = item.as<double>();
    } catch (const YAML::Exception&) {
      throw UserError(where + ": '" + item.as<std::string>("?") + "' is not a number");
    }
    if (!std::isfinite(value) || value <= 0) {
      throw UserError(where + ": " + item.as<std::string>("?") + " must be a positive number");
    }
    values.push_back(value);
  }
  return values;
}

std::string required_text(const YAML::Node& node, const char* key, const std::string& where) {
  const YAML::Node entry = node[key];
  if (!entry || !entry.IsScalar() || entry.as<std::string>().empty()) {
    throw UserError(where + "." + key + " must be a non-empty string");
  }
  return entry.as<std::string>();
}

// Linear in log(seq_length) between the measured lengths, the end values outside them.
double interpolate(const std::vector<double>& lengths, const std::vector<double>& rates,
                   double seq_length) {
  if (seq_length <= lengths.front()) {
    return rates.front();
  }
  if (seq_length >= lengths.back()) {
    return rates.back();
  }
  size_t upper = 1;
  while (lengths[upper] < seq_length) {
    ++upper;
  }
  const double low = std::log(lengths[upper - 1]);
  const double high = std::log(lengths[upper]);
  const double weight = (std::log(seq_length) - low) / (high - low);
  return rates[upper - 1] + weight * (rates[upper] - rates[upper - 1]);
}

}  // namespace

double attention_kernel_tflops(const AttentionKernelTable& table, double seq_length,
                               AttentionPass pass, bool causal) {
  const std::vector<double>& lengths = table.seq_lengths;
  const double forward = interpolate(lengths, table.forward_tflops, seq_length);
  const double forward_causal = interpolate(lengths, table.forward_causal_tflops, seq_length);
  double rate = 0;
  if (pass == AttentionPass::kForward) {
    rate = causal ? forward_causal : forward;
  } else {
    const double backward = interpolate(lengths, table.backward_tflops, seq_length);
    rate = causal ? backward * forward_causal / forward : backward;
  }
  return rate * table.rate_scale;
}

AttentionKernelTable parse_attention_kernel_table(const YAML::Node& node, std::string_view where) {
  const std::string at(where);
  if (!node.IsMap()) {
    throw UserError(at + " must be a mapping (kernel, source, seq_lengths, *_tflops, rate_scale)");
  }
  AttentionKernelTable table;
  table.kernel = required_text(node, "kernel", at);
  table.source = required_text(node, "source", at);
  table.seq_lengths = parse_positive_list(node["seq_lengths"], at + ".seq_lengths");
  table.forward_tflops = parse_positive_list(node["forward_tflops"], at + ".forward_tflops");
  table.forward_causal_tflops =
      parse_positive_list(node["forward_causal_tflops"], at + ".forward_causal_tflops");
  table.backward_tflops = parse_positive_list(node["backward_tflops"], at + ".backward_tflops");
  if (!std::is_sorted(table.seq_lengths.begin(), table.seq_lengths.end()) ||
      std::adjacent_find(table.seq_lengths.begin(), table.seq_lengths.end()) !=
          table.seq_lengths.end()) {
    throw UserError(at + ".seq_lengths must rise strictly");
  }
  for (const auto* rates :
       {&table.forward_tflops, &table.forward_causal_tflops, &table.backward_tflops}) {
    if (rates->size() != table.seq_lengths.size()) {
      throw UserError(at + ": every *_tflops list needs one rate per seq_lengths entry (" +
                      std::to_string(table.seq_lengths.size()) + ")");
    }
  }
  const YAML::Node scale = node["rate_scale"];
  if (!scale || !scale.IsMap() || !scale["value"]) {
    throw UserError(at +
                    ".rate_scale must be {value: N, source: \"...\"} or {value: N, "
                    "assumption: \"...\"}");
  }
  const bool has_source = static_cast<bool>(scale["source"]);
  if (has_source == static_cast<bool>(scale["assumption"])) {
    throw UserError(at + ".rate_scale needs exactly one of 'source' or 'assumption'");
  }
  try {
    table.rate_scale = scale["value"].as<double>();
  } catch (const YAML::Exception&) {
    throw UserError(at + ".rate_scale.value is not a number");
  }
  if (!std::isfinite(table.rate_scale) || table.rate_scale <= 0) {
    throw UserError(at + ".rate_scale.value must be a positive number");
  }
  table.rate_scale_is_assumption = !has_source;
  table.rate_scale_note = (has_source ? scale["source"] : scale["assumption"]).as<std::string>();
  if (table.rate_scale_note.empty()) {
    throw UserError(at + ".rate_scale has an empty " +
                    std::string(has_source ? "source" : "assumption"));
  }
  return table;
}

}  // namespace tpusim
