// sim/cli/command_json.h: what `estimate`, `explore`, `plan` and `validate` print under --json, as
// functions (`topology` and `hw`: sim/cli/hardware_json.h). The CLI prints their result; the
// Python module (python/) converts the same JSON to Python objects, so both answer from one code
// path.
//
// Each function throws what the command does on bad input (UserError naming the key, or
// YAML::Exception for a malformed value); `notes` receives the lines the CLI writes on stderr
// before its result (MaxText keys with no effect, keys not modeled, the XLA flags read).
//
// Example:
//   EstimateRequest request;
//   request.args = {"model_name=llama3.1-8b", "compile_topology=v5p-8"};
//   nlohmann::json json = run_estimate(request, std::cerr).json;  // json["step_time_s"]
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/estimate/estimate.h"
#include "sim/explore/explorer.h"

namespace tpusim {

// `tpusim estimate ARGS [--xla-flags F] [--without M,...]`.
struct EstimateRequest {
  std::vector<std::string> args;     // [config.yml ...] key=value ...
  std::string xla_flags;             // the recipe's XLA/libtpu flags (then the environment's)
  std::vector<std::string> without;  // cost mechanisms switched off
};

struct EstimateRun {
  Estimate estimate;
  nlohmann::json json;  // what `estimate --json` prints
};

EstimateRun run_estimate(const EstimateRequest& request, std::ostream& notes);

// `tpusim explore ARGS [options]`: the options of the search, as the command line gives them.
struct ExploreRequest {
  std::vector<std::string> args;  // [config.yml ...] key=value ... (given keys are pinned)
  std::string xla_flags;
  std::string objective = "tokens_per_s_per_chip";
  int top = 10;
  int64_t global_batch_size = 0;
  double max_per_device_batch = 16;
  double min_hbm_headroom = 0;
  int threads = 0;  // 0 = all cores
  bool branch_and_bound = true;
  bool exact_schedules = false;
  size_t max_samples = 0;  // evaluated candidates kept for the HTML scatter
  std::string prices;      // --prices FILE (sim/plan/prices.h), for tokens_per_dollar
  std::string consumption = "on_demand";
};

// The search's options; UserError on a bad objective or thread count. With `config`, the price of
// its slice's chip-hour from request.prices (UserError when tokens_per_dollar has none).
ExploreOptions explore_options(const ExploreRequest& request, const Config* config = nullptr);

// The search in this process (no progress bar): what `explore --json` prints.
nlohmann::json explore_json(const ExploreRequest& request, std::ostream& notes);

// `tpusim plan ARGS [options]` (sim/plan/planner.h): its options as the command line gives them.
struct PlanCommandRequest {
  std::vector<std::string> args;  // [config.yml ...] key=value ... (model_name=...)
  std::string xla_flags;
  std::string tokens;    // "2e12", "2T"
  std::string deadline;  // "30d", "720h", "8w"; empty: none
  std::string hardware = "v5e,v5p,v6e,tpu7x";
  int64_t max_chips = 16384;
  int max_slices = 64;
  std::string prices;  // YAML file; empty: no costs
  std::string consumption = "on_demand";
  std::string objective;            // empty: cost with prices, else chip_hours
  std::string global_batch_tokens;  // empty: the model's published range, else 1M-16M
  bool full_front = false;
  int threads = 0;
  double max_per_device_batch = 16;
  double min_hbm_headroom = 0;
};

// The plan in this process: what `plan --json` prints.
nlohmann::json plan_command_json(const PlanCommandRequest& request, std::ostream& notes);

// `tpusim validate FILE` (or `--pairs PAIRS`, when `pairs_path` is set) with `without` switched
// off: what `validate --json` prints.
nlohmann::json validate_json(const std::string& path, const std::string& pairs_path,
                             const std::vector<std::string>& without);

}  // namespace tpusim
