// `tpusim validate FILE.csv [--json]`: predicts every row of a results file in the format of
// validation/published.csv (its `args` column is a MaxText-style override string) and
// compares predicted with measured step time and tokens/s per chip.
// `tpusim validate --pairs PAIRS.csv [--json]`: judges predicted changes between two runs against
// measured ones (sim/cli/validate_pairs.h).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/csv.h"
#include "common/error.h"
#include "common/input_files.h"
#include "common/mechanisms.h"
#include "common/yaml_text.h"
#include "hw/catalog.h"
#include "model/config.h"
#include "sim/cli/command_json.h"
#include "sim/cli/commands.h"
#include "sim/cli/table_values.h"
#include "sim/cli/validate_pairs.h"
#include "sim/estimate/estimate.h"

namespace tpusim {
namespace {

// Whether a row's hardware names `chip`: its catalog name or one of its slice-name prefixes
// ("tpu7x" for v7x, "v5litepod" for v5e), perhaps with a suffix ("h100-sxm-80g", "v5e-256").
bool hardware_names_chip(const std::string& hardware, const std::string& chip) {
  std::vector<std::string> names = {chip};
  for (const ChipSpec& spec : HardwareCatalog::builtin().chips()) {
    if (spec.name == chip) {
      names.insert(names.end(), spec.slice.name_prefixes.begin(), spec.slice.name_prefixes.end());
    }
  }
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& name) { return hardware.starts_with(name); });
}

// A row's hardware and chip count describe the run its args give, or the row is refused: a typo
// in either (chips=7 for a v4-128, hardware=v9) was printed as the row's label and validated the
// args' run without a word. The hardware is read by hardware_names_chip.
void check_row_describes_its_args(const std::vector<std::string>& row, size_t hardware_column,
                                  std::optional<size_t> chips_column, const Estimate& estimate,
                                  const std::string& where) {
  const std::string chip = estimate.json.at("chip").get<std::string>();
  if (!hardware_names_chip(row[hardware_column], chip)) {
    throw UserError(where + " hardware: '" + row[hardware_column] + "' but its args run on " +
                    chip);
  }
  if (chips_column && !row[*chips_column].empty()) {
    const double chips = parse_table_number(row[*chips_column], where + " chips");
    const auto run_chips = estimate.json.at("chips").get<int64_t>();
    if (chips != static_cast<double>(run_chips)) {
      throw UserError(where + " chips: '" + row[*chips_column] + "' but its args run on " +
                      std::to_string(run_chips) + " chips");
    }
  }
}

nlohmann::json validate_csv(const std::string& path, const MechanismSet& mechanisms) {
  note_input(path);
  const CsvTable table = parse_csv(read_text_file(path), path);
  const size_t id_column = table.column("id");
  const size_t args_column = table.column("args");
  const size_t step_column = table.column("measured_step_s");
  // Optional: the measured tokens/s per chip, and the hardware (validation/gpu_published.csv
  // names it in a "gpu" column).
  const std::optional<size_t> tokens_column = table.find_column("measured_tokens_s_chip");
  const std::optional<size_t> gpu_column = table.find_column("gpu");
  const size_t hardware_column = gpu_column.has_value() && !table.find_column("hardware")
                                     ? *gpu_column
                                     : table.column("hardware");
  // Optional: the chip count (published.csv "chips", gpu_published.csv "gpus").
  std::optional<size_t> chips_column = table.find_column("chips");
  if (!chips_column) {
    chips_column = table.find_column("gpus");
  }
  if (table.rows.empty()) {  // a median of no errors printed as 0.0%
    throw UserError(path + ": no rows under the header: nothing to validate");
  }
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> errors;
  for (size_t index = 0; index < table.rows.size(); ++index) {
    const auto& row = table.rows[index];
    const std::string where =
        path + " row " + std::to_string(index + 2) + " (" + row[id_column] + ")";
    const double measured = parse_table_number(row[step_column], where + " measured_step_s");
    if (!(measured > 0) || !std::isfinite(measured)) {
      throw UserError(where + " measured_step_s: '" + row[step_column] +
                      "' must be a positive number of seconds");
    }
    if (row[args_column].find_first_not_of(" \t") == std::string::npos) {
      throw UserError(where + " args: empty; give the run's key=value overrides");
    }
    Config config = [&] {
      try {
        return Config::load("", split_words(row[args_column]));
      } catch (const UserError& error) {
        throw UserError(where + ": " + error.what());
      }
    }();
    const Estimate estimate = estimate_config(config, mechanisms);
    check_row_describes_its_args(row, hardware_column, chips_column, estimate, where);
    const double error = (estimate.step_seconds - measured) / measured;
    errors.push_back(std::abs(error));
    nlohmann::json entry = {{"id", row[id_column]},
                            {"hardware", row[hardware_column]},
                            {"predicted_step_s", estimate.step_seconds},
                            {"measured_step_s", measured},
                            {"error", error},
                            {"predicted_tokens_s_chip", estimate.tokens_per_s_per_chip},
                            {"predicted_mfu", estimate.mfu},
                            {"fits", estimate.memory.fits},
                            {"hbm_peak_bytes_per_device", estimate.memory.peak_bytes},
                            {"breakdown", rendered_breakdown(estimate.timing.breakdown)}};
    if (tokens_column.has_value() && !row[*tokens_column].empty()) {
      const double tokens =
          parse_table_number(row[*tokens_column], where + " measured_tokens_s_chip");
      entry["measured_tokens_s_chip"] = tokens;
      entry["tokens_error"] = (estimate.tokens_per_s_per_chip - tokens) / tokens;
    }
    rows.push_back(entry);
  }
  double sum = 0;
  for (const double error : errors) {
    sum += error;
  }
  nlohmann::json summary = {
      {"rows", errors.size()},
      {"median_abs_error", median(errors)},
      {"mean_abs_error", errors.empty() ? 0.0 : sum / static_cast<double>(errors.size())},
      {"max_abs_error", errors.empty() ? 0.0 : *std::max_element(errors.begin(), errors.end())}};
  return {{"rows", rows}, {"summary", summary}};
}

}  // namespace

