// `tpusim plan [config.yml ...] model_name=... --tokens 2e12 [--deadline 30d] [--hardware
//              v5p,v6e,tpu7x,a3] [--max-chips N] [--max-slices S] [--prices prices.yml]
//              [--consumption on_demand|spot|committed] [--objective time|chip_hours|cost]
//              [--global-batch-tokens 1M-16M] [--full-front] [--json|--csv] [--html FILE]`:
// which hardware, how many chips, which configuration, and what a token budget costs
// (sim/plan/planner.h). MaxText keys on the command line are pinned as in explore.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/suffixed_count.h"
#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/command_json.h"
#include "sim/cli/commands.h"
#include "sim/plan/global_batch.h"
#include "sim/plan/plan_html.h"
#include "sim/plan/plan_output.h"
#include "sim/plan/planner.h"
#include "sim/plan/prices.h"

namespace tpusim {
namespace {

// How the plan is shown, besides its options (sim/cli/command_json.h).
struct PlanFlags {
  PlanCommandRequest request;
  bool progress = false;
  bool json = false;
  bool csv = false;
  std::string html;
};

// A number with an optional K, M, G, T (powers of 1000) suffix: "2e12", "1.5T".
double parse_count(const std::string& text, const std::string& option) {
  const std::optional<double> value = parse_suffixed_count(text, "KMGT");
  if (!value) {
    throw UserError(option + ": '" + text + "' is not a number (e.g. 2e12, 1.5T)");
  }
  if (*value <= 0) {
    throw UserError(option + ": " + text + " must be positive");
  }
  return *value;
}

// "60d", "12h", "8w", or days alone ("60"); UserError naming the value.
double parse_deadline_days(const std::string& text) {
  const std::map<char, double> days_per_unit = {{'d', 1}, {'h', 1.0 / 24}, {'w', 7}};
  double scale = 1;
  std::string number = text;
  if (!text.empty() && std::isalpha(static_cast<unsigned char>(text.back())) != 0) {
    const auto unit = days_per_unit.find(static_cast<char>(std::tolower(text.back())));
    if (unit == days_per_unit.end()) {
      throw UserError("--deadline: '" + text + "': the unit must be d (days), h (hours) or w");
    }
    scale = unit->second;
    number = text.substr(0, text.size() - 1);
  }
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != number.size() || !std::isfinite(value) || value <= 0) {
    throw UserError("--deadline: '" + text + "' is not a positive duration (e.g. 30d, 12h, 8w)");
  }
  return value * scale;
}

PlanRequest plan_request(const PlanCommandRequest& flags) {
  PlanRequest request;
  if (flags.tokens.empty()) {
    throw UserError("--tokens: the token budget is required (e.g. --tokens 2e12)");
  }
  request.tokens = parse_count(flags.tokens, "--tokens");
  if (!flags.deadline.empty()) {
    request.deadline_days = parse_deadline_days(flags.deadline);
  }
  request.kinds = parse_hardware_kinds(flags.hardware);
  request.max_chips = flags.max_chips;
  request.max_slices = flags.max_slices;
  request.consumption = consumption_option(flags.consumption, flags.prices);
  if (!flags.prices.empty()) {
    request.prices = PriceTable::read(flags.prices);
  }
  request.objective = parse_plan_objective(
      flags.objective.empty() ? (request.prices ? "cost" : "chip_hours") : flags.objective);
  if (!flags.global_batch_tokens.empty()) {
    request.global_batch = parse_global_batch_range(flags.global_batch_tokens);
  }
  request.full_front = flags.full_front;
  if (flags.threads < 0) {
    throw UserError("--threads: " + std::to_string(flags.threads) + " must be 0 (all) or more");
  }
  request.threads = flags.threads;
  request.max_per_device_batch = flags.max_per_device_batch;
  request.min_hbm_headroom = flags.min_hbm_headroom;
  return request;
}

void run_plan(const PlanFlags& flags) {
  if (static_cast<int>(flags.json) + static_cast<int>(flags.csv) > 1) {
    throw UserError("plan: --json and --csv exclude each other");
  }
  PlanRequest request = plan_request(flags.request);
  const Config config = load_command_config(flags.request.args, flags.request.xla_flags);
  if (flags.progress || isatty(fileno(stderr)) != 0) {
    const auto started = std::chrono::steady_clock::now();
    request.progress = [started](const SliceCandidate& slice, size_t index, size_t count) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::cerr << "plan: " << std::fixed << std::setprecision(0) << elapsed << " s, searching "
                << slice.label() << " (" << index + 1 << " of " << count << " slices)\n";
    };
  }
  const PlanResult result = plan(config, request);
  if (!flags.html.empty()) {
    std::string command_line = "tpusim plan";
    for (const std::string& arg : flags.request.args) {
      command_line += " " + arg;
    }
    write_file_atomically(flags.html, plan_html(result, command_line));
  }
  if (flags.json) {
    std::cout << plan_json(result).dump(2) << "\n";
  } else if (flags.csv) {
    print_plan_csv(result, std::cout);
  } else {
    print_plan_text(result, std::cout);
  }
}

}  // namespace

