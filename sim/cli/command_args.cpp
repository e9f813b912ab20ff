#include "sim/cli/command_args.h"

#include <algorithm>
#include <iostream>
#include <span>
#include <string_view>

#include "common/error.h"
#include "model/decoder_family.h"

namespace tpusim {

CommandArgs split_command_args(const std::vector<std::string>& args) {
  CommandArgs result;
  for (const std::string& arg : args) {
    if (arg.find('=') != std::string::npos) {
      result.overrides.push_back(arg);
      continue;
    }
    if (arg.ends_with(".yml") || arg.ends_with(".yaml")) {
      result.config_paths.push_back(arg);
      continue;
    }
    throw UserError("argument '" + arg +
                    "' is neither a key=value override nor a .yml config file");
  }
  return result;
}

namespace {

// A flag sets a switch only where nothing the user wrote did (the key keeps base.yml's value);
// `flags.overrides` keeps the ones applied.
void apply_flag_overrides(Config& config, XlaFlagReport& flags) {
  std::vector<std::string> applied;
  for (const std::string& item : flags.overrides) {
    const auto [key, value] = split_override(item);
    if (config.origin(key) == Config::kEmbeddedBasePath) {
      config.set(key, value, "XLA flags");
      applied.push_back(item);
    }
  }
  flags.overrides = applied;
}

}  // namespace

Config load_command_config(const std::vector<std::string>& args, const std::string& xla_flags,
                           XlaFlagReport* xla_report,
                           const std::function<void(const Config&)>& check, std::ostream& notes) {
  const CommandArgs split = split_command_args(args);
  XlaFlagReport flags = xla_flag_overrides(xla_flags, split.overrides);
  Config config = Config::load_files(split.config_paths, split.overrides);
  apply_flag_overrides(config, flags);
  if (check) {
    check(config);
  }
  report_passthrough_keys(config, notes);
  report_xla_flags(flags, notes);
  if (xla_report != nullptr) {
    *xla_report = flags;
  }
  return config;
}

Config load_recipe_config(const std::vector<std::string>& args, const std::string& xla_flags) {
  const CommandArgs split = split_command_args(args);
  XlaFlagReport flags = xla_flag_overrides(xla_flags, split.overrides, /*read_environment=*/false);
  Config config = Config::load_files(split.config_paths, split.overrides);
  apply_flag_overrides(config, flags);
  return config;
}

namespace {

// The MaxText keys the config's decoder family reads (DecoderFamily::builder_maxtext_keys): they
// are modeled for it, so listed neither as ignored nor as not modeled.
std::span<const std::string_view> family_keys_from_config(const Config& config) {
  return decoder_family(parse_decoder_block(config.get_string("decoder_block")))
      .builder_maxtext_keys;
}

bool read_by_family(std::span<const std::string_view> keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

void report_passthrough_keys(const Config& config, std::ostream& out) {
  // A whole MaxText base.yml sets hundreds of keys: name the first few, count the rest (--json
  // lists them all).
  constexpr size_t kNamedIgnoredKeys = 12;
  std::vector<std::string> ignored;
  std::string not_modeled;
  const std::span<const std::string_view> family_keys = family_keys_from_config(config);
  for (const Config::PassthroughKey& key : config.passthrough_keys()) {
    if (read_by_family(family_keys, key.key)) {
      continue;
    }
    if (key.effect == MaxTextKeyEffect::kNotModeled && !key.is_maxtext_default) {
      not_modeled += (not_modeled.empty() ? "" : ", ") + key.key + "=" + key.value;
    } else {
      ignored.push_back(key.key);
    }
  }
  if (!ignored.empty()) {
    out << "tpusim: " << ignored.size() << " MaxText key" << (ignored.size() == 1 ? "" : "s")
        << " with no effect on the estimate: ";
    for (size_t index = 0; index < ignored.size() && index < kNamedIgnoredKeys; ++index) {
      out << (index == 0 ? "" : ", ") << ignored[index];
    }
    if (ignored.size() > kNamedIgnoredKeys) {
      out << ", ... (" << ignored.size() - kNamedIgnoredKeys << " more; --json lists them)";
    }
    out << "\n";
  }
  if (!not_modeled.empty()) {
    out << "tpusim: warning: MaxText keys not modeled (the estimate ignores them): " << not_modeled
        << "\n";
  }
}

nlohmann::json passthrough_keys_json(const Config& config) {
  nlohmann::json json = {{"ignored_keys", nlohmann::json::array()},
                         {"not_modeled_keys", nlohmann::json::object()}};
  const std::span<const std::string_view> family_keys = family_keys_from_config(config);
  for (const Config::PassthroughKey& key : config.passthrough_keys()) {
    if (read_by_family(family_keys, key.key)) {
      continue;
    }
    if (key.effect == MaxTextKeyEffect::kNotModeled && !key.is_maxtext_default) {
      json["not_modeled_keys"][key.key] = key.value;
    } else {
      json["ignored_keys"].push_back(key.key);
    }
  }
  return json;
}

}  // namespace tpusim
