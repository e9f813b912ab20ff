// `tpusim estimate [config.yml ...] [key=value ...] [--json] [--trace FILE] [--require-fit]`:
// step time, MFU, TFLOP/s and tokens/s per chip, the step breakdown, and peak HBM per device with
// a fits/OOM verdict. A run that does not fit says so on the first line (the step time of a run
// that would not start is no answer); under --require-fit it then exits 3 (2 stays bad input).
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/mechanisms.h"
#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/command_json.h"
#include "sim/cli/commands.h"
#include "sim/estimate/estimate.h"
#include "sim/estimate/step_html.h"

namespace tpusim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << bytes / kGiB << " GiB";
  return out.str();
}

// The verdict on a run that does not fit, before any number (and --require-fit's message).
std::string out_of_memory_verdict(const nlohmann::json& json) {
  return "OUT OF MEMORY: peak HBM per device " +
         gib(json["hbm_peak_bytes_per_device"].get<double>()) + " of " +
         gib(json["hbm_capacity_bytes"].get<double>()) + " usable (peak at " +
         json["memory"]["peak_at"].get<std::string>() + ")";
}

void print_human(const nlohmann::json& json) {
  if (!json["fits"].get<bool>()) {
    std::cout << out_of_memory_verdict(json)
              << "; the figures below are for a step that would "
                 "not start\n";
  }
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "model      " << json["model_name"].get<std::string>() << " on "
            << json["slice"].get<std::string>() << " (" << json["chips"] << " chips, "
            << json["devices"] << " devices), mesh " << json["mesh"].get<std::string>() << "\n";
  for (const auto& [axis, where] : json["mesh_placement"].items()) {
    // Names up to 8 letters line up in one column; longer ones (fsdp_transpose) keep a space.
    std::cout << "  " << std::left << std::setw(8) << axis << std::right << ' '
              << where.get<std::string>() << "\n";
  }
  std::cout << "batch      " << json["global_batch_sequences"].get<int64_t>() << " sequences, "
            << std::llround(json["tokens_per_step"].get<double>()) << " tokens per step\n";
  if (json.contains("pipeline")) {
    std::cout << "pipeline   " << json["pipeline"]["schedule"].get<std::string>() << "\n";
  }
  std::cout << "step time  " << std::setprecision(3) << json["step_time_s"].get<double>() << " s\n";
  std::cout << std::setprecision(1);
  std::cout << "MFU        " << 100 * json["mfu"].get<double>() << "% of "
            << json["mfu_peak_tflops_per_device"].get<double>()
            << " TFLOP/s/device (bf16 peak, MaxText's FLOP convention); hardware FLOP "
               "utilization "
            << 100 * json["hardware_flop_utilization"].get<double>() << "%";
  if (const double peak = json["hardware_peak_tflops_per_device"].get<double>();
      std::abs(peak - json["mfu_peak_tflops_per_device"].get<double>()) > 1e-9 * peak) {
    std::cout << " of " << peak << " (the catalog's peak)";
  }
  std::cout << "\n";
  std::cout << "TFLOP/s    " << json["tflops_per_chip"].get<double>() << " per chip, "
            << json["tflops_per_device"].get<double>() << " per device\n";
  std::cout << "tokens/s   " << json["tokens_per_s_per_chip"].get<double>() << " per chip, "
            << json["tokens_per_s"].get<double>() << " total\n";
  std::cout << std::setprecision(2);
  std::cout << "TFLOP/device/step  model " << json["model_tflop_per_device_step"].get<double>()
            << ", hardware (with remat"
            << (json["uncounted_tflop_per_device_step"].get<double>() > 0 ? " and one-hot embedding"
                                                                          : "")
            << ") " << json["hardware_tflop_per_device_step"].get<double>() << ", executed "
            << json["executed_tflop_per_device_step"].get<double>()
            << " (hardware FLOP utilization's count: attention as its kernels run it)\n";
  std::cout << "breakdown (s per step)\n";
  for (const auto& [key, value] : json["breakdown"].items()) {
    std::cout << "  " << std::left << std::setw(36) << key << std::right << std::setprecision(4)
              << value.get<double>() << "\n";
  }
  const auto& memory = json["memory"];
  std::cout << std::setprecision(2) << "HBM/device peak "
            << gib(json["hbm_peak_bytes_per_device"].get<double>()) << " of "
            << gib(json["hbm_capacity_bytes"].get<double>()) << " -> "
            << (json["fits"].get<bool>() ? "fits" : "OUT OF MEMORY") << " (peak at "
            << memory["peak_at"].get<std::string>() << ")\n";
  for (const char* key :
       {"weights_bytes", "optimizer_state_bytes", "gradients_bytes", "saved_activations_bytes",
        "gathered_weights_bytes", "temporaries_bytes", "host_offloaded_bytes"}) {
    std::string label = key;
    label = label.substr(0, label.size() - 6);
    std::cout << "  " << std::left << std::setw(20) << label << std::right
              << gib(memory[key].get<double>()) << "\n";
  }
  for (const auto& note : json["padding"]) {
    std::cout << "padding    " << note["tensor"].get<std::string>() << " "
              << note["dim"].get<std::string>() << ": " << note["size"] << " over "
              << note["shards"] << " shards -> " << note["padded_to"] << "\n";
  }
}

