// model/config_files.h: the files a Config is read from, for model/config.cpp: a config file and
// the chain of files its `base_config:` names, model presets (embedded or beside a base.yml), and
// MaxText's merge of a preset's logical_axis_rules into the base rules by logical axis name.
//
// Example:
//   std::vector<ConfigFileLayer> layers;
//   read_config_file("configs/models/llama2-7b.yml", /*depth=*/0, layers);  // base_config first
//   preset_path_beside("my/base.yml", "llama2-7b");  // "my/models/llama2-7b.yml"
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace tpusim::config_internal {

// Bounds on what a config is read from (bad input past them is a UserError naming the limit): a
// config file of more than 4 MiB (MaxText's base.yml is about 50 KB), a scalar value of more than
// 64 KiB (the longest real ones, paths and rule lists, are a few KB; a 200 MB value took 47 s and
// 1.6 GB), and a key of more than 256 bytes is shown cut short in messages (kMaxSuggestedWordBytes
// in common/suggest.h: no suggestion is computed for it).
inline constexpr size_t kMaxConfigFileBytes = size_t{4} << 20;
inline constexpr size_t kMaxConfigValueBytes = size_t{64} << 10;
inline constexpr size_t kMaxShownKeyBytes = 256;

// A config file's text; UserError naming the path and the limit past kMaxConfigFileBytes.
std::string read_config_text(const std::string& path);

// UserError when the value of `key` is longer than kMaxConfigValueBytes, naming the key and limit.
void check_value_length(const std::string& key, size_t bytes, const std::string& origin);

// `key` as messages show it: whole up to kMaxShownKeyBytes, else its start and its length.
std::string shown_key(const std::string& key);

// UserError naming the key and `origin` when the mapping `root` gives a key twice: yaml-cpp keeps
// both and the last would silently win (PyYAML's loader, which MaxText uses, does the same).
void check_unique_keys(const YAML::Node& root, const std::string& origin);

// One config file and what its `base_config:` chain put before it, in application order.
struct ConfigFileLayer {
  std::string origin;
  YAML::Node root;  // a mapping, without its base_config key
};

// Appends `path`'s layers (its base_config chain first, then the file) to `layers`.
void read_config_file(const std::string& path, int depth, std::vector<ConfigFileLayer>& layers);

// The preset file `model_name` would have beside a base.yml at `base_path` ("" for the embedded).
std::string preset_path_beside(const std::string& base_path, const std::string& model_name);

// What tpusim lacks to build a MaxText preset ("decoder_block gemma4"), or "" when the name is not
// such a preset.
std::string unbuilt_preset_reason(const std::string& model_name);

// MaxText merges a model preset's logical_axis_rules into the base rules by logical axis name
// (unless override_logical_axis_rules): a name the preset gives replaces every base rule of that
// name, at the place of the first one; base rules of other names stay, fallbacks included; new
// names come last. Config files merge the same way into the embedded base.yml, whose rules are
// MaxText's plus the logical axes tpusim's model names (activation_batch_no_exp): a MaxText
// base.yml given as a file then keeps them. A name mapped to [] replicates that axis.
YAML::Node merge_rules_by_name(const YAML::Node& base, const YAML::Node& preset,
                               const std::string& origin);

}  // namespace tpusim::config_internal
