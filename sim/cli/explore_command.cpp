// `tpusim explore [config.yml ...] [key=value ...] [--top N] [--json|--csv] [--objective O]
//                 [--global-batch-size N] [--max-per-device-batch B] [--min-hbm-headroom F]
//                 [--threads T] [--exact-schedules]`: searches meshes, batch, remat, attention and
// perf switches for a model on a slice and ranks what fits (sim/explore/explorer.h). Keys given on
// the command line are pinned (not searched).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "model/config.h"
#include "sharding/step_program.h"
#include "sim/cli/command_args.h"
#include "sim/cli/command_json.h"
#include "sim/cli/commands.h"
#include "sim/explore/explore_html.h"
#include "sim/explore/explorer.h"
#include "sim/plan/prices.h"
#ifdef TPUSIM_WITH_MPI
#include "sim/cli/mpi_run.h"
#include "sim/transport/mpi_transport.h"
#endif

namespace tpusim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The search's options (sim/cli/command_json.h) and how the result is shown.
struct ExploreFlags {
  ExploreRequest request;
  bool json = false;
  bool csv = false;
  bool no_branch_and_bound = false;
  bool progress = false;
  std::string html;
};

// Samples of the evaluated candidates kept for the HTML scatter.
constexpr size_t kHtmlSamples = 20000;

// explore --html: the page of the search (sim/explore/explore_html.h).
void write_html(const ExploreResult& result, const ExploreFlags& flags) {
  if (flags.html.empty()) {
    return;
  }
  std::string command_line = "tpusim explore";
  for (const std::string& arg : flags.request.args) {
    command_line += " " + arg;
  }
  write_file_atomically(flags.html, explore_html(result, command_line));
}

// A progress bar with rate and ETA on stderr, only when it is a terminal.
void show_progress(int64_t done, int64_t total, std::chrono::steady_clock::time_point started) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  std::cerr << "\r[" << std::string(static_cast<size_t>(filled), '#')
            << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << done << "/"
            << total << " meshes, " << std::fixed << std::setprecision(0) << rate
            << " meshes/s, ETA " << std::setprecision(1) << eta << " s   " << std::flush;
  if (done == total) {
    std::cerr << "\n";
  }
}

void print_csv(const ExploreResult& result) {
  std::cout << "rank,step_time_s,mfu,tokens_per_s_per_chip,hbm_peak_bytes_per_device,"
               "hbm_headroom_bytes,fits,mesh,args,libtpu_init_args\n";
  int rank = 1;
  for (const RankedCandidate& ranked : result.top) {
    std::cout << rank++ << "," << ranked.step_time_s << "," << ranked.mfu << ","
              << ranked.tokens_per_s_per_chip << "," << ranked.hbm_peak_bytes_per_device << ","
              << ranked.hbm_capacity_bytes - ranked.hbm_peak_bytes_per_device << ","
              << (ranked.fits ? "true" : "false") << ","
              << ranked.estimate["mesh"].get<std::string>() << ",\"" << ranked.args << "\",\""
              << ranked.libtpu_init_args << "\"\n";
  }
}

