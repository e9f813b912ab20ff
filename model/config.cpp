#include "model/config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "common/embedded_files.h"
#include "common/error.h"
#include "common/suggest.h"
#include "common/yaml_text.h"
#include "model/config_rules.h"

namespace tpusim {
namespace {

constexpr const char* kCommandLine = "command line";
constexpr const char* kDefaultModelName = "default";

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

// The type base.yml's default declares. Quoted scalars are strings whatever they contain.
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

// Checks that `value` fits `type` and returns it in canonical form.
YAML::Node coerce(const YAML::Node& value, ConfigType type, const std::string& key,
                  const std::string& origin) {
  const std::string where = "'" + key + "'" + (origin.empty() ? "" : " (" + origin + ")");
  auto fail = [&](const std::string& expected) -> YAML::Node {
    throw UserError(where + ": expected " + expected + ", got '" + describe(value) + "'");
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
      if (!value.IsScalar() || !looks_like_int(value.Scalar())) {
        return fail("an integer");
      }
      try {
        return YAML::Node(std::stoll(value.Scalar()));
      } catch (const std::out_of_range&) {
        return fail("an integer within 64 bits");
      }
    }
    case ConfigType::kFloat: {
      if (!value.IsScalar() ||
          !(looks_like_int(value.Scalar()) || looks_like_float(value.Scalar()))) {
        return fail("a number");
      }
      double number = 0;
      try {
        number = std::stod(value.Scalar());
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

std::string preset_path_beside(const std::string& base_path, const std::string& model_name) {
  if (base_path.empty()) {
    return "";
  }
  const std::filesystem::path directory = std::filesystem::path(base_path).parent_path();
  return (directory / "models" / (model_name + ".yml")).string();
}

}  // namespace

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

std::pair<std::string, std::string> split_override(std::string_view text) {
  const size_t equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    throw UserError("'" + std::string(text) + "' is not a key=value override");
  }
  return {std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
}

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

Config Config::load(const std::string& base_path, const std::vector<std::string>& overrides) {
  std::string base_text;
  std::string base_origin;
  if (base_path.empty()) {
    base_text = std::string(*embedded_file(kEmbeddedBasePath));
    base_origin = kEmbeddedBasePath;
  } else {
    base_text = read_text_file(base_path);
    base_origin = base_path;
  }
  // Find the model preset the same way MaxText does: the command line's model_name wins.
  std::string model_name;
  for (const std::string& text : overrides) {
    const auto [key, value] = split_override(text);
    if (key == "model_name") {
      model_name = value;
    }
  }
  std::map<std::string, std::string> presets;
  if (model_name.empty()) {
    const YAML::Node base = parse_yaml(base_text, base_origin);
    if (base.IsMap() && base["model_name"] && base["model_name"].IsScalar()) {
      model_name = base["model_name"].Scalar();
    }
  }
  if (!model_name.empty() && model_name != kDefaultModelName) {
    const std::string beside = preset_path_beside(base_path, model_name);
    const std::string embedded_path = "configs/models/" + model_name + ".yml";
    if (!beside.empty() && std::filesystem::exists(beside)) {
      presets[beside] = read_text_file(beside);
    } else if (const auto text = embedded_file(embedded_path)) {
      presets[embedded_path] = std::string(*text);
    } else {
      throw UserError("model_name: unknown model '" + model_name + "'" +
                      did_you_mean(model_name, available_model_presets(base_path)));
    }
  }
  return load_from_texts(base_text, base_origin, presets, overrides);
}

Config Config::load_from_texts(std::string_view base_text, std::string_view base_origin,
                               const std::map<std::string, std::string>& presets,
                               const std::vector<std::string>& overrides) {
  Config config;
  const std::string base_name(base_origin);
  const YAML::Node base = parse_yaml(base_text, base_name);
  if (!base.IsMap()) {
    throw UserError(base_name + ": the base config must be a YAML mapping of key: value");
  }
  for (const auto& item : base) {
    const std::string key = item.first.as<std::string>();
    if (config.entries_.contains(key)) {
      std::string message = base_name;
      message += ": key '" + key + "' appears twice";
      throw UserError(message);
    }
    Entry entry;
    entry.type = infer_type(item.second, key, base_name);
    entry.value = coerce(item.second, entry.type, key, base_name);
    entry.origin = base_name;
    config.entries_.emplace(key, entry);
    config.order_.push_back(key);
  }

  std::set<std::string> preset_keys;
  for (const auto& [origin, text] : presets) {
    const YAML::Node preset = parse_yaml(text, origin);
    if (preset.IsNull()) {
      continue;
    }
    if (!preset.IsMap()) {
      throw UserError(origin + ": a model preset must be a YAML mapping of key: value");
    }
    for (const auto& item : preset) {
      const std::string key = item.first.as<std::string>();
      config.apply(key, item.second, origin);
      preset_keys.insert(key);
    }
  }

  const bool allow_model_override = [&] {
    for (const std::string& text : overrides) {
      const auto [key, value] = split_override(text);
      if (key == "override_model_config") {
        return coerce(YAML::Node(value), ConfigType::kBool, key, kCommandLine).as<bool>();
      }
    }
    return config.has("override_model_config") && config.get_bool("override_model_config");
  }();
  std::set<std::string> seen_on_command_line;
  for (const std::string& text : overrides) {
    const auto [key, value] = split_override(text);
    if (!seen_on_command_line.insert(key).second) {
      throw UserError("'" + key + "' is given twice on the command line");
    }
    if (preset_keys.contains(key) && !allow_model_override) {
      throw UserError("'" + key + "' is set by the model preset (model_name=" +
                      config.get_string("model_name") +
                      ") and on the command line; pass override_model_config=true to override it, "
                      "as in MaxText");
    }
    config.set(key, value, kCommandLine);
  }
  validate_config(config);
  return config;
}

void Config::apply(std::string_view key, const YAML::Node& value, const std::string& origin) {
  const auto found = entries_.find(key);
  if (found == entries_.end()) {
    throw UserError("unknown config key '" + std::string(key) + "' in " + origin +
                    did_you_mean(key, order_));
  }
  // reset(), not operator=: YAML::Node assignment writes into the node every copy of this
  // Config shares, so setting a key on a copy would change the original too.
  found->second.value.reset(coerce(value, found->second.type, std::string(key), origin));
  found->second.origin = origin;
}

void Config::set(std::string_view key, std::string_view value_text, const std::string& origin) {
  const auto found = entries_.find(key);
  if (found == entries_.end()) {
    throw UserError("unknown config key '" + std::string(key) + "'" + did_you_mean(key, order_));
  }
  YAML::Node value;
  if (found->second.type == ConfigType::kString) {
    std::string text(value_text);
    if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
        text.back() == text.front()) {
      text = text.substr(1, text.size() - 2);
    }
    value = YAML::Node(text);
  } else {
    value = parse_yaml(value_text, "'" + std::string(key) + "' on the " + origin);
  }
  apply(key, value, origin);
}

bool Config::has(std::string_view key) const {
  return entries_.find(key) != entries_.end();
}

const Config::Entry& Config::entry(std::string_view key) const {
  const auto found = entries_.find(key);
  if (found == entries_.end()) {
    throw std::logic_error("config key '" + std::string(key) + "' is not in base.yml");
  }
  return found->second;
}

ConfigType Config::type(std::string_view key) const {
  return entry(key).type;
}

int64_t Config::get_int(std::string_view key) const {
  const Entry& found = entry(key);
  if (found.type != ConfigType::kInt) {
    throw std::logic_error("config key '" + std::string(key) + "' is not an integer");
  }
  return found.value.as<int64_t>();
}

double Config::get_float(std::string_view key) const {
  const Entry& found = entry(key);
  if (found.type != ConfigType::kFloat && found.type != ConfigType::kInt) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a number");
  }
  return found.value.as<double>();
}

bool Config::get_bool(std::string_view key) const {
  const Entry& found = entry(key);
  if (found.type != ConfigType::kBool) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a bool");
  }
  return found.value.as<bool>();
}

std::string Config::get_string(std::string_view key) const {
  const Entry& found = entry(key);
  if (found.type != ConfigType::kString) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a string");
  }
  return found.value.as<std::string>();
}

std::vector<std::string> Config::get_string_list(std::string_view key) const {
  const Entry& found = entry(key);
  if (found.type != ConfigType::kList) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a list");
  }
  std::vector<std::string> items;
  for (const YAML::Node& item : found.value) {
    if (!item.IsScalar()) {
      throw UserError("'" + std::string(key) + "' must be a list of strings, got '" +
                      describe(found.value) + "'");
    }
    items.push_back(item.Scalar());
  }
  return items;
}

YAML::Node Config::get_node(std::string_view key) const {
  return entry(key).value;
}

const std::string& Config::origin(std::string_view key) const {
  return entry(key).origin;
}

namespace {

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

}  // namespace

nlohmann::json Config::to_json() const {
  nlohmann::json json = nlohmann::json::object();
  for (const std::string& key : order_) {
    const Entry& found = entries_.at(key);
    json[key] = yaml_to_json(found.value, found.type);
  }
  return json;
}

std::vector<std::string> Config::command_line_overrides() const {
  std::vector<std::string> overrides;
  for (const std::string& key : order_) {
    const Entry& found = entries_.at(key);
    if (found.origin == kCommandLine) {
      overrides.push_back(key + "=" + describe(found.value));
    }
  }
  return overrides;
}

}  // namespace tpusim