// --trace and --html naming one file wrote the page over the trace; a negative --profile listed
// nothing, silently.
void check_output_options(const std::string& trace_path, const std::string& html_path,
                          int profile) {
  if (!trace_path.empty() && !html_path.empty() && same_output_path(trace_path, html_path)) {
    throw UserError("--trace and --html both name '" + html_path + "': give each its own file");
  }
  if (profile < 0) {
    throw UserError("--profile: " + std::to_string(profile) +
                    " is negative (the number of costliest ops to list)");
  }
}

// The `count` costliest compute ops, as --profile lists them.
void print_profile(const std::vector<OpProfile>& ops, int count) {
  std::cout << "top ops (seconds per step, calls, bound)\n";
  for (size_t index = 0; index < ops.size() && static_cast<int>(index) < count; ++index) {
    // Calls per step are whole in a program without fractional repeats; %g keeps the
    // exceptions readable (a layer count divided by a scan group) without trailing zeros.
    std::ostringstream calls;
    calls << "x" << std::defaultfloat << std::setprecision(6) << ops[index].calls;
    std::cout << "  " << std::fixed << std::setw(9) << std::setprecision(4) << ops[index].seconds
              << "  " << std::left << std::setw(7) << calls.str() << std::setw(5)
              << ops[index].bound << std::right << " " << ops[index].region << ": " << ops[index].op
              << "\n";
  }
}

// The same ops for --json: [{"region", "op", "bound", "seconds", "calls"}, ...].
nlohmann::json profile_json(const std::vector<OpProfile>& ops, int count) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t index = 0; index < ops.size() && static_cast<int>(index) < count; ++index) {
    list.push_back({{"region", ops[index].region},
                    {"op", ops[index].op},
                    {"bound", ops[index].bound},
                    {"seconds", ops[index].seconds},
                    {"calls", ops[index].calls}});
  }
  return list;
}

}  // namespace

EstimateRun run_estimate(const EstimateRequest& request, std::ostream& notes) {
  const MechanismSet mechanisms = MechanismSet::without(request.without);
  XlaFlagReport xla_report;
  const Config config =
      load_command_config(request.args, request.xla_flags, &xla_report, nullptr, notes);
  EstimateRun run{estimate_config(config, mechanisms), nlohmann::json()};
  run.json = run.estimate.json;
  run.json.update(passthrough_keys_json(config));
  run.json["xla_flags"] = xla_flags_json(xla_report);
  if (!request.without.empty()) {
    run.json["mechanisms_off"] = mechanisms.disabled_names();
  }
  return run;
}

void register_estimate_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto json_output = std::make_shared<bool>(false);
  auto trace_path = std::make_shared<std::string>();
  auto html_path = std::make_shared<std::string>();
  auto profile = std::make_shared<int>(0);
  auto xla_flags = std::make_shared<std::string>();
  auto without = std::make_shared<std::vector<std::string>>();
  auto require_fit = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "estimate",
      "Estimate one training step of a MaxText config on a slice: step time, MFU, "
      "tokens/s, breakdown, HBM");
  command->add_option("args", *args, "[config.yml ...] key=value ...");
  command->add_flag("--json", *json_output, "Print one JSON object");
  command->add_option("--trace", *trace_path, "Write a Chrome trace-event JSON (Perfetto)");
  command->add_option(
      "--html", *html_path,
      "Write a self-contained HTML page: summary, breakdown, HBM, timeline by lane");
  command->add_flag("--require-fit", *require_fit,
                    "Exit 3 (after the report) when peak HBM per device exceeds the usable HBM");
  command->add_option(
      "--profile", *profile,
      "Also list the N compute ops that take the most time (--json: as \"profile\")");
  command->add_option(
      "--xla-flags", *xla_flags,
      "XLA/libtpu flags of the recipe (also read from LIBTPU_INIT_ARGS, XLA_FLAGS)");
  add_without_option(*command, *without);
  command->callback(
      [args, json_output, trace_path, html_path, profile, xla_flags, without, require_fit] {
        check_output_options(*trace_path, *html_path, *profile);
        const EstimateRun run = run_estimate({*args, *xla_flags, *without}, std::cerr);
        const Estimate& estimate = run.estimate;
        if (!trace_path->empty()) {
          write_file_atomically(*trace_path, chrome_trace(estimate));
        }
        if (!html_path->empty()) {
          std::string command_line = "tpusim estimate";
          for (const std::string& arg : *args) {
            command_line += " " + arg;
          }
          write_file_atomically(*html_path, step_html(estimate, command_line));
        }
        if (*json_output) {
          nlohmann::json json = run.json;
          if (*profile > 0) {  // --profile with --json was dropped without a word
            json["profile"] = profile_json(estimate.timing.profile, *profile);
          }
          std::cout << json.dump(2) << "\n";
        } else {
          print_human(estimate.json);
          if (*profile > 0) {
            print_profile(estimate.timing.profile, *profile);
          }
        }
        if (*require_fit && !estimate.memory.fits) {
          throw VerifyFailure("--require-fit: " + out_of_memory_verdict(estimate.json));
        }
      });
}

}  // namespace tpusim
