#include "model/config_files.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>

#include "common/csv.h"
#include "common/embedded_files.h"
#include "common/error.h"
#include "common/input_files.h"
#include "common/yaml_text.h"
#include "model/config.h"
#include "model/config_values.h"

namespace tpusim {

std::vector<std::string> available_model_presets(const std::string& base_path) {
  std::set<std::string> names;
  for (const std::string& path : embedded_files_under("configs/models/")) {
    const std::filesystem::path file(path);
    if (file.extension() == ".yml") {
      names.insert(file.stem().string());
    }
  }
  if (!base_path.empty()) {
    std::error_code error;
    const auto directory = std::filesystem::path(base_path).parent_path() / "models";
    for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
      if (entry.path().extension() == ".yml") {
        names.insert(entry.path().stem().string());
      }
    }
  }
  return {names.begin(), names.end()};
}

namespace config_internal {

constexpr int kMaxBaseConfigDepth = 16;

std::string read_config_text(const std::string& path) {
  std::error_code error;
  const std::uintmax_t bytes = std::filesystem::file_size(path, error);
  if (!error && bytes > kMaxConfigFileBytes) {
    throw UserError("'" + path + "' is " + std::to_string(bytes) +
                    " bytes, more than the largest config file tpusim reads (" +
                    std::to_string(kMaxConfigFileBytes) + " bytes, 4 MiB)");
  }
  return read_text_file(path);
}

void check_value_length(const std::string& key, size_t bytes, const std::string& origin) {
  if (bytes > kMaxConfigValueBytes) {
    throw UserError("'" + shown_key(key) + "' (" + origin + "): the value is " +
                        std::to_string(bytes) +
                        " bytes, more than the longest value tpusim reads (" +
                        std::to_string(kMaxConfigValueBytes) + " bytes, 64 KiB)",
                    key.size() > kMaxShownKeyBytes ? std::string() : key);
  }
}

std::string shown_key(const std::string& key) {
  if (key.size() <= kMaxShownKeyBytes) {
    return key;
  }
  constexpr size_t kShownStart = 64;
  return key.substr(0, kShownStart) + "... (a key of " + std::to_string(key.size()) + " bytes)";
}

void check_unique_keys(const YAML::Node& root, const std::string& origin) {
  if (!root.IsMap()) {
    return;
  }
  std::set<std::string> seen;
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    if (!seen.insert(key).second) {
      throw UserError(origin + ": key '" + shown_key(key) + "' appears twice (" +
                          yaml_location(item.first, origin) + "); give each key once",
                      key);
    }
  }
}

void read_config_file(const std::string& path, int depth, std::vector<ConfigFileLayer>& layers) {
  if (depth > kMaxBaseConfigDepth) {
    throw UserError(path + ": base_config chain deeper than " +
                    std::to_string(kMaxBaseConfigDepth) + " files (a cycle?)");
  }
  note_input(path);
  const YAML::Node root = parse_yaml(read_config_text(path), path);
  if (root.IsNull()) {
    return;
  }
  if (!root.IsMap()) {
    throw UserError(path + ": a config file must be a YAML mapping of key: value");
  }
  check_unique_keys(root, path);
  YAML::Node own(YAML::NodeType::Map);
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    if (key != "base_config") {
      own[key] = item.second;
      continue;
    }
    if (!item.second.IsScalar() || item.second.Scalar().empty()) {
      throw UserError(path + ": base_config must name a config file");
    }
    // MaxText resolves base_config beside the file that names it. A model YAML copied alone
    // names MaxText's "base.yml": tpusim's embedded base.yml stands for it.
    const std::filesystem::path named(item.second.Scalar());
    const std::filesystem::path beside = std::filesystem::path(path).parent_path() / named;
    std::error_code error;
    const bool found = std::filesystem::exists(beside, error);
    if (error) {  // a symbolic-link loop (ELOOP), a path too long, a directory not searchable
      throw UserError(path + ": base_config '" + named.string() + "' cannot be opened (" +
                      error.message() + ")");
    }
    if (found) {
      read_config_file(beside.string(), depth + 1, layers);
    } else if (named.filename() != "base.yml") {
      throw UserError(path + ": base_config '" + named.string() + "' not found (looked for '" +
                      beside.string() + "')");
    }
  }
  layers.push_back({path, own});
}

std::string preset_path_beside(const std::string& base_path, const std::string& model_name) {
  if (base_path.empty()) {
    return "";
  }
  const std::filesystem::path directory = std::filesystem::path(base_path).parent_path();
  return (directory / "models" / (model_name + ".yml")).string();
}

std::string unbuilt_preset_reason(const std::string& model_name) {
  constexpr const char* kPath = "configs/maxtext/presets_not_built.tsv";
  const auto text = embedded_file(kPath);
  if (!text) {
    return "";
  }
  const CsvTable table = parse_tsv(*text, kPath);  // preset, what is missing
  for (const std::vector<std::string>& row : table.rows) {
    if (row[0] == model_name) {
      return row[1];
    }
  }
  return "";
}

YAML::Node merge_rules_by_name(const YAML::Node& base, const YAML::Node& preset,
                               const std::string& origin) {
  auto rule_name = [&](const YAML::Node& rule) {
    if (!rule.IsSequence() || rule.size() != 2 || !rule[0].IsScalar()) {
      throw UserError("logical_axis_rules (" + origin +
                      "): each rule must be [logical_axis, mesh_axes], got '" + describe(rule) +
                      "'");
    }
    return rule[0].Scalar();
  };
  std::map<std::string, std::vector<YAML::Node>> replacements;
  std::vector<std::string> preset_order;
  for (const YAML::Node& rule : preset) {
    const std::string name = rule_name(rule);
    if (!replacements.contains(name)) {
      preset_order.push_back(name);
    }
    replacements[name].push_back(rule);
  }
  YAML::Node merged(YAML::NodeType::Sequence);
  std::set<std::string> placed;
  for (const YAML::Node& rule : base) {
    const std::string name = rule_name(rule);
    const auto replacement = replacements.find(name);
    if (replacement == replacements.end()) {
      merged.push_back(rule);
    } else if (placed.insert(name).second) {
      for (const YAML::Node& new_rule : replacement->second) {
        merged.push_back(new_rule);
      }
    }
  }
  for (const std::string& name : preset_order) {
    if (placed.insert(name).second) {
      for (const YAML::Node& new_rule : replacements[name]) {
        merged.push_back(new_rule);
      }
    }
  }
  return merged;
}

}  // namespace config_internal
}  // namespace tpusim
