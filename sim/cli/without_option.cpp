#include "common/mechanisms.h"
#include "sim/cli/commands.h"

namespace tpusim {

CLI::Option* add_without_option(CLI::App& command, std::vector<std::string>& names) {
  return command
      .add_option("--without", names,
                  "Switch off named cost mechanisms (comma-separated), to see what each "
                  "contributes: " +
                      mechanism_names_joined())
      ->delimiter(',');
}

}  // namespace tpusim
