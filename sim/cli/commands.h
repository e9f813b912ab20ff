// sim/cli/commands.h: the tpusim subcommands, each registered on a CLI11 app.
//
// Each register_* function adds one subcommand with its options and a callback that prints its
// result (human text, or --json). Callbacks throw UserError on bad input; main() turns that into
// exit code 2.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tpusim {

void register_topology_command(CLI::App& app);
void register_hw_command(CLI::App& app);
void register_config_command(CLI::App& app);
void register_program_command(CLI::App& app);
void register_estimate_command(CLI::App& app);
void register_compare_command(CLI::App& app);
void register_explore_command(CLI::App& app);
void register_plan_command(CLI::App& app);
void register_validate_command(CLI::App& app);
void register_op_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_train_command(CLI::App& app);
void register_export_hf_command(CLI::App& app);
void register_generate_command(CLI::App& app);

// `--without NAME[,NAME...]` on `command` (estimate, validate): the cost mechanisms to switch off
// (common/mechanisms.h), read into `names`; its help lists every mechanism.
CLI::Option* add_without_option(CLI::App& command, std::vector<std::string>& names);

}  // namespace tpusim
