#include "model/maxtext_keys.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include "common/embedded_files.h"

namespace tpusim {
namespace {

constexpr const char* kTablePath = "configs/maxtext/base_keys.tsv";

std::vector<std::string> split_tabs(std::string_view line) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    fields.emplace_back(
        line.substr(start, tab == std::string_view::npos ? line.npos : tab - start));
    if (tab == std::string_view::npos) {
      return fields;
    }
    start = tab + 1;
  }
}

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
  std::vector<MaxTextKey> keys;
  bool header_seen = false;
  size_t start = 0;
  while (start < text->size()) {
    const size_t end = std::min(text->find('\n', start), text->size());
    const std::string_view line = text->substr(start, end - start);
    start = end + 1;
    if (line.empty() || line.front() == '#') {
      continue;
    }
    if (!header_seen) {
      header_seen = true;  // key, default, type, effect, note
      continue;
    }
    const std::vector<std::string> fields = split_tabs(line);
    if (fields.size() != 5) {
      throw std::logic_error(std::string(kTablePath) + ": row '" + std::string(line) +
                             "' does not have 5 columns");
    }
    keys.push_back({fields[0], fields[1], fields[2], parse_effect(fields[3]), fields[4]});
  }
  return keys;
}

std::string lowercase(std::string_view text) {
  std::string lower(text);
  for (char& character : lower) {
    character = static_cast<char>(std::tolower(static_cast<unsigned char>(character)));
  }
  return lower;
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
  static const std::map<std::string, const MaxTextKey*, std::less<>> by_name = [] {
    std::map<std::string, const MaxTextKey*, std::less<>> map;
    for (const MaxTextKey& key : maxtext_keys()) {
      map.emplace(key.name, &key);
    }
    return map;
  }();
  const auto found = by_name.find(name);
  return found == by_name.end() ? nullptr : found->second;
}

bool equals_maxtext_default(const MaxTextKey& key, std::string_view value_text) {
  const std::string_view value = unquoted(value_text);
  const std::string_view fallback = unquoted(key.default_text);
  if (is_empty_value(value) || is_empty_value(fallback)) {
    return is_empty_value(value) && is_empty_value(fallback);
  }
  if (lowercase(value) == lowercase(fallback)) {
    return true;  // the same text, or True/true
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
  double a = 0;
  double b = 0;
  const auto parsed_a = std::from_chars(value.data(), value.data() + value.size(), a);
  const auto parsed_b = std::from_chars(fallback.data(), fallback.data() + fallback.size(), b);
  return parsed_a.ec == std::errc() && parsed_a.ptr == value.data() + value.size() &&
         parsed_b.ec == std::errc() && parsed_b.ptr == fallback.data() + fallback.size() && a == b;
}

}  // namespace tpusim
