#include "sim/cli/validate_pairs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>
#include <utility>

#include "common/csv.h"
#include "common/error.h"
#include "common/input_files.h"
#include "common/yaml_text.h"
#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/op_timing.h"
#include "sim/cli/table_values.h"
#include "sim/estimate/estimate.h"
#include "sim/estimate/estimate_comparison.h"

namespace tpusim {
namespace {

// The runs a pair may name by id: published.csv's and gpu_published.csv's rows and
// recipes_public.json's recipes, read from the pairs file's folder when a pair first names one.
class NamedRuns {
 public:
  explicit NamedRuns(std::filesystem::path folder) : folder_(std::move(folder)) {}

  // The config of `published:ID`, `gpu_published:ID` or `recipe:ID`; nullopt for plain
  // overrides.
  std::optional<Config> config_of(const std::string& run, const std::string& where) {
    for (const std::string file : {"published", "gpu_published"}) {
      if (run.starts_with(file + ":")) {
        const std::string id = run.substr(file.size() + 1);
        const auto& rows = published(file);
        const auto found = rows.find(id);
        if (found == rows.end()) {
          throw UserError(where + ": no row '" + id + "' in " +
                          (folder_ / (file + ".csv")).string());
        }
        return Config::load("", split_words(found->second));
      }
    }
    if (run.starts_with("recipe:")) {
      const std::string id = run.substr(std::string("recipe:").size());
      const auto& all = recipes();
      const auto found = all.find(id);
      if (found == all.end()) {
        throw UserError(where + ": no recipe '" + id + "' in " +
                        (folder_ / "recipes_public.json").string());
      }
      return load_recipe_config(found->second.args, found->second.xla_flags);
    }
    return std::nullopt;
  }

 private:
  struct Recipe {
    std::vector<std::string> args;
    std::string xla_flags;
  };

  // The args of each row of `file`.csv (published.csv, gpu_published.csv) by id.
  const std::map<std::string, std::string>& published(const std::string& file) {
    auto cached = published_.find(file);
    if (cached == published_.end()) {
      const std::string path = (folder_ / (file + ".csv")).string();
      note_input(path);
      const CsvTable table = parse_csv(read_text_file(path), path);
      const size_t id = table.column("id");
      const size_t args = table.column("args");
      std::map<std::string, std::string> rows;
      for (const auto& row : table.rows) {
        rows[row[id]] = row[args];
      }
      cached = published_.emplace(file, std::move(rows)).first;
    }
    return cached->second;
  }

  const std::map<std::string, Recipe>& recipes() {
    if (!recipes_) {
      const std::string path = (folder_ / "recipes_public.json").string();
      note_input(path);
      nlohmann::json json;
      try {
        json = nlohmann::json::parse(read_text_file(path));
        recipes_.emplace();
        for (const auto& recipe : json) {
          Recipe entry;
          entry.args = {
              "compile_topology=" + recipe.at("topology").get<std::string>(),
              "compile_topology_num_slices=" + std::to_string(recipe.at("num_slices").get<int>())};
          for (const auto& arg : recipe.at("args")) {
            entry.args.push_back(arg.get<std::string>());
          }
          std::string flags;
          for (const auto& flag : recipe.value("xla_flags", nlohmann::json::array())) {
            flags += (flags.empty() ? "" : " ") + flag.get<std::string>();
          }
          entry.xla_flags = flags;
          (*recipes_)[recipe.at("id").get<std::string>()] = entry;
        }
      } catch (const nlohmann::json::exception& error) {
        throw UserError(path + ": not a recipes file (" + error.what() + ")");
      }
    }
    return *recipes_;
  }

