#include "model/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include "common/csv.h"
#include "common/embedded_files.h"
#include "common/error.h"
#include "common/suggest.h"
#include "common/utf8.h"
#include "common/yaml_text.h"
#include "model/config_files.h"
#include "model/config_node.h"
#include "model/config_rules.h"
#include "model/config_values.h"

namespace tpusim {

using config_internal::check_unique_keys;
using config_internal::check_value_length;
using config_internal::coerce;
using config_internal::ConfigFileLayer;
using config_internal::describe;
using config_internal::infer_type;
using config_internal::merge_rules_by_name;
using config_internal::parse_canonical_int;
using config_internal::preset_path_beside;
using config_internal::read_config_file;
using config_internal::read_config_text;
using config_internal::shown_key;
using config_internal::unbuilt_preset_reason;
using config_internal::yaml_to_json;

namespace {

constexpr const char* kCommandLine = "command line";
constexpr const char* kDefaultModelName = "default";

}  // namespace

struct Config::State {
  struct Entry {
    ConfigType type = ConfigType::kString;
    YAML::Node value;
    std::string origin;
  };

  const Entry& entry(std::string_view key) const;
  // apply(), with logical_axis_rules merged by name (see merge_rules_by_name in config.cpp).
  void apply_layer_value(const std::string& key, const YAML::Node& value, const std::string& origin,
                         bool override_logical_axis_rules);
  void apply(std::string_view key, const YAML::Node& value, const std::string& origin);
  void keep_passthrough(const MaxTextKey& key, const YAML::Node& value, const std::string& origin);
  std::vector<std::string> known_key_names() const;

