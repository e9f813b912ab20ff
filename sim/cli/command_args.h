// sim/cli/command_args.h: splits a MaxText-style argument list into config files and overrides,
// and reports the MaxText keys the config sets that tpusim does not model.
//
// MaxText is run as `train.py configs/base.yml key=value ...`; tpusim takes the same shape, with
// any number of config files (MaxText's base.yml, a model YAML, a partial YAML of overrides),
// applied in order over the embedded configs/base.yml.
//
// Example:
//   split_command_args({"configs/base.yml", "my_run.yml", "model_name=llama2-7b"})
//     -> {config_paths = {"configs/base.yml", "my_run.yml"}, overrides = {"model_name=llama2-7b"}}
#pragma once

#include <functional>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "sim/cli/xla_flags.h"

namespace tpusim {

struct CommandArgs {
  std::vector<std::string> config_paths;  // none = the embedded configs/base.yml alone
  std::vector<std::string> overrides;     // "key=value"
};

// UserError when an argument is neither key=value nor a .yml/.yaml file.
CommandArgs split_command_args(const std::vector<std::string>& args);

// The config the arguments name: embedded base.yml, the files, the preset, the overrides, plus the
// switches XLA flags set (`xla_flags`, then LIBTPU_INIT_ARGS and XLA_FLAGS: sim/cli/xla_flags.h;
// a key on the command line wins). Lists the MaxText keys tpusim does not model and the XLA flags
// on `notes` (stderr); `xla_report`, when given, receives what the flags did. `check`, when given,
// runs on the config first, so that a command's own refusal is the only line printed.
Config load_command_config(const std::vector<std::string>& args, const std::string& xla_flags = "",
                           XlaFlagReport* xla_report = nullptr,
                           const std::function<void(const Config&)>& check = nullptr,
                           std::ostream& notes = std::cerr);

// The config of a recipe as it ran: its arguments and its own XLA flags, not the environment's
// (LIBTPU_INIT_ARGS, XLA_FLAGS), and nothing printed (validate loads many).
Config load_recipe_config(const std::vector<std::string>& args, const std::string& xla_flags);

// One line for the keys that cannot change the estimate ("no effect on the estimate: profiler,
// gcs_metrics"), and a warning for those that could but are not modeled, set to a value other
// than MaxText's default ("warning: not modeled, the estimate ignores: use_random_routing=True").
void report_passthrough_keys(const Config& config, std::ostream& out);

// The same as JSON: {"ignored_keys": [...], "not_modeled_keys": {"key": "value", ...}}.
nlohmann::json passthrough_keys_json(const Config& config);

}  // namespace tpusim
