// common/yaml_text.h: parse YAML text and files, turning syntax errors into UserErrors that name
// the file, line and column.
//
// Example:
//   YAML::Node root = parse_yaml(read_text_file("configs/base.yml"), "configs/base.yml");
#pragma once

#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

namespace tpusim {

// Whole file as text; UserError naming the path when it cannot be read, is not a regular file, or
// is larger than 8 GiB.
std::string read_text_file(const std::string& path);

// Parses YAML text holding one document (several are a UserError: only the first would count);
// `origin` names the source in error messages.
YAML::Node parse_yaml(std::string_view text, std::string_view origin);

// "file:line" of a node, for messages about a value inside a file.
std::string yaml_location(const YAML::Node& node, std::string_view origin);

}  // namespace tpusim