  std::vector<std::string> order_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, PassthroughKey, std::less<>> passthrough_;
};

// The yaml-cpp value of a key, for tests that compare YAML (model/config_node.h).
struct ConfigNodeAccess {
  static YAML::Node node(const Config& config, std::string_view key) {
    return config.state_->entry(key).value;
  }
};

YAML::Node config_node(const Config& config, std::string_view key) {
  return ConfigNodeAccess::node(config, key);
}

Config::Config() : state_(std::make_unique<State>()) {}
Config::Config(const Config& other)
    : state_(std::make_unique<State>(other.state_ ? *other.state_ : State())) {}
Config& Config::operator=(const Config& other) {
  if (this != &other) {
    state_ = std::make_unique<State>(other.state_ ? *other.state_ : State());
  }
  return *this;
}
Config::Config(Config&& other) noexcept = default;
Config& Config::operator=(Config&& other) noexcept = default;
Config::~Config() = default;

const std::vector<std::string>& Config::keys() const {
  return state_->order_;
}

std::pair<std::string, std::string> split_override(std::string_view text) {
  const size_t equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    throw UserError("'" + std::string(text) + "' is not a key=value override");
  }
  return {std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
}

namespace {

// The value the command line gives a bool key, if it gives one.
std::optional<bool> command_line_bool(const std::string& key,
                                      const std::vector<std::string>& overrides) {
  for (const std::string& text : overrides) {
    const auto [override_key, value] = split_override(text);
    if (override_key == key) {
      return coerce(YAML::Node(value), ConfigType::kBool, key, kCommandLine).as<bool>();
    }
  }
  return std::nullopt;
}

// A key and where it is set, for the check of unknown keys before any is applied.
struct KeySource {
  std::string key;
  std::string origin;
};

// Every key of `sources` that neither the schema (`schema_keys`, base.yml's) nor MaxText has, in
// one UserError, each with where it is set and its closest known key: a config with several typos
// is mended in one round, not one per run.
void throw_if_unknown_keys(const std::vector<std::string>& schema_keys,
                           const std::vector<KeySource>& sources) {
  const std::set<std::string, std::less<>> schema(schema_keys.begin(), schema_keys.end());
  std::vector<std::string> known = schema_keys;
  for (const MaxTextKey& key : maxtext_keys()) {
    known.push_back(key.name);
  }
  std::vector<const KeySource*> unknown;
  std::set<std::string> listed;
  for (const KeySource& source : sources) {
    const MaxTextKey* maxtext = find_maxtext_key(source.key);
    const bool is_known = schema.contains(source.key) ||
                          (maxtext != nullptr && maxtext->effect != MaxTextKeyEffect::kModeled);
    if (!is_known && listed.insert(source.key + "\n" + source.origin).second) {
      unknown.push_back(&source);
    }
  }
  if (unknown.empty()) {
    return;
  }
  if (unknown.size() == 1) {
    throw UserError("unknown config key '" + shown_key(unknown[0]->key) + "' in " +
                        unknown[0]->origin + " (neither tpusim nor MaxText has it)" +
                        did_you_mean(unknown[0]->key, known),
                    unknown[0]->key);
  }
  std::string message = std::to_string(unknown.size()) +
                        " unknown config keys (neither tpusim nor MaxText has them): ";
  for (size_t index = 0; index < unknown.size(); ++index) {
    message += (index == 0 ? "'" : "; '") + shown_key(unknown[index]->key) + "' in " +
               unknown[index]->origin + did_you_mean(unknown[index]->key, known);
  }
  throw UserError(message, unknown[0]->key);
}

// The keys the presets set, with their files (a preset that is not a mapping is left to
// finish_loading's message).
void add_preset_keys(const std::map<std::string, std::string>& presets,
                     std::vector<KeySource>& sources) {
  for (const auto& [origin, text] : presets) {
    const YAML::Node preset = parse_yaml(text, origin);
    if (preset.IsMap()) {
      check_unique_keys(preset, origin);
      for (const auto& item : preset) {
        sources.push_back({item.first.as<std::string>(), origin});
      }
    }
  }
}

void add_override_keys(const std::vector<std::string>& overrides, std::vector<KeySource>& sources) {
  for (const std::string& text : overrides) {
    sources.push_back({split_override(text).first, kCommandLine});
  }
}

}  // namespace

Config Config::load(const std::string& base_path, const std::vector<std::string>& overrides) {
  return load_files(
      base_path.empty() ? std::vector<std::string>{} : std::vector<std::string>{base_path},
      overrides);
}

Config Config::load_files(const std::vector<std::string>& paths,
                          const std::vector<std::string>& overrides) {
  std::vector<ConfigFileLayer> files;
  for (const std::string& path : paths) {
    read_config_file(path, 0, files);
  }
  // Find the model preset the same way MaxText does: the command line's model_name wins, then
  // the last file that names one, then base.yml's.
  std::optional<std::string> model_name;
  for (const ConfigFileLayer& layer : files) {
    if (const YAML::Node name = layer.root["model_name"];
        name && (name.IsScalar() || name.IsNull())) {
      model_name = name.IsNull() ? "" : name.Scalar();
    }
  }
  for (const std::string& text : overrides) {
    const auto [key, value] = split_override(text);
    if (key == "model_name") {
      model_name = value;
    }
  }
  // MaxText loads configs/models/<model_name>.yml for any name but "default": an empty or null
  // one is no model, not the default (tpusim estimated the default model, labelled "").
  if (model_name && model_name->empty()) {
    throw UserError(
        "model_name: empty; name a model preset (e.g. model_name=llama3.1-8b) or "
        "model_name=default",
        "model_name");
  }
  const std::string last_path = paths.empty() ? "" : paths.back();
  std::map<std::string, std::string> presets;
  if (model_name && *model_name != kDefaultModelName) {
    const std::string beside = preset_path_beside(last_path, *model_name);
    const std::string embedded_path = "configs/models/" + *model_name + ".yml";
    if (!beside.empty() && std::filesystem::exists(beside)) {
      presets[beside] = read_config_text(beside);
    } else if (const auto text = embedded_file(embedded_path)) {
      presets[embedded_path] = std::string(*text);
    } else if (const std::string missing = unbuilt_preset_reason(*model_name); !missing.empty()) {
      throw UserError("model_name: '" + *model_name +
                          "' is a MaxText preset tpusim does not build yet: " + missing +
                          " (configs/maxtext/presets_not_built.tsv lists these presets)",
                      "model_name");
    } else {
      throw UserError("model_name: unknown model '" + *model_name + "'" +
                          did_you_mean(*model_name, available_model_presets(last_path)),
                      "model_name");
    }
  }
  // The embedded base.yml is parsed once per process (the YAML parse was half of a command's
  // time); each load gets deep copies of its values, since yaml-cpp nodes are shared references.
  static const Config embedded_base =
      load_base(*embedded_file(kEmbeddedBasePath), kEmbeddedBasePath);
  Config config;
  config.state_->order_ = embedded_base.state_->order_;
  for (const auto& [key, entry] : embedded_base.state_->entries_) {
    // A fresh Entry: assigning to a copied node would redirect the shared one instead.
    State::Entry copy;
    copy.type = entry.type;
    copy.value = YAML::Clone(entry.value);
    copy.origin = entry.origin;
    config.state_->entries_.emplace(key, std::move(copy));
  }
  std::vector<KeySource> sources;
  for (const ConfigFileLayer& layer : files) {
    for (const auto& item : layer.root) {
      sources.push_back({item.first.as<std::string>(), layer.origin});
    }
  }
  add_preset_keys(presets, sources);
  add_override_keys(overrides, sources);
  throw_if_unknown_keys(config.state_->order_, sources);
  for (const ConfigFileLayer& layer : files) {
    for (const auto& item : layer.root) {
      // A file's rules always merge by name: the embedded base's rules are MaxText's plus the
      // logical axes tpusim's model names, which a MaxText base.yml does not list.
      config.state_->apply_layer_value(item.first.as<std::string>(), item.second, layer.origin,
                                       false);
    }
  }
  config.finish_loading(presets, overrides);
  return config;
}

Config Config::load_from_texts(std::string_view base_text, std::string_view base_origin,
                               const std::map<std::string, std::string>& presets,
                               const std::vector<std::string>& overrides) {
  Config config = load_base(base_text, base_origin);
  std::vector<KeySource> sources;
  add_preset_keys(presets, sources);
  add_override_keys(overrides, sources);
  throw_if_unknown_keys(config.state_->order_, sources);
  config.finish_loading(presets, overrides);
  return config;
}

Config Config::load_base(std::string_view base_text, std::string_view base_origin) {
  Config config;
  const std::string base_name(base_origin);
  const YAML::Node base = parse_yaml(base_text, base_name);
  if (!base.IsMap()) {
    throw UserError(base_name + ": the base config must be a YAML mapping of key: value");
  }
  for (const auto& item : base) {
    const std::string key = item.first.as<std::string>();
    if (config.state_->entries_.contains(key)) {
      std::string message = base_name;
      message += ": key '" + key + "' appears twice";
      throw UserError(message);
    }
    State::Entry entry;
    entry.type = infer_type(item.second, key, base_name);
    entry.value = coerce(item.second, entry.type, key, base_name);
    entry.origin = base_name;
    config.state_->entries_.emplace(key, entry);
    config.state_->order_.push_back(key);
  }
  return config;
}

void Config::finish_loading(const std::map<std::string, std::string>& presets,
                            const std::vector<std::string>& overrides) {
  std::set<std::string> preset_keys;
  for (const auto& [origin, text] : presets) {
    const YAML::Node preset = parse_yaml(text, origin);
    if (preset.IsNull()) {
      continue;
    }
    if (!preset.IsMap()) {
      throw UserError(origin + ": a model preset must be a YAML mapping of key: value");
    }
    // override_logical_axis_rules as the command line, else the preset itself, else the files
    // set it (MaxText: deepseek3-671b-2dfsdp's preset replaces the whole list).
    const std::string override_key = "override_logical_axis_rules";
    if (preset[override_key]) {
      state_->apply(override_key, preset[override_key], origin);
    }
    const bool override_rules =
        command_line_bool(override_key, overrides).value_or(get_bool(override_key));
    for (const auto& item : preset) {
      const std::string key = item.first.as<std::string>();
      state_->apply_layer_value(key, item.second, origin, override_rules);
      preset_keys.insert(key);
    }
  }

  const bool allow_model_override =
      command_line_bool("override_model_config", overrides)
          .value_or(has("override_model_config") && get_bool("override_model_config"));
  std::set<std::string> seen_on_command_line;
  for (const std::string& text : overrides) {
    const auto [key, value] = split_override(text);
    if (!seen_on_command_line.insert(key).second) {
      throw UserError("'" + key + "' is given twice on the command line", key);
    }
    if (preset_keys.contains(key) && !allow_model_override) {
      throw UserError(
          "'" + key + "' is set by the model preset (model_name=" + get_string("model_name") +
              ") and on the command line; pass override_model_config=true to override it, "
              "as in MaxText",
          key);
    }
    set(key, value, kCommandLine);
  }
  validate_config(*this);
  // Multimodal training runs the vision/audio encoders, which tpusim does not build: refuse it
  // rather than estimate the text decoder alone as if it were the whole step.
  for (const char* key : {"use_multimodal", "use_audio"}) {
    const auto found = state_->passthrough_.find(key);
    if (found != state_->passthrough_.end() &&
        coerce(YAML::Node(found->second.value.empty() ? "false" : found->second.value),
               ConfigType::kBool, key, found->second.origin)
            .as<bool>()) {
      throw UserError(std::string(key) + "=" + found->second.value + " (" + found->second.origin +
                          "): the multimodal encoders are not modeled; tpusim estimates and trains "
                          "text decoders only",
                      key);
    }
  }
}

namespace {

// Checks a value of a MaxText key tpusim does not model but that would change the step against
// MaxText's type for it, loosely (MaxText's own checks differ by revision): bools are true/false in
// any case, numbers are numbers (1_000 style allowed), lists are lists, maps are maps; null fits
// every type.
void check_passthrough_value(const MaxTextKey& key, const YAML::Node& value,
                             const std::string& origin) {
  // A key that cannot change the estimate is not checked further: MaxText's own types for them
  // vary by revision (image_size_for_vit is an int in base.yml and a list in gemma4's presets).
  if (value.IsNull() || key.effect == MaxTextKeyEffect::kNoEffect) {
    return;
  }
  // Scalars are checked as tpusim's own keys of that type are (coerce); lists may also be given as
  // a scalar, as MaxText's command line allows; maps must be maps.
  static const std::map<std::string, ConfigType, std::less<>> kScalarTypes = {
      {"bool", ConfigType::kBool},
      {"int", ConfigType::kInt},
      {"float", ConfigType::kFloat},
      {"str", ConfigType::kString}};
  const std::string where = origin + ", a MaxText key";
  if (const auto scalar = kScalarTypes.find(key.type); scalar != kScalarTypes.end()) {
    coerce(value, scalar->second, key.name, where);
  } else if ((key.type == "list" && !value.IsSequence() && !value.IsScalar()) ||
             (key.type == "map" && !value.IsMap())) {
    throw UserError("'" + key.name + "' (" + where + "): expected a " + key.type + ", got '" +
                        describe(value) + "'",
                    key.name);
  }
}

}  // namespace

void Config::State::apply_layer_value(const std::string& key, const YAML::Node& value,
                                      const std::string& origin, bool override_logical_axis_rules) {
  if (key != "logical_axis_rules" || !value.IsSequence()) {
    apply(key, value, origin);
  } else if (!override_logical_axis_rules) {
    apply(key, merge_rules_by_name(entry(key).value, value, origin), origin);
  } else {
    // The layer's list replaces MaxText's rules; the rules of tpusim's own logical axes, which no
    // MaxText list names, stay (else the tensors they shard would silently be replicated).
    YAML::Node rules = YAML::Clone(value);
    std::set<std::string> named;
    for (const YAML::Node& rule : value) {
      if (rule.IsSequence() && rule.size() == 2 && rule[0].IsScalar()) {
        named.insert(rule[0].Scalar());
      }
    }
    for (const YAML::Node& rule : entry(key).value) {
      const std::string name = rule[0].Scalar();
      if (!is_maxtext_logical_axis(name) && !named.contains(name)) {
        rules.push_back(rule);
      }
    }
    apply(key, rules, origin);
  }
}

std::vector<std::string> Config::State::known_key_names() const {
  std::vector<std::string> names = order_;
  for (const MaxTextKey& key : maxtext_keys()) {
    names.push_back(key.name);
  }
  return names;
}

namespace {

// A MaxText key's value as the passthrough list shows it.
Config::PassthroughKey passthrough_key(const MaxTextKey& key, const YAML::Node& value,
                                       const std::string& origin) {
  Config::PassthroughKey kept;
  kept.key = key.name;
  kept.value = value.IsNull() ? "" : (value.IsScalar() ? value.Scalar() : describe(value));
  kept.origin = origin;
  kept.effect = key.effect;
  kept.is_maxtext_default = equals_maxtext_default(key, kept.value);
  return kept;
}

}  // namespace

void Config::State::keep_passthrough(const MaxTextKey& key, const YAML::Node& value,
                                     const std::string& origin) {
  check_passthrough_value(key, value, origin);
  passthrough_[key.name] = passthrough_key(key, value, origin);
}

void Config::State::apply(std::string_view key, const YAML::Node& value,
                          const std::string& origin) {
  if (value.IsScalar()) {
    check_value_length(std::string(key), value.Scalar().size(), origin);
  }
  const auto found = entries_.find(key);
  if (found == entries_.end()) {
    const MaxTextKey* maxtext = find_maxtext_key(key);
    if (maxtext == nullptr || maxtext->effect == MaxTextKeyEffect::kModeled) {
      throw UserError("unknown config key '" + shown_key(std::string(key)) + "' in " + origin +
                          " (neither tpusim nor MaxText has it)" +
                          did_you_mean(key, known_key_names()),
                      std::string(key));
    }
    keep_passthrough(*maxtext, value, origin);
    return;
  }
  // MaxText writes null for "not set": a string becomes ""; a list keeps its value (a null
  // logical_axis_rules must not silently replicate everything); a number or bool whose MaxText
  // default is itself null keeps tpusim's default.
  if (value.IsNull() && found->second.type != ConfigType::kString) {
    const MaxTextKey* maxtext = find_maxtext_key(key);
    if (found->second.type == ConfigType::kList ||
        (maxtext != nullptr && equals_maxtext_default(*maxtext, ""))) {
      return;
    }
  }
  // reset(), not operator=: a YAML::Node assignment writes through to every copy sharing the
  // node, so setting a key on a copied Config would change the original too.
  found->second.value.reset(coerce(value, found->second.type, std::string(key), origin));
  found->second.origin = origin;
}

void Config::set(std::string_view key, std::string_view value_text, const std::string& origin) {
  check_value_length(std::string(key), value_text.size(), origin);  // before it is parsed
  const auto found = state_->entries_.find(key);
  const MaxTextKey* maxtext = found == state_->entries_.end() ? find_maxtext_key(key) : nullptr;
  if (found == state_->entries_.end() &&
      (maxtext == nullptr || maxtext->effect == MaxTextKeyEffect::kModeled)) {
    throw UserError("unknown config key '" + shown_key(std::string(key)) + "'" +
                        " (neither tpusim nor MaxText has it)" +
                        did_you_mean(key, state_->known_key_names()),
                    std::string(key));
  }
  const bool is_string = found != state_->entries_.end() ? found->second.type == ConfigType::kString
                                                         : maxtext->type == "str";
  YAML::Node value;
  if (is_string) {
    std::string text(value_text);
    if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
        text.back() == text.front()) {
      text = text.substr(1, text.size() - 2);
    }
    value = YAML::Node(text);
  } else {
    value = parse_yaml(value_text, "'" + std::string(key) + "' on the " + origin);
  }
  state_->apply(key, value, origin);
}

