// sim/cli/command_args.h: splits a MaxText-style argument list into the config file and overrides.
//
// MaxText is run as `train.py configs/base.yml key=value ...`; tpusim takes the same shape. The
// config file is optional (the embedded configs/base.yml is used without one).
//
// Example:
//   split_command_args({"configs/base.yml", "model_name=llama2-7b"})
//     -> {base_path = "configs/base.yml", overrides = {"model_name=llama2-7b"}}
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace tpusim {

struct CommandArgs {
  std::string base_path;               // "" = embedded configs/base.yml
  std::vector<std::string> overrides;  // "key=value"
};

// UserError when an argument is neither key=value nor a .yml/.yaml file, or two files are given.
CommandArgs split_command_args(const std::vector<std::string>& args);

// The config the arguments name: base file (or the embedded base.yml), preset, overrides.
Config load_command_config(const std::vector<std::string>& args);

}  // namespace tpusim
