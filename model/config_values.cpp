#include "model/config_values.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "common/utf8.h"

namespace tpusim {

const char* config_type_name(ConfigType type) {
  switch (type) {
    case ConfigType::kInt:
      return "integer";
    case ConfigType::kFloat:
      return "number";
    case ConfigType::kBool:
      return "bool";
    case ConfigType::kString:
      return "string";
    case ConfigType::kList:
      return "list";
  }
  return "?";
}

namespace config_internal {
namespace {

// YAML 1.1 (PyYAML, which MaxText reads its configs with) allows digit-group underscores in
// numbers: "1_000_000", "10_000.5". yaml-cpp (YAML 1.2) reads them as strings, so a number's text
// loses its underscores before it is parsed. Only underscores between digits are removed.
std::string without_digit_underscores(const std::string& text) {
  if (text.find('_') == std::string::npos) {
    return text;
  }
  std::string digits;
  for (size_t index = 0; index < text.size(); ++index) {
    if (text[index] == '_') {
      const bool between_digits = index > 0 && index + 1 < text.size() &&
                                  std::isdigit(static_cast<unsigned char>(text[index - 1])) &&
                                  std::isdigit(static_cast<unsigned char>(text[index + 1]));
      if (!between_digits) {
        return text;
      }
      continue;
    }
    digits += text[index];
  }
  return digits;
}

bool looks_like_float(const std::string& text) {
  return text.find_first_of(".eE") != std::string::npos &&
         text.find_first_not_of("0123456789+-.eE") == std::string::npos;
}

bool looks_like_int(const std::string& text) {
  if (text.empty()) {
    return false;
  }
  const size_t start = (text[0] == '-' || text[0] == '+') ? 1 : 0;
  return start < text.size() && text.find_first_not_of("0123456789", start) == std::string::npos;
}

}  // namespace

// A decimal integer without sign prefix '+', leading zeros or spaces ("0", "-12", "4096"): the
// form coerce() stores. Anything else (octal "012", hex "0x1f", ...) is left to yaml-cpp.
std::optional<int64_t> parse_canonical_int(std::string_view text) {
  const size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
  if (text.size() <= digits || (text[digits] == '0' && text.size() > digits + 1)) {
    return std::nullopt;
  }
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

// Quoted scalars are strings whatever they contain.
ConfigType infer_type(const YAML::Node& node, const std::string& key, const std::string& origin) {
  if (node.IsSequence()) {
    return ConfigType::kList;
  }
  if (!node.IsScalar()) {
    throw UserError(origin + ": '" + key + "' must be a scalar or a list, not " +
                    (node.IsNull() ? "null" : "a mapping"));
  }
  if (node.Tag() == "!") {
    return ConfigType::kString;
  }
  const std::string& text = node.Scalar();
  if (text == "true" || text == "false") {
    return ConfigType::kBool;
  }
  if (looks_like_int(text)) {
    return ConfigType::kInt;
  }
  if (looks_like_float(text)) {
    return ConfigType::kFloat;
  }
  return ConfigType::kString;
}

std::string describe(const YAML::Node& node) {
  YAML::Emitter emitter;
  emitter << YAML::Flow << node;
  return emitter.c_str();
}

YAML::Node coerce(const YAML::Node& value, ConfigType type, const std::string& key,
                  const std::string& origin) {
  const std::string where = "'" + key + "'" + (origin.empty() ? "" : " (" + origin + ")");
  auto fail = [&](const std::string& expected) -> YAML::Node {
    throw UserError(where + ": expected " + expected + ", got '" + describe(value) + "'", key);
  };
  switch (type) {
    case ConfigType::kList:
      if (!value.IsSequence()) {
        return fail("a list like [a, b]");
      }
      return value;
    case ConfigType::kString:
      if (value.IsNull()) {
        return YAML::Node(std::string());
      }
      if (!value.IsScalar()) {
        return fail("a string");
      }
      if (!is_valid_utf8(value.Scalar())) {
        throw UserError(where + ": the value is not valid UTF-8", key);
      }
      return YAML::Node(value.Scalar());
    case ConfigType::kBool: {
      if (!value.IsScalar()) {
        return fail("true or false");
      }
      std::string text = value.Scalar();
      for (char& character : text) {
        character = static_cast<char>(std::tolower(static_cast<unsigned char>(character)));
      }
      if (text == "true") {
        return YAML::Node(true);
      }
      if (text == "false") {
        return YAML::Node(false);
      }
      return fail("true or false");
    }
    case ConfigType::kInt: {
      const std::string text = value.IsScalar() ? without_digit_underscores(value.Scalar()) : "";
      // A whole number written with a zero fraction (qwen2.5's rope_max_timescale: 1000000.0) is
      // that integer, as MaxText's pydantic schema takes it; 1.5 and 1e3 are not integers.
      const size_t point = text.find('.');
      const std::string whole =
          point != std::string::npos && text.find_first_not_of('0', point + 1) == std::string::npos
              ? text.substr(0, point)
              : text;
      if (!value.IsScalar() || !looks_like_int(whole)) {
        return fail("an integer");
      }
      try {
        return YAML::Node(std::stoll(whole));
      } catch (const std::out_of_range&) {
        return fail("an integer within 64 bits");
      }
    }
    case ConfigType::kFloat: {
      const std::string text = value.IsScalar() ? without_digit_underscores(value.Scalar()) : "";
      if (!value.IsScalar() || !(looks_like_int(text) || looks_like_float(text))) {
        return fail("a number");
      }
      double number = 0;
      try {
        number = std::stod(text);
      } catch (const std::exception&) {
        return fail("a number");
      }
      if (!std::isfinite(number)) {
        return fail("a finite number");
      }
      return YAML::Node(number);
    }
  }
  return value;
}

nlohmann::json yaml_to_json(const YAML::Node& node, ConfigType type) {
  switch (type) {
    case ConfigType::kInt:
      return node.as<int64_t>();
    case ConfigType::kFloat:
      return node.as<double>();
    case ConfigType::kBool:
      return node.as<bool>();
    case ConfigType::kString:
      return node.as<std::string>();
    case ConfigType::kList: {
      nlohmann::json list = nlohmann::json::array();
      for (const YAML::Node& item : node) {
        list.push_back(item.IsSequence() ? yaml_to_json(item, ConfigType::kList)
                                         : nlohmann::json(item.Scalar()));
      }
      return list;
    }
  }
  return nullptr;
}

}  // namespace config_internal
}  // namespace tpusim
