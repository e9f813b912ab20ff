// benchmarks/estimate_batch.cpp: many estimates in one process, timed: the C++ side of the
// Python module's benchmark (benchmarks/python_module_benchmark.py).
//
// Reads a file of configs, one a line (the CLI's arguments, space-separated), and runs each
// through run_estimate, the function behind `tpusim estimate --json` that the module calls too
// (sim/cli/command_json.h), with the notes it would print collected and dropped. Prints one JSON
// object: the count, the seconds they took in all (after one untimed warm-up estimate, which
// reads the catalog and the embedded base.yml, as the Python side's warm-up does), and a
// checksum of the step times (the Python side must get the same). A config tpusim refuses counts
// as an error (the Python side catches ConfigError likewise).
//
// Example:
//   build/benchmarks/estimate_batch configs.txt
//   {"count": 1000, "errors": 0, "seconds": 9.81, "step_time_sum": 2345.6789}
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "sim/cli/command_json.h"

namespace {

std::vector<std::vector<std::string>> read_configs(const std::string& path) {
  std::ifstream file(path);
  std::vector<std::vector<std::string>> configs;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream words(line);
    std::vector<std::string> args;
    for (std::string word; words >> word;) {
      args.push_back(word);
    }
    if (!args.empty()) {
      configs.push_back(args);
    }
  }
  return configs;
}

double estimate_step_time(const std::vector<std::string>& args) {
  std::ostringstream notes;
  const tpusim::EstimateRun run = tpusim::run_estimate({args, "", {}}, notes);
  return run.json["step_time_s"].get<double>();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: estimate_batch CONFIGS.txt (one config a line: key=value ...)\n";
    return 2;
  }
  const auto configs = read_configs(argv[1]);
  if (configs.empty()) {
    std::cerr << "estimate_batch: no configs in " << argv[1] << "\n";
    return 2;
  }
  estimate_step_time(configs.front());  // warm-up: the catalog and base.yml, read once
  double step_time_sum = 0;
  int errors = 0;
  const auto started = std::chrono::steady_clock::now();
  for (const auto& args : configs) {
    try {
      step_time_sum += estimate_step_time(args);
    } catch (const tpusim::UserError&) {
      ++errors;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << nlohmann::json{{"count", configs.size()},
                              {"errors", errors},
                              {"seconds", seconds},
                              {"step_time_sum", step_time_sum}}
                   .dump()
            << "\n";
  return 0;
}
