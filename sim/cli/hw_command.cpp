// `tpusim hw [CHIP] [--json]`: the chip catalog with the source of every number.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw/catalog.h"
#include "hw/slice.h"
#include "sim/cli/commands.h"
#include "sim/cli/hardware_json.h"

namespace tpusim {
namespace {

nlohmann::json chip_json(const ChipSpec& chip) {
  nlohmann::json json;
  json["name"] = chip.name;
  json["display_name"] = chip.display_name;
  json["slice_name_prefixes"] = chip.slice.name_prefixes;
  json["slice_names_count"] =
      chip.slice.name_counts == SliceNameUnit::kTensorCores ? "tensorcores" : "chips";
  json["example_slices"] = example_slice_names(chip);
  nlohmann::json specs;
  for (const std::string& key : chip_spec_keys()) {
    const Provenance& provenance = chip.provenance.at(key);
    nlohmann::json entry;
    entry["value"] = spec_value(chip, key);
    entry[provenance.is_assumption ? "assumption" : "source"] = provenance.text;
    specs[key] = entry;
  }
  json["specs"] = specs;
  if (chip.is_gpu()) {
    const AttentionKernelTable& table = chip.attention_kernel;
    json["fabric"] = chip.slice.fabric;
    json["attention_kernel"] = {
        {"kernel", table.kernel},
        {"source", table.source},
        {"seq_lengths", table.seq_lengths},
        {"forward_tflops", table.forward_tflops},
        {"forward_causal_tflops", table.forward_causal_tflops},
        {"backward_tflops", table.backward_tflops},
        {"rate_scale",
         {{"value", table.rate_scale},
          {table.rate_scale_is_assumption ? "assumption" : "source", table.rate_scale_note}}}};
  }
  return json;
}

// A GPU entry's fabric and fused-attention kernel table, each with its source.
void print_gpu_tables(const ChipSpec& chip) {
  const AttentionKernelTable& table = chip.attention_kernel;
  std::cout << "  fabric: " << chip.slice.fabric << "\n";
  std::cout << "  attention kernel: " << table.kernel << "\n    source: " << table.source << "\n";
  auto row = [](const char* label, const std::vector<double>& values) {
    std::cout << "    " << std::left << std::setw(24) << label << std::right;
    for (const double value : values) {
      std::cout << std::setw(7) << value;
    }
    std::cout << "\n";
  };
  row("seq_lengths", table.seq_lengths);
  row("forward TFLOP/s", table.forward_tflops);
  row("forward causal TFLOP/s", table.forward_causal_tflops);
  row("backward TFLOP/s", table.backward_tflops);
  std::cout << "    rate_scale " << table.rate_scale << "  "
            << (table.rate_scale_is_assumption ? "assumption: " : "") << table.rate_scale_note
            << "\n";
}

}  // namespace

nlohmann::json hw_json(const std::string& chip_name) {
  const HardwareCatalog& catalog = HardwareCatalog::builtin();
  if (!chip_name.empty()) {
    return chip_json(catalog.chip(chip_name));
  }
  nlohmann::json list = nlohmann::json::array();
  for (const ChipSpec& chip : catalog.chips()) {
    list.push_back(chip_json(chip));
  }
  return list;
}

void register_hw_command(CLI::App& app) {
  auto chip_name = std::make_shared<std::string>();
  auto json_output = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand("hw", "List the chip catalog (configs/hw/*.yml)");
  command->add_option("chip", *chip_name, "Show one chip with every number's source, e.g. v5p");
  command->add_flag("--json", *json_output, "Print JSON");
  command->callback([chip_name, json_output] {
    if (*json_output) {
      std::cout << hw_json(*chip_name).dump(2) << "\n";
      return;
    }
    const HardwareCatalog& catalog = HardwareCatalog::builtin();
    std::vector<const ChipSpec*> chips;
    if (chip_name->empty()) {
      for (const ChipSpec& chip : catalog.chips()) {
        chips.push_back(&chip);
      }
    } else {
      chips.push_back(&catalog.chip(*chip_name));
    }
    if (chip_name->empty()) {
      // The chip column is as wide as the longest name and a space.
      int chip_width = 5;
      for (const ChipSpec* chip : chips) {
        chip_width = std::max(chip_width, static_cast<int>(chip->name.size()) + 1);
      }
      std::cout << std::left << std::setw(chip_width) << "chip" << std::right << std::setw(10)
                << "bf16 TF/s" << std::setw(9) << "HBM GiB" << std::setw(10) << "HBM GB/s"
                << std::setw(9) << "dev/chip" << std::setw(10) << "link GB/s" << std::setw(7)
                << "links"
                << "  slice names\n";
      for (const ChipSpec* chip : chips) {
        const std::string& prefix = chip->slice.name_prefixes.front();
        std::string names;
        if (chip->is_gpu()) {
          names = prefix + " (a node of " +
                  std::to_string(chip->slice.small_shapes.front().front()) +
                  " GPUs; nodes = compile_topology_num_slices)";
        } else {
          names = prefix + "-N (" +
                  (chip->slice.name_counts == SliceNameUnit::kTensorCores ? "N TensorCores"
                                                                          : "N chips") +
                  ")";
        }
        std::cout << std::left << std::setw(chip_width) << chip->name << std::right << std::setw(10)
                  << chip->peak_bf16_tflops << std::setw(9) << chip->hbm_capacity_gib
                  << std::setw(10) << chip->hbm_bandwidth_gbps << std::setw(9)
                  << chip->devices_per_chip << std::setw(10) << chip->ici_link_bandwidth_uni_gbps
                  << std::setw(7) << chip->ici_links_per_chip << "  " << names << "\n";
      }
      return;
    }
    const ChipSpec& chip = *chips.front();
    std::cout << chip.display_name << " (" << chip.name << ")\n";
    for (const std::string& key : chip_spec_keys()) {
      const Provenance& provenance = chip.provenance.at(key);
      std::cout << "  " << std::left << std::setw(40) << key << std::right << std::setw(10)
                << spec_value(chip, key) << "  " << (provenance.is_assumption ? "assumption: " : "")
                << provenance.text << "\n";
    }
    if (chip.is_gpu()) {
      print_gpu_tables(chip);
    }
  });
}

}  // namespace tpusim