nlohmann::json validate_json(const std::string& path, const std::string& pairs_path,
                             const std::vector<std::string>& without) {
  if (path.empty() && pairs_path.empty()) {
    throw UserError(
        "validate: give a results CSV (validation/published.csv) or --pairs "
        "PAIRS.csv (validation/pairs.csv)");
  }
  const MechanismSet mechanisms = MechanismSet::without(without);
  nlohmann::json result =
      pairs_path.empty() ? validate_csv(path, mechanisms) : validate_pairs(pairs_path, mechanisms);
  result["mechanisms_off"] = mechanisms.disabled_names();
  return result;
}

namespace {

// Every cost mechanism with its one-line summary (common/mechanisms.h), in the order of the enum:
// what `--without` accepts and what the reports' ablation table lists.
nlohmann::json mechanisms_json() {
  nlohmann::json list = nlohmann::json::array();
  for (size_t index = 0; index < static_cast<size_t>(Mechanism::kCount); ++index) {
    const auto mechanism = static_cast<Mechanism>(index);
    list.push_back(
        {{"name", mechanism_name(mechanism)}, {"summary", mechanism_summary(mechanism)}});
  }
  return list;
}

}  // namespace

void register_validate_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto json_output = std::make_shared<bool>(false);
  auto list_mechanisms = std::make_shared<bool>(false);
  auto without = std::make_shared<std::vector<std::string>>();
  auto pairs_path = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "validate", "Predict every row of a published-results CSV and compare with the measurements");
  CLI::Option* file_option =
      command->add_option("file", *path, "CSV in the format of validation/published.csv");
  CLI::Option* pairs_option = command->add_option(
      "--pairs", *pairs_path,
      "A/B pairs CSV (validation/pairs.csv): judge the predicted change of each pair against the "
      "measured one, in points");
  file_option->excludes(pairs_option);
  command->add_flag("--json", *json_output, "Print JSON");
  CLI::Option* list_option =
      command->add_flag("--list-mechanisms", *list_mechanisms,
                        "List the cost mechanisms --without can switch off, with what each does");
  CLI::Option* without_option = add_without_option(*command, *without);
  list_option->excludes(file_option)->excludes(pairs_option)->excludes(without_option);
  command->callback([path, pairs_path, json_output, without, list_mechanisms] {
    if (*list_mechanisms) {
      const nlohmann::json list = mechanisms_json();
      if (*json_output) {
        std::cout << list.dump(2) << "\n";
      } else {
        for (const auto& item : list) {
          std::cout << item["name"].get<std::string>() << ": " << item["summary"].get<std::string>()
                    << "\n";
        }
      }
      return;
    }
    const nlohmann::json result = validate_json(*path, *pairs_path, *without);
    if (!pairs_path->empty()) {
      std::cout << (*json_output ? result.dump(2) + "\n" : pairs_table(result));
      return;
    }
    if (*json_output) {
      std::cout << result.dump(2) << "\n";
      return;
    }
    // Columns as wide as their longest id and hardware name.
    int id_width = 8;
    int hardware_width = 6;
    for (const auto& row : result["rows"]) {
      id_width = std::max(id_width, static_cast<int>(row["id"].get<std::string>().size()) + 2);
      hardware_width =
          std::max(hardware_width, static_cast<int>(row["hardware"].get<std::string>().size()) + 2);
    }
    std::cout << std::left << std::setw(id_width) << "id" << std::setw(hardware_width) << "chip"
              << std::right << std::setw(11) << "measured_s" << std::setw(12) << "predicted_s"
              << std::setw(9) << "error" << std::setw(14) << "tok/s/chip" << std::setw(12)
              << "predicted" << std::setw(8) << "MFU"
              << "\n";
    std::cout << std::fixed;
    for (const auto& row : result["rows"]) {
      std::ostringstream measured_tokens;
      measured_tokens << std::fixed << std::setprecision(1);
      if (row.contains("measured_tokens_s_chip")) {
        measured_tokens << row["measured_tokens_s_chip"].get<double>();
      } else {
        measured_tokens << "-";
      }
      std::cout << std::left << std::setw(id_width) << row["id"].get<std::string>()
                << std::setw(hardware_width) << row["hardware"].get<std::string>() << std::right
                << std::setprecision(3) << std::setw(11) << row["measured_step_s"].get<double>()
                << std::setw(12) << row["predicted_step_s"].get<double>() << std::setprecision(1)
                << std::setw(8) << 100 * row["error"].get<double>() << "%" << std::setw(14)
                << measured_tokens.str() << std::setw(12)
                << row["predicted_tokens_s_chip"].get<double>() << std::setw(7)
                << 100 * row["predicted_mfu"].get<double>() << "%\n";
    }
    const auto& summary = result["summary"];
    std::cout << std::setprecision(1) << "median |error| "
              << 100 * summary["median_abs_error"].get<double>() << "%, mean "
              << 100 * summary["mean_abs_error"].get<double>() << "%, max "
              << 100 * summary["max_abs_error"].get<double>() << "% over " << summary["rows"]
              << " rows\n";
  });
}

}  // namespace tpusim