void Config::set_int(std::string_view key, int64_t value, const std::string& origin) {
  state_->apply(key, YAML::Node(value), origin);
}

void Config::set_float(std::string_view key, double value, const std::string& origin) {
  state_->apply(key, YAML::Node(value), origin);
}

void Config::set_bool(std::string_view key, bool value, const std::string& origin) {
  state_->apply(key, YAML::Node(value), origin);
}

void Config::set_string(std::string_view key, const std::string& value, const std::string& origin) {
  state_->apply(key, YAML::Node(value), origin);
}

std::vector<Config::PassthroughKey> Config::passthrough_keys() const {
  std::map<std::string, PassthroughKey, std::less<>> keys = state_->passthrough_;
  // tpusim's own schema holds a few MaxText keys the estimate does not read (their effect in
  // configs/maxtext/base_keys.tsv is not "modeled"): listed like the others when a config sets
  // them.
  for (const auto& [name, entry] : state_->entries_) {
    const MaxTextKey* maxtext = find_maxtext_key(name);
    if (entry.origin == kEmbeddedBasePath || maxtext == nullptr ||
        maxtext->effect == MaxTextKeyEffect::kModeled) {
      continue;
    }
    PassthroughKey kept = passthrough_key(*maxtext, entry.value, entry.origin);
    if (!kept.is_maxtext_default) {  // a preset restating MaxText's default says nothing new
      keys[name] = std::move(kept);
    }
  }
  std::vector<PassthroughKey> list;
  list.reserve(keys.size());
  for (const auto& [name, kept] : keys) {
    list.push_back(kept);
  }
  return list;
}

