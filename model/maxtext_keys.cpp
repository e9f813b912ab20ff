#include "model/maxtext_keys.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <set>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include "common/csv.h"
#include "common/embedded_files.h"
#include "common/lowercase.h"
#include "common/name_index.h"

namespace tpusim {
namespace {

constexpr const char* kTablePath = "configs/maxtext/base_keys.tsv";

MaxTextKeyEffect parse_effect(const std::string& text) {
  if (text == "modeled") {
    return MaxTextKeyEffect::kModeled;
  }
  if (text == "none") {
    return MaxTextKeyEffect::kNoEffect;
  }
  if (text == "not_modeled") {
    return MaxTextKeyEffect::kNotModeled;
  }
  throw std::logic_error(std::string(kTablePath) + ": unknown effect '" + text + "'");
}

std::vector<MaxTextKey> load_table() {
  const auto text = embedded_file(kTablePath);
  if (!text) {
    throw std::logic_error(std::string(kTablePath) + " is not embedded");
  }
  const CsvTable table = parse_tsv(*text, kTablePath);  // key, default, type, effect, note
  std::vector<MaxTextKey> keys;
  keys.reserve(table.rows.size());
  for (const std::vector<std::string>& row : table.rows) {
    keys.push_back({row[table.column("key")], row[table.column("default")],
                    row[table.column("type")], parse_effect(row[table.column("effect")]),
                    row[table.column("note")]});
  }
  return keys;
}

// The text without surrounding quotes ("x" or 'x').
std::string_view unquoted(std::string_view text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

std::string flow_text(const YAML::Node& node) {
  YAML::Emitter emitter;
  emitter << YAML::Flow << YAML::DoubleQuoted << node;
  return emitter.c_str();
}

bool is_empty_value(std::string_view text) {
  const std::string lower = lowercase(unquoted(text));
  return lower.empty() || lower == "none" || lower == "null" || lower == "~";
}

}  // namespace

const std::vector<MaxTextKey>& maxtext_keys() {
  static const std::vector<MaxTextKey> keys = load_table();
  return keys;
}

const MaxTextKey* find_maxtext_key(std::string_view name) {
  static const NameIndex<MaxTextKey> index(maxtext_keys());
  return index.find(name);
}

bool equals_maxtext_default(const MaxTextKey& key, std::string_view value_text) {
  const std::string_view value = unquoted(value_text);
  const std::string_view fallback = unquoted(key.default_text);
  if (is_empty_value(value) || is_empty_value(fallback)) {
    return is_empty_value(value) && is_empty_value(fallback);
  }
  if (value == fallback || (key.type == "bool" && lowercase(value) == lowercase(fallback))) {
    return true;  // the same text, or True/true for a bool
  }
  if (fallback.front() == '[' || fallback.front() == '{') {
    // Lists and maps: the same YAML structure, whatever its quoting and spacing.
    try {
      return flow_text(YAML::Load(std::string(value))) ==
             flow_text(YAML::Load(std::string(fallback)));
    } catch (const YAML::Exception&) {
      return false;
    }
  }
  // Numbers: the same value however written (1_000, 1000, 1e3); digit-group underscores dropped.
  auto number = [](std::string_view text) -> std::optional<double> {
    std::string digits(text);
    std::erase(digits, '_');
    double parsed = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), parsed);
    if (error != std::errc() || end != digits.data() + digits.size()) {
      return std::nullopt;
    }
    return parsed;
  };
  const std::optional<double> a = number(value);
  const std::optional<double> b = number(fallback);
  return a && b && *a == *b;
}

bool is_maxtext_logical_axis(std::string_view name) {
  static const std::set<std::string, std::less<>> names = [] {
    std::set<std::string, std::less<>> found;
    const MaxTextKey* rules = find_maxtext_key("logical_axis_rules");
    if (rules == nullptr) {
      throw std::logic_error("the MaxText key table has no logical_axis_rules");
    }
    for (const YAML::Node& rule : YAML::Load(rules->default_text)) {
      found.insert(rule[0].Scalar());
    }
    return found;
  }();
  return names.contains(name);
}

}  // namespace tpusim