  std::filesystem::path folder_;
  std::map<std::string, std::map<std::string, std::string>> published_;  // by file
  std::optional<std::map<std::string, Recipe>> recipes_;
};

// The rest of an error about one run, after where it is.
[[noreturn]] void rethrow_at(const UserError& error, const std::string& where) {
  throw UserError(where + ": " + error.what());
}

// The predicted quantity of one run of an op pair, as `tpusim op` times it.
double predict_op(const std::string& quantity, const std::string& run,
                  const MechanismSet& mechanisms, const std::string& where) {
  try {
    const std::vector<std::string> words = split_words(run);
    if (words.empty()) {
      throw UserError("empty; give KIND key=value ...");
    }
    const nlohmann::json timed =
        time_op(words.front(), {words.begin() + 1, words.end()}, mechanisms, /*quiet=*/true);
    return timed.at(quantity).get<double>();
  } catch (const UserError& error) {
    rethrow_at(error, where);
  }
}

// The estimate of one run of a step pair.
Estimate estimate_run(const std::string& run, NamedRuns& named, const MechanismSet& mechanisms,
                      const std::string& where) {
  try {
    std::optional<Config> config = named.config_of(run, where);
    if (!config) {
      config = load_recipe_config(split_words(run), "");
    }
    return estimate_config(*config, mechanisms);
  } catch (const UserError& error) {
    rethrow_at(error, where);
  }
}

// A and B's predicted quantity: a step pair through the comparison `tpusim compare` prints
// (sim/estimate/estimate_comparison.h), an op pair through `tpusim op`.
std::pair<double, double> predict_pair(const std::string& level, const std::string& quantity,
                                       const std::string& a, const std::string& b, NamedRuns& named,
                                       const MechanismSet& mechanisms, const std::string& where) {
  if (level == "op") {
    const double predicted_a = predict_op(quantity, a, mechanisms, where + " a");
    return {predicted_a, predict_op(quantity, b, mechanisms, where + " b")};
  }
  const Estimate estimate_a = estimate_run(a, named, mechanisms, where + " a");
  const Estimate estimate_b = estimate_run(b, named, mechanisms, where + " b");
  const EstimateComparison comparison = compare_estimates(estimate_a, estimate_b);
  return {comparison.a.quantity(quantity), comparison.b.quantity(quantity)};
}

void check_level_and_quantity(const std::string& level, const std::string& quantity,
                              const std::string& where) {
  static const std::map<std::string, std::vector<std::string>> kQuantities = {
      {"step", {"step_s", "mfu"}}, {"op", {"seconds", "percent_of_peak"}}};
  const auto found = kQuantities.find(level);
  if (found == kQuantities.end()) {
    throw UserError(where + " level: '" + level + "' is neither step nor op");
  }
  if (std::find(found->second.begin(), found->second.end(), quantity) == found->second.end()) {
    std::string allowed;
    for (const std::string& name : found->second) {
      allowed += (allowed.empty() ? "" : " or ") + name;
    }
    throw UserError(where + " quantity: '" + quantity + "' is not one of a " + level + " pair's (" +
                    allowed + ")");
  }
}

nlohmann::json summary_of(const nlohmann::json& pairs, const std::string& level) {
  std::vector<double> points;
  int judged = 0;
  int wrong = 0;
  for (const auto& pair : pairs) {
    if (pair["level"] != level) {
      continue;
    }
    points.push_back(std::abs(pair["error_points"].get<double>()));
    if (pair["direction"] != "not judged") {
      ++judged;
      wrong += pair["direction"] == "wrong";
    }
  }
  return {
      {"pairs", points.size()},
      {"median_abs_points", median(points)},
      {"max_abs_points", points.empty() ? 0.0 : *std::max_element(points.begin(), points.end())},
      {"directions_judged", judged},
      {"directions_wrong", wrong}};
}

}  // namespace

nlohmann::json validate_pairs(const std::string& path, const MechanismSet& mechanisms) {
  note_input(path);
  const CsvTable table = parse_csv(read_text_file(path), path);
  NamedRuns named(std::filesystem::path(path).parent_path());
  const std::vector<std::string> columns = {
      "id", "level", "quantity", "a", "b", "measured_a", "measured_b", "source", "config_note"};
  std::map<std::string, size_t> at;
  for (const std::string& column : columns) {
    at[column] = table.column(column);
  }
  if (table.rows.empty()) {  // printed an empty summary, exit 0
    throw UserError(path + ": no rows under the header: nothing to validate");
  }
  nlohmann::json pairs = nlohmann::json::array();
  for (size_t index = 0; index < table.rows.size(); ++index) {
    const auto& row = table.rows[index];
    const auto cell = [&](const std::string& column) { return row[at.at(column)]; };
    const std::string where = path + " row " + std::to_string(index + 2) + " (" + cell("id") + ")";
    check_level_and_quantity(cell("level"), cell("quantity"), where);
    const double measured_a = parse_table_number(cell("measured_a"), where + " measured_a");
    const double measured_b = parse_table_number(cell("measured_b"), where + " measured_b");
    if (!(measured_a > 0) || !(measured_b > 0)) {
      throw UserError(where + ": measured_a and measured_b must be positive");
    }
    const auto [predicted_a, predicted_b] = predict_pair(cell("level"), cell("quantity"), cell("a"),
                                                         cell("b"), named, mechanisms, where);
    const double measured_ratio = measured_b / measured_a;
    const double predicted_ratio = predicted_b / predicted_a;
    std::string direction = "not judged";
    if (std::abs(measured_ratio - 1) >= kPairDirectionThreshold) {
      direction = (predicted_ratio - 1) * (measured_ratio - 1) > 0 ? "right" : "wrong";
    }
    pairs.push_back({{"id", cell("id")},
                     {"level", cell("level")},
                     {"quantity", cell("quantity")},
                     {"measured_a", measured_a},
                     {"measured_b", measured_b},
                     {"predicted_a", predicted_a},
                     {"predicted_b", predicted_b},
                     {"measured_ratio", measured_ratio},
                     {"predicted_ratio", predicted_ratio},
                     {"error_points", 100 * (predicted_ratio - measured_ratio)},
                     {"direction", direction},
                     {"source", cell("source")}});
  }
  return {{"pairs", pairs},
          {"summary", {{"step", summary_of(pairs, "step")}, {"op", summary_of(pairs, "op")}}}};
}

std::string pairs_table(const nlohmann::json& result) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  for (const std::string level : {"step", "op"}) {
    const nlohmann::json& summary = result["summary"][level];
    if (summary["pairs"].get<size_t>() == 0) {
      continue;
    }
    size_t id_width = 4;
    for (const auto& pair : result["pairs"]) {
      id_width = std::max(id_width, pair["id"].get<std::string>().size() + 2);
    }
    out << level << "-level pairs: change of B against A (" << (level == "step" ? "step" : "op")
        << " quantity as measured)\n"
        << std::left << std::setw(static_cast<int>(id_width)) << "id" << std::setw(16) << "quantity"
        << std::right << std::setw(10) << "measured" << std::setw(11) << "predicted" << std::setw(9)
        << "points"
        << "  direction\n";
    for (const auto& pair : result["pairs"]) {
      if (pair["level"] != level) {
        continue;
      }
      out << std::left << std::setw(static_cast<int>(id_width)) << pair["id"].get<std::string>()
          << std::setw(16) << pair["quantity"].get<std::string>() << std::right << std::showpos
          << std::setw(9) << 100 * (pair["measured_ratio"].get<double>() - 1) << "%"
          << std::setw(10) << 100 * (pair["predicted_ratio"].get<double>() - 1) << "%"
          << std::setw(9) << pair["error_points"].get<double>() << std::noshowpos << "  "
          << pair["direction"].get<std::string>() << "\n";
    }
    out << "median |error| " << summary["median_abs_points"].get<double>() << " points, max "
        << summary["max_abs_points"].get<double>() << " over " << summary["pairs"] << " pairs; "
        << summary["directions_wrong"] << " of " << summary["directions_judged"]
        << " directions wrong (judged where the measured change is at least "
        << 100 * kPairDirectionThreshold << "%)\n\n";
  }
  return out.str();
}

}  // namespace tpusim