bool Config::has(std::string_view key) const {
  return state_->entries_.find(key) != state_->entries_.end();
}

const Config::State::Entry& Config::State::entry(std::string_view key) const {
  const auto found = entries_.find(key);
  if (found == entries_.end()) {
    throw std::logic_error("config key '" + std::string(key) + "' is not in base.yml");
  }
  return found->second;
}

ConfigType Config::type(std::string_view key) const {
  return state_->entry(key).type;
}

int64_t Config::get_int(std::string_view key) const {
  const State::Entry& found = state_->entry(key);
  if (found.type != ConfigType::kInt) {
    throw std::logic_error("config key '" + std::string(key) + "' is not an integer");
  }
  // Int values are stored in canonical decimal (coerce), which from_chars reads exactly as
  // yaml-cpp's stream conversion would, without building a stringstream per read.
  if (const std::optional<int64_t> value = parse_canonical_int(found.value.Scalar())) {
    return *value;
  }
  return found.value.as<int64_t>();
}

double Config::get_float(std::string_view key) const {
  const State::Entry& found = state_->entry(key);
  if (found.type != ConfigType::kFloat && found.type != ConfigType::kInt) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a number");
  }
  // Numbers are stored as the decimal text of a finite double (coerce); from_chars rounds it to
  // the same double as yaml-cpp's stream conversion, without a stringstream per read.
  const std::string& text = found.value.Scalar();
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!text.empty() && error == std::errc() && end == text.data() + text.size()) {
    return value;
  }
  return found.value.as<double>();
}

