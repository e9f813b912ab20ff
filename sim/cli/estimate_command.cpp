// `tpusim estimate [base.yml] [key=value ...] [--json]`: what one training step of a MaxText
// config costs on a slice: FLOPs per device (MaxText's convention and what the hardware runs) and
// peak HBM per device with its breakdown and a fits/OOM verdict. (Step time comes with the
// performance engine.)
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "sharding/step_program.h"
#include "sim/accounting/program_flops.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/memory/memory_model.h"

namespace tpusim {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json memory_json(const MemoryBreakdown& memory) {
  return {{"weights_bytes", memory.weights},
          {"optimizer_state_bytes", memory.optimizer_state},
          {"gradients_bytes", memory.gradients},
          {"saved_activations_bytes", memory.saved_activations},
          {"gathered_weights_bytes", memory.gathered_weights},
          {"temporaries_bytes", memory.temporaries}};
}

std::string gib(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << bytes / kGiB << " GiB";
  return out.str();
}

}  // namespace

nlohmann::json estimate_json(const Config& config) {
  const StepProgram built = build_step_program(config);
  const ProgramFlops flops = program_flops(built);
  const MemoryEstimate memory = estimate_memory(built);
  nlohmann::json json;
  json["model_name"] = config.get_string("model_name");
  json["slice"] = built.slice.name;
  json["num_slices"] = built.slice.num_slices;
  json["chip"] = built.slice.chip->name;
  json["devices"] = built.slice.total_devices();
  json["chips"] = built.slice.total_chips();
  json["mesh"] = built.mesh.shape.describe();
  nlohmann::json placement = nlohmann::json::object();
  for (const MeshAxisPlacement& axis : built.mesh.axes) {
    if (axis.ici_size * axis.dcn_size > 1) {
      placement[mesh_axis_names()[static_cast<size_t>(axis.mesh_axis)]] =
          axis.describe(built.slice);
    }
  }
  json["mesh_placement"] = placement;
  json["global_batch_sequences"] = built.global_batch;
  json["tokens_per_step"] = built.global_batch * config.get_int("max_target_length");
  json["model_tflop_per_device_step"] = maxtext_training_flops_per_device(config).total_tflops();
  json["program_model_tflop_per_device_step"] = flops.model_matmul / kTera;
  json["hardware_tflop_per_device_step"] = flops.hardware_matmul / kTera;
  json["recompute_tflop_per_device_step"] = flops.recompute_matmul / kTera;
  json["vector_tflop_per_device_step"] = flops.vector / kTera;
  json["memory"] = memory_json(memory.at_peak);
  json["memory"]["peak_at"] = memory.peak_region;
  json["memory"]["host_offloaded_bytes"] = memory.host_offloaded_bytes;
  json["hbm_peak_bytes_per_device"] = memory.peak_bytes;
  json["hbm_capacity_bytes"] = memory.capacity_bytes;
  json["fits"] = memory.fits;
  nlohmann::json padding = nlohmann::json::array();
  for (const PaddingNote& note : built.program.padding) {
    padding.push_back({{"tensor", note.tensor},
                       {"dim", note.dim},
                       {"size", note.global_size},
                       {"shards", note.shards},
                       {"padded_to", note.padded_size}});
  }
  json["padding"] = padding;
  return json;
}

void register_estimate_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto json_output = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "estimate", "Estimate one training step of a MaxText config on a slice (FLOPs, HBM)");
  command->add_option("args", *args, "[config.yml] key=value ...");
  command->add_flag("--json", *json_output, "Print one JSON object");
  command->callback([args, json_output] {
    const CommandArgs split = split_command_args(*args);
    const Config config = Config::load(split.base_path, split.overrides);
    const nlohmann::json json = estimate_json(config);
    if (*json_output) {
      std::cout << json.dump(2) << "\n";
      return;
    }
    const auto& memory = json["memory"];
    std::cout << "model      " << json["model_name"].get<std::string>() << " on "
              << json["slice"].get<std::string>() << " (" << json["chips"] << " chips, "
              << json["devices"] << " devices), mesh " << json["mesh"].get<std::string>() << "\n";
    for (const auto& [axis, where] : json["mesh_placement"].items()) {
      std::cout << "  " << std::left << std::setw(9) << axis << std::right
                << where.get<std::string>() << "\n";
    }
    std::cout << "batch      " << json["global_batch_sequences"] << " sequences, "
              << json["tokens_per_step"] << " tokens per step\n";
    std::cout << std::fixed << std::setprecision(2);
    std::cout << "TFLOP/device/step  model (MaxText) "
              << json["model_tflop_per_device_step"].get<double>() << ", hardware (with remat) "
              << json["hardware_tflop_per_device_step"].get<double>() << "\n";
    std::cout << "HBM/device  peak " << gib(json["hbm_peak_bytes_per_device"].get<double>())
              << " of " << gib(json["hbm_capacity_bytes"].get<double>()) << " -> "
              << (json["fits"].get<bool>() ? "fits" : "OUT OF MEMORY") << " (peak at "
              << memory["peak_at"].get<std::string>() << ")\n";
    for (const char* key :
         {"weights_bytes", "optimizer_state_bytes", "gradients_bytes", "saved_activations_bytes",
          "gathered_weights_bytes", "temporaries_bytes"}) {
      std::string label = key;
      label = label.substr(0, label.size() - 6);
      std::cout << "  " << std::left << std::setw(20) << label << std::right
                << gib(memory[key].get<double>()) << "\n";
    }
    if (memory["host_offloaded_bytes"].get<double>() > 0) {
      std::cout << "  host offloaded      " << gib(memory["host_offloaded_bytes"].get<double>())
                << " (host memory)\n";
    }
    for (const auto& note : json["padding"]) {
      std::cout << "padding    " << note["tensor"].get<std::string>() << " "
                << note["dim"].get<std::string>() << ": " << note["size"] << " over "
                << note["shards"] << " shards -> " << note["padded_to"] << "\n";
    }
  });
}

}  // namespace tpusim