nlohmann::json plan_command_json(const PlanCommandRequest& request, std::ostream& notes) {
  const PlanRequest plan_request_value = plan_request(request);
  const Config config =
      load_command_config(request.args, request.xla_flags, nullptr, nullptr, notes);
  return plan_json(plan(config, plan_request_value));
}

void register_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* command = app.add_subcommand(
      "plan",
      "From a model and a token budget to the hardware, slice, configuration, days and "
      "chip-hours (or cost): the explorer's best on each slice, slices that cannot win skipped "
      "by a proven bound, and the Pareto front");
  command->add_option("args", flags->request.args,
                      "[config.yml ...] key=value ... (model_name=...; given keys are pinned)");
  command->add_option("--tokens", flags->request.tokens, "Token budget to train, e.g. 2e12 or 2T")
      ->required();
  command->add_option("--deadline", flags->request.deadline, "Finish within, e.g. 30d, 720h, 8w");
  command->add_option("--hardware", flags->request.hardware,
                      std::string("Hardware kinds, comma-separated (default ") +
                          PlanCommandRequest().hardware + "; GPU nodes: a3, a3mega, ...)");
  command->add_option("--max-chips", flags->request.max_chips,
                      "Most chips (GPUs) in all (default 16384)");
  command->add_option("--max-slices", flags->request.max_slices,
                      "Most slices over DCN (GPU nodes) (default 64)");
  command->add_option("--prices", flags->request.prices,
                      "YAML of prices per chip-hour (TPU) or node-hour (GPU) by hardware kind "
                      "(configs/prices.example.yml; tpusim has none built in)");
  command->add_option("--consumption", flags->request.consumption,
                      "Which --prices column: on_demand (default), spot, committed");
  command->add_option("--objective", flags->request.objective,
                      "time, chip_hours or cost (default: cost with --prices, else chip_hours)");
  command->add_option("--global-batch-tokens", flags->request.global_batch_tokens,
                      "Global batch range in tokens, e.g. 2M-8M (default: the model's published "
                      "runs, else 1M-16M)");
  command->add_flag("--full-front", flags->request.full_front,
                    "Search every slice not proven off the Pareto front (exact front, slower) "
                    "instead of only those that can beat the best on the objective");
  command->add_flag("--json", flags->json, "Print one JSON object");
  command->add_flag("--progress", flags->progress,
                    "Name each slice on stderr as it is searched even when stderr is not a "
                    "terminal");
  command->add_flag("--csv", flags->csv, "Print the Pareto front as CSV");
  command->add_option("--html", flags->html,
                      "Write a self-contained HTML page: the front plotted, each point's "
                      "configuration and reproduce commands");
  command->add_option("--threads", flags->request.threads, "Worker threads (default: all cores)");
  command->add_option("--max-per-device-batch", flags->request.max_per_device_batch,
                      "Largest per_device_batch_size tried (default 16)");
  command->add_option("--min-hbm-headroom", flags->request.min_hbm_headroom,
                      "Fraction of usable HBM to leave free, e.g. 0.1");
  command->add_option(
      "--xla-flags", flags->request.xla_flags,
      "XLA/libtpu flags of the recipe (also read from LIBTPU_INIT_ARGS, XLA_FLAGS)");
  command->callback([flags] { run_plan(*flags); });
}

}  // namespace tpusim
