// model/config.h: a MaxText-style configuration, loaded and type-checked.
//
// Loading order is MaxText's (pyconfig): configs/base.yml -> config files given on the command line
// (each after the files its `base_config:` names) -> configs/models/<model_name>.yml -> `key=value`
// overrides from the command line. tpusim's embedded base.yml is the schema: every key tpusim
// models is there with a comment, and the form of its default fixes its type (4096 int, 12.0
// float, true bool, "x" string, [a, b] list). Keys of MaxText's base.yml that tpusim does not
// model (model/maxtext_keys.h) are accepted and kept aside as passthrough keys, so a MaxText
// config or recipe loads as written. Other unknown keys, wrong types and a key set both by the
// model preset and the command line (without override_model_config=true) are UserErrors naming
// the key. YAML as MaxText writes it: null, 1_000 style numbers, True/False.
//
// Example:
//   Config config = Config::load("", {"model_name=llama3.1-70b", "per_device_batch_size=4"});
//   config.get_int("base_emb_dim");          // 8192 (from configs/models/llama3.1-70b.yml)
//   config.get_float("per_device_batch_size"); // 4.0
//   config.origin("base_emb_dim");            // "configs/models/llama3.1-70b.yml"
//   Config::load_files({"maxtext/configs/base.yml"}, {"profiler=xplane"}).passthrough_keys();
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/maxtext_keys.h"

namespace tpusim {

enum class ConfigType { kInt, kFloat, kBool, kString, kList };

const char* config_type_name(ConfigType type);

class Config {
 public:
  Config();  // empty: no keys (load() gives a config)
  Config(const Config& other);
  Config& operator=(const Config& other);
  Config(Config&& other) noexcept;
  Config& operator=(Config&& other) noexcept;
  ~Config();

  // The embedded base.yml's path; pass "" as base_path to use it.
  static constexpr const char* kEmbeddedBasePath = "configs/base.yml";

  // Loads the embedded base.yml, the config file `base_path` over it when not empty (see
  // load_files), the model preset named by model_name, then the `key=value` overrides, and
  // validates the result.
  static Config load(const std::string& base_path, const std::vector<std::string>& overrides);

  // As load(), with any number of config files (MaxText's base.yml, a model YAML, a partial YAML
  // of overrides), applied in order over the embedded base.yml. Presets are looked up in
  // models/ beside the last file, then among the embedded ones.
  static Config load_files(const std::vector<std::string>& paths,
                           const std::vector<std::string>& overrides);

  // As load(), from texts: `base_text` and a resolver for presets (tests).
  static Config load_from_texts(std::string_view base_text, std::string_view base_origin,
                                const std::map<std::string, std::string>& presets,
                                const std::vector<std::string>& overrides);

  bool has(std::string_view key) const;
  ConfigType type(std::string_view key) const;

  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;  // int keys are widened
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_string_list(std::string_view key) const;
  // A list of [name, items] pairs (logical_axis_rules), items given as a list, one name or null,
  // e.g. [["embed", ["fsdp"]], ["norm", []]]. UserError naming the key when a pair is malformed.
  std::vector<std::pair<std::string, std::vector<std::string>>> get_named_lists(
      std::string_view key) const;
  // The value as text: a scalar as written, a list as flow YAML (["a", "b"]).
  std::string value_text(std::string_view key) const;

  // Where the value came from: the base file, the preset file, or "command line".
  const std::string& origin(std::string_view key) const;

  // Sets `key` from override text as the command line would (type-checked). UserError if bad.
  void set(std::string_view key, std::string_view value_text, const std::string& origin);
  // Sets `key` to a typed value (no text in between), type-checked as `set` does: what a program
  // that chose the value itself uses (explore's candidates), e.g. set_float("x", 1.0 / 3, "me").
  void set_int(std::string_view key, int64_t value, const std::string& origin);
  void set_float(std::string_view key, double value, const std::string& origin);
  void set_bool(std::string_view key, bool value, const std::string& origin);
  void set_string(std::string_view key, const std::string& value, const std::string& origin);

  // Keys in base.yml order.
  const std::vector<std::string>& keys() const;

  nlohmann::json to_json() const;

  // A MaxText key tpusim does not model, as the config set it (last value wins).
  struct PassthroughKey {
    std::string key;
    std::string value;  // flow YAML text, e.g. "True", "[a, b]", "" for null
    std::string origin;
    MaxTextKeyEffect effect = MaxTextKeyEffect::kNotModeled;
    bool is_maxtext_default = false;  // the value equals MaxText's default: changes nothing
  };
  // In key order.
  std::vector<PassthroughKey> passthrough_keys() const;

  // The overrides (key=value) that differ from base.yml + preset, in key order, e.g. for printing
  // the exact command that reproduces this config.
  std::vector<std::string> command_line_overrides() const;

 private:
  // The keys' values and origins and the passthrough keys (config.cpp: values are yaml-cpp nodes,
  // which no includer sees).
  struct State;
  friend struct ConfigNodeAccess;  // model/config_node.h

  static Config load_base(std::string_view base_text, std::string_view base_origin);
  // Presets (logical_axis_rules merged by name unless override_logical_axis_rules, from the
  // command line, the preset or the files), then the command line's overrides, then
  // validate_config.
  void finish_loading(const std::map<std::string, std::string>& presets,
                      const std::vector<std::string>& overrides);

  std::unique_ptr<State> state_;
};

// Parses "key=value" into its parts; UserError when there is no '=' or the key is empty.
std::pair<std::string, std::string> split_override(std::string_view text);

// Names of the model presets available (embedded, plus those beside `base_path`).
std::vector<std::string> available_model_presets(const std::string& base_path);

}  // namespace tpusim
