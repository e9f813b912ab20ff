// model/config_node.h: a config key's value as the yaml-cpp node it is stored as, for tests that
// compare a loaded config with YAML (MaxText's presets). The program reads typed values
// (model/config.h); only config.cpp and this header's users see yaml-cpp.
//
// Example:
//   for (const YAML::Node& rule : config_node(config, "logical_axis_rules")) { ... }
#pragma once

#include <string_view>

#include <yaml-cpp/yaml.h>

#include "model/config.h"

namespace tpusim {

// The stored value of `key` (a schema key; std::logic_error otherwise). yaml-cpp nodes are shared
// references: do not assign through it.
YAML::Node config_node(const Config& config, std::string_view key);

}  // namespace tpusim
