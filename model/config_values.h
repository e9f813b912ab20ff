// model/config_values.h: YAML values as config values, for model/config.cpp and its file
// reading: the type a base.yml default fixes, the check that a value fits a key's type (with
// MaxText's spellings: 1_000 numbers, True/False, 1000000.0 for an integer) and its canonical
// form, and the JSON of a value.
//
// Example:
//   coerce(YAML::Node("1_000"), ConfigType::kInt, "steps", "command line").as<int64_t>();  // 1000
//   infer_type(YAML::Node("12.0"), "learning_rate", "base.yml");  // ConfigType::kFloat
//   describe(node);  // "[a, b]": a value as flow YAML, for messages
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "model/config.h"

namespace tpusim::config_internal {

// The integer `text` spells in canonical form ("12", "-3"), if it does.
std::optional<int64_t> parse_canonical_int(std::string_view text);
// The type a base.yml default fixes (4096 int, 12.0 float, true bool, "x" string, [a, b] list).
ConfigType infer_type(const YAML::Node& node, const std::string& key, const std::string& origin);
// `node` as flow YAML text, for messages and command lines.
std::string describe(const YAML::Node& node);
// Checks that `value` fits `type` and returns it in canonical form; UserError naming `key` else.
YAML::Node coerce(const YAML::Node& value, ConfigType type, const std::string& key,
                  const std::string& origin);
nlohmann::json yaml_to_json(const YAML::Node& node, ConfigType type);

}  // namespace tpusim::config_internal