void print_human(const ExploreResult& result) {
  const SearchSpace& space = result.space;
  std::cout << "searched  " << result.candidates_in_space << " candidates (" << space.meshes.size()
            << " meshes x " << space.batches.size() << " batches x " << space.remats.size()
            << " remat x " << space.placements.size()
            << " placements x attention/perf variants) in " << std::fixed << std::setprecision(2)
            << result.elapsed_s << " s on " << result.threads << " threads\n";
  std::cout << "evaluated " << result.candidates_evaluated << " (" << result.programs_built
            << " programs built)";
  for (const auto& [reason, count] : result.pruned) {
    std::cout << ", " << reason << " " << count;
  }
  std::cout << "\n";
  if (result.top.empty()) {
    std::cout << "nothing fits: the smallest peak HBM found is " << std::setprecision(2)
              << result.smallest_peak_hbm_bytes / kGiB << " GiB per device against "
              << result.usable_hbm_bytes / kGiB
              << " GiB usable (add devices, shard weights more, or pin a smaller batch)\n";
    return;
  }
  if (result.pipeline_options.size() > 1) {
    // PP over DCN against DP/FSDP there: the best of each schedule and what it loses to.
    std::cout << "pipeline schedules (best of each):\n";
    for (const PipelineOption& option : result.pipeline_options) {
      std::cout << "  " << std::left << std::setw(72) << option.schedule << std::right;
      if (option.bounded_out) {
        std::cout << " cannot reach the top " << result.top.size() << "\n";
        continue;
      }
      if (!option.found) {
        std::cout << " nothing fits\n";
        continue;
      }
      std::cout << " step " << std::setprecision(3) << option.step_time_s << " s";
      if (option.stages > 1) {
        std::cout << " (bubble " << option.bubble_s << " s, stage transfers "
                  << option.stage_transfers_s << " s)";
      } else {
        std::cout << " (cross-slice gradient reduction " << option.gradient_reduction_s << " s)";
      }
      std::cout << "\n";
    }
    if (std::any_of(result.pipeline_options.begin(), result.pipeline_options.end(),
                    [](const PipelineOption& option) { return option.bounded_out; })) {
      std::cout << "  (--exact-schedules finds the best of the schedules that cannot reach the "
                   "top as well)\n";
    }
  }
  int rank = 1;
  for (const RankedCandidate& ranked : result.top) {
    std::cout << "\n#" << rank++ << "  step " << std::setprecision(3) << ranked.step_time_s
              << " s, MFU " << std::setprecision(1) << 100 * ranked.mfu << "%, "
              << std::setprecision(0) << ranked.tokens_per_s_per_chip << " tokens/s/chip, HBM "
              << std::setprecision(2) << ranked.hbm_peak_bytes_per_device / kGiB << " of "
              << ranked.hbm_capacity_bytes / kGiB << " GiB (" << std::setprecision(1)
              << 100 * ranked.hbm_used_fraction() << "%"
              << (ranked.hbm_used_fraction() > kTightHbmFraction
                      ? ", above " + std::to_string(static_cast<int>(100 * kTightHbmFraction)) +
                            "%: little margin; --min-hbm-headroom 0.05 keeps 5% free)"
                      : std::string(")"))
              << "\n";
    if (result.objective == ExploreObjective::kTokensPerDollar) {
      std::cout << "    " << std::setprecision(0) << ranked.objective
                << " tokens per unit of currency (--prices)\n";
    }
    if (const int same = result.same_score_as(static_cast<size_t>(rank - 2)); same > 0) {
      std::cout << "    same step time as #" << same << ", another program\n";
    }
    std::cout << "    mesh " << ranked.estimate["mesh"].get<std::string>() << "\n";
    std::cout << "    placement";
    for (const auto& [axis, where] : ranked.estimate["mesh_placement"].items()) {
      std::cout << " " << axis << ": " << where.get<std::string>() << ";";
    }
    std::cout << "\n";
    std::cout << "    breakdown";
    for (const auto& [key, value] : ranked.estimate["breakdown"].items()) {
      if (value.get<double>() > 0.005 * ranked.step_time_s) {
        std::cout << " " << key << " " << std::setprecision(3) << value.get<double>();
      }
    }
    std::cout << "\n    tpusim estimate " << ranked.args << "\n";
    for (const std::string& spelling : ranked.same_program) {
      std::cout << "    same program as: " << spelling << "\n";
    }
    // tpusim's compiler switches reach a real run through libtpu flags, not MaxText keys.
    std::cout << "    MaxText: ";
    if (!ranked.libtpu_init_args.empty()) {
      std::cout << "LIBTPU_INIT_ARGS=\"" << ranked.libtpu_init_args << "\" ";
    }
    std::cout << "python3 -m MaxText.train MaxText/configs/base.yml";
    for (const std::string& item : ranked.maxtext_overrides) {
      std::cout << " " << item;
    }
    std::cout << "\n";
  }
}

void print_result(const ExploreResult& result, const ExploreFlags& flags) {
  if (flags.json) {
    std::cout << result.to_json().dump(2) << "\n";
  } else if (flags.csv) {
    print_csv(result);
  } else {
    print_human(result);
  }
}

}  // namespace

ExploreOptions explore_options(const ExploreRequest& request, const Config* config) {
  ExploreOptions options;
  options.limits.global_batch_size = request.global_batch_size;
  options.limits.max_per_device_batch = request.max_per_device_batch;
  options.limits.min_hbm_headroom = request.min_hbm_headroom;
  options.objective = parse_objective(request.objective);
  options.top = request.top;
  options.threads = request.threads;
  options.branch_and_bound = request.branch_and_bound;
  options.exact_schedules = request.exact_schedules;
  options.max_samples = request.max_samples;
  if (request.threads < 0) {
    throw UserError("--threads: " + std::to_string(request.threads) + " must be 0 (all) or more");
  }
  const Consumption consumption = consumption_option(request.consumption, request.prices);
  if (!request.prices.empty() && config != nullptr) {
    // The user's prices (sim/plan/prices.h): one chip-hour of this slice's hardware.
    const Slice slice = slice_from_config(*config);
    const std::optional<double> price =
        PriceTable::read(request.prices).per_chip_hour(slice, consumption);
    if (!price && options.objective == ExploreObjective::kTokensPerDollar) {
      throw UserError("--prices: " + request.prices + " has no " + consumption_name(consumption) +
                      " price for " + slice.chip->name + " (" + slice.name + ")");
    }
    options.price_per_chip_hour = price.value_or(0);
  }
  return options;
}

