// sim/cli/run_cli.cpp: the whole tpusim command line as one function (see run_cli.h).
#include "sim/cli/run_cli.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "sim/cli/commands.h"

namespace tpusim {
namespace {

// The message with control characters a value may carry (a newline, a tab, an escape) written
// as \n, \t or \xHH, so an error stays one line on stderr whatever the user typed.
std::string one_line(const std::string& message) {
  std::string out;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

int run_cli_or_throw(int argc, char** argv) {
  CLI::App app{"tpusim: estimate, explore and functionally run MaxText training on TPU slices"};
  app.require_subcommand(1);
  register_topology_command(app);
  register_hw_command(app);
  register_config_command(app);
  register_program_command(app);
  register_estimate_command(app);
  register_compare_command(app);
  register_explore_command(app);
  register_plan_command(app);
  register_validate_command(app);
  register_op_command(app);
  register_eval_command(app);
  register_train_command(app);
  register_export_hf_command(app);
  register_generate_command(app);
  // Under --json an error is also one JSON object on stdout, so scripts read every outcome
  // from one stream: {"error": message, "key": the config key or null, "exit": 2}.
  const bool json_errors = std::any_of(
      argv + 1, argv + argc, [](const char* arg) { return std::string_view(arg) == "--json"; });
  auto user_error = [&](const std::string& message, const std::string& key) {
    std::cerr << "tpusim: " << one_line(message) << "\n";
    if (json_errors) {
      const nlohmann::json error = {{"error", message},
                                    {"key", key.empty() ? nlohmann::json() : nlohmann::json(key)},
                                    {"exit", kUserErrorExitCode}};
      // A message can quote bytes the user typed; replace any that are not UTF-8.
      std::cout << error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return kUserErrorExitCode;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    return user_error(error.what(), "");
  } catch (const UserError& error) {
    return user_error(error.what(), error.key());
  } catch (const VerifyFailure& failure) {
    std::cerr << "tpusim: " << one_line(failure.what()) << "\n";
    return kVerifyFailedExitCode;
  } catch (const YAML::Exception& error) {
    return user_error(std::string("malformed value: ") + error.what(), "");
  }
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
  // Anything else is a programming error: report it instead of letting it escape.
  try {
    return run_cli_or_throw(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "tpusim: internal error: " << one_line(error.what()) << "\n";
    return kInternalErrorExitCode;
  }
}

}  // namespace tpusim
