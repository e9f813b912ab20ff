#include "sim/cli/command_args.h"

#include "common/error.h"

namespace tpusim {

CommandArgs split_command_args(const std::vector<std::string>& args) {
  CommandArgs result;
  for (const std::string& arg : args) {
    if (arg.find('=') != std::string::npos) {
      result.overrides.push_back(arg);
      continue;
    }
    if (arg.ends_with(".yml") || arg.ends_with(".yaml")) {
      if (!result.base_path.empty()) {
        throw UserError("two config files given ('" + result.base_path + "' and '" + arg +
                        "'); pass one base config and key=value overrides");
      }
      result.base_path = arg;
      continue;
    }
    throw UserError("argument '" + arg +
                    "' is neither a key=value override nor a .yml config file");
  }
  return result;
}

Config load_command_config(const std::vector<std::string>& args) {
  const CommandArgs split = split_command_args(args);
  return Config::load(split.base_path, split.overrides);
}

}  // namespace tpusim