nlohmann::json explore_json(const ExploreRequest& request, std::ostream& notes) {
  const Config config =
      load_command_config(request.args, request.xla_flags, nullptr, nullptr, notes);
  return explore(config, explore_options(request, &config)).to_json();
}

void register_explore_command(CLI::App& app) {
  auto flags = std::make_shared<ExploreFlags>();
  CLI::App* command = app.add_subcommand(
      "explore",
      "Search meshes, batch, remat, attention and perf switches for a model on a slice; rank "
      "what fits");
  command->add_option("args", flags->request.args,
                      "[config.yml ...] key=value ... (given keys are pinned)");
  command->add_option("--top", flags->request.top, "How many candidates to list (default 10)");
  command->add_flag("--json", flags->json, "Print one JSON object");
  command->add_option(
      "--xla-flags", flags->request.xla_flags,
      "XLA/libtpu flags of the recipe (also read from LIBTPU_INIT_ARGS, XLA_FLAGS)");
  command->add_flag("--csv", flags->csv, "Print the top candidates as CSV");
  command->add_option("--objective", flags->request.objective,
                      "tokens_per_s_per_chip (default), mfu, step_time, tokens_per_dollar (needs "
                      "--prices)");
  command->add_option("--prices", flags->request.prices,
                      "YAML of prices per chip-hour by hardware kind (configs/prices.example.yml)");
  command->add_option("--consumption", flags->request.consumption,
                      "Which --prices column: on_demand (default), spot, committed");
  command->add_option("--global-batch-size", flags->request.global_batch_size,
                      "Fixed sequences per optimizer step (searches gradient accumulation)");
  command->add_option("--max-per-device-batch", flags->request.max_per_device_batch,
                      "Largest per_device_batch_size tried (default 16)");
  command->add_option("--min-hbm-headroom", flags->request.min_hbm_headroom,
                      "Fraction of usable HBM to leave free, e.g. 0.1");
  command->add_option("--threads", flags->request.threads, "Worker threads (default: all cores)");
  command->add_flag("--no-branch-and-bound", flags->no_branch_and_bound,
                    "Time every candidate that fits instead of skipping those that provably "
                    "cannot enter the top N (same top N, slower; for benchmarks)");
  command->add_flag("--exact-schedules", flags->request.exact_schedules,
                    "Multislice: find each pipeline schedule's own best (each searched from "
                    "nothing), instead of searching later schedules only for what can enter the "
                    "top N; same top N, slower");
  command->add_option("--html", flags->html,
                      "Write a self-contained HTML page: top N, and a scatter of step time "
                      "against HBM of the evaluated candidates with the Pareto front");
  command->add_flag("--progress", flags->progress,
                    "Show the progress bar even when stderr is not a terminal");
  command->callback([flags] {
    if (flags->json && flags->csv) {
      throw UserError("explore: --json and --csv exclude each other");
    }
    const Config config = load_command_config(flags->request.args, flags->request.xla_flags);
    flags->request.branch_and_bound = !flags->no_branch_and_bound;
    flags->request.max_samples = flags->html.empty() ? 0 : kHtmlSamples;
    ExploreOptions options = explore_options(flags->request, &config);
    const auto started = std::chrono::steady_clock::now();
    if (flags->progress || isatty(fileno(stderr)) != 0) {
      options.progress = [started](int64_t done, int64_t total) {
        show_progress(done, total, started);
      };
    }
    ExploreResult result;
#ifdef TPUSIM_WITH_MPI
    if (MpiTransport::launched_by_mpirun()) {
      // Under mpirun the meshes are split over the ranks; rank 0 prints the merged result.
      MpiTransport transport;
      options.processes = &transport;
      run_rank_or_abort(transport, [&] { result = explore(config, options); });
      if (transport.rank() != 0) {
        return;
      }
      write_html(result, *flags);
      print_result(result, *flags);
      return;
    }
#endif
    result = explore(config, options);
    write_html(result, *flags);
    print_result(result, *flags);
  });
}

}  // namespace tpusim
