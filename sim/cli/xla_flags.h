// sim/cli/xla_flags.h: the XLA / libtpu flags of a MaxText recipe, mapped to tpusim's switches.
//
// Recipes export LIBTPU_INIT_ARGS (or XLA_FLAGS) with dozens of compiler flags. A few change what
// tpusim models: the SparseCore collective offloads (-> sparse_core_collective_offload) and XLA's
// async collective fusion, which decomposes tensor-parallel collectives into the matmuls
// (-> collective_matmul). They set those keys unless the command line, a config file or the preset
// sets them (load_command_config applies them last, where the key still has base.yml's value).
// Tracing flags cannot change a step; every other flag is reported as not modeled.
//
// Example:
//   XlaFlagReport report = xla_flag_overrides(
//       "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true --xla_dump_to=/tmp", {});
//   report.overrides;    // {"sparse_core_collective_offload=on"}
//   report.no_effect;    // {"xla_dump_to"}
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpusim {

struct XlaFlagReport {
  std::vector<std::string> sources;      // e.g. "--xla-flags", "LIBTPU_INIT_ARGS"
  std::vector<std::string> overrides;    // key=value for tpusim, from modeled flags
  std::vector<std::string> modeled;      // the flags behind `overrides`, as given
  std::vector<std::string> no_effect;    // flag names
  std::vector<std::string> not_modeled;  // flag names
  bool empty() const { return sources.empty(); }
};

// Parses `flags` (whitespace-separated --name[=value], quotes kept whole) and, when
// `read_environment`, the environment's LIBTPU_INIT_ARGS and XLA_FLAGS, read before `flags` (a
// switch the two set both ways takes the value of `flags`). `user_overrides` (key=value) win
// over a flag. UserError naming a token that is not a --flag.
XlaFlagReport xla_flag_overrides(const std::string& flags,
                                 const std::vector<std::string>& user_overrides,
                                 bool read_environment = true);

// "tpusim: XLA flags (LIBTPU_INIT_ARGS): modeled ... ; not modeled: ..." lines on `out`.
void report_xla_flags(const XlaFlagReport& report, std::ostream& out);

nlohmann::json xla_flags_json(const XlaFlagReport& report);

}  // namespace tpusim
