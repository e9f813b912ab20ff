// tpusim: TPU-topology simulator and MaxText performance model. See README.md.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "sim/cli/commands.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"tpusim: estimate, explore and functionally run MaxText training on TPU slices"};
  app.require_subcommand(1);
  tpusim::register_topology_command(app);
  tpusim::register_hw_command(app);
  tpusim::register_config_command(app);
  tpusim::register_program_command(app);
  tpusim::register_estimate_command(app);
  tpusim::register_explore_command(app);
  tpusim::register_validate_command(app);
  tpusim::register_op_command(app);
  tpusim::register_train_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::cerr << "tpusim: " << error.what() << "\n";
    return tpusim::kUserErrorExitCode;
  } catch (const tpusim::UserError& error) {
    std::cerr << "tpusim: " << error.what() << "\n";
    return tpusim::kUserErrorExitCode;
  } catch (const YAML::Exception& error) {
    std::cerr << "tpusim: malformed value: " << error.what() << "\n";
    return tpusim::kUserErrorExitCode;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Anything else is a programming error: report it instead of letting it escape main.
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "tpusim: internal error: " << error.what() << "\n";
    return 1;
  }
}