bool Config::get_bool(std::string_view key) const {
  const State::Entry& found = state_->entry(key);
  if (found.type != ConfigType::kBool) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a bool");
  }
  return found.value.as<bool>();
}

std::string Config::get_string(std::string_view key) const {
  const State::Entry& found = state_->entry(key);
  if (found.type != ConfigType::kString) {
    throw std::logic_error("config key '" + std::string(key) + "' is not a string");
  }
  return found.value.as<std::string>();
}

std::vector<std::string> Config::get_string_list(std::string_view key) const {
  const State::Entry& found = state_->entry(key);
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

std::vector<std::pair<std::string, std::vector<std::string>>> Config::get_named_lists(
    std::string_view key) const {
  const std::string name(key);
  std::vector<std::pair<std::string, std::vector<std::string>>> pairs;
  for (const YAML::Node& pair : state_->entry(key).value) {
    if (!pair.IsSequence() || pair.size() != 2 || !pair[0].IsScalar()) {
      throw UserError(name +
                      ": each rule must be [logical_name, [mesh axes]], got an "
                      "entry with " +
                      std::to_string(pair.size()) + " item(s)");
    }
    const std::string pair_name = pair[0].Scalar();
    std::vector<std::string> items;
    const YAML::Node listed = pair[1];
    if (listed.IsScalar()) {
      items.push_back(listed.Scalar());
    } else if (listed.IsSequence()) {
      for (const YAML::Node& item : listed) {
        if (!item.IsScalar()) {
          throw UserError(name + ": rule '" + pair_name + "' must list mesh axis names");
        }
        items.push_back(item.Scalar());
      }
    } else if (!listed.IsNull()) {
      throw UserError(name + ": rule '" + pair_name + "' must list mesh axis names");
    }
    pairs.emplace_back(pair_name, std::move(items));
  }
  return pairs;
}

std::string Config::value_text(std::string_view key) const {
  const YAML::Node node = state_->entry(key).value;
  if (node.IsScalar()) {
    return node.Scalar();
  }
  YAML::Emitter emitter;
  emitter << YAML::Flow << YAML::DoubleQuoted << node;
  return emitter.c_str();
}

const std::string& Config::origin(std::string_view key) const {
  return state_->entry(key).origin;
}

nlohmann::json Config::to_json() const {
  nlohmann::json json = nlohmann::json::object();
  for (const std::string& key : state_->order_) {
    const State::Entry& found = state_->entries_.at(key);
    json[key] = yaml_to_json(found.value, found.type);
  }
  return json;
}

std::vector<std::string> Config::command_line_overrides() const {
  std::vector<std::string> overrides;
  for (const std::string& key : state_->order_) {
    const State::Entry& found = state_->entries_.at(key);
    if (found.origin == kCommandLine) {
      overrides.push_back(key + "=" + describe(found.value));
    }
  }
  return overrides;
}

}  // namespace tpusim
