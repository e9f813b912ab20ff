// fuzz/cli_fuzz.cpp: fuzzes the front door, the whole `tpusim` command line run in-process.
//
// Input: the argument list, one argument per line (argv[0] "tpusim" is added). Only the commands
// that write nothing run: the first argument must be estimate, program, config, topology or hw,
// and arguments that would write a file or start another command are dropped (--html, --trace,
// --dot, keys naming files or directories, other command names). run_cli must return 0 or 2
// (kUserErrorExitCode); 1 means an exception other than UserError escaped a command: a bug, and
// the target aborts so libFuzzer records the input. Standard output is not interesting here
// (libFuzzer's -close_fd_mask=1 discards it).
//
// Relative config paths (configs/maxtext/...) resolve against the working directory: run it
// from the repository root, as scripts/fuzz.sh and the test suite do.
//
// Example (libFuzzer, scripts/fuzz.sh builds it):
//   build-fuzz/fuzz/cli_fuzz -dict=fuzz/cli.dict -close_fd_mask=1 -max_total_time=60 work_corpus
//   fuzz/corpus/cli
// Example (any compiler, the fixed-seed driver the test suite runs):
//   build/fuzz/cli_fuzz -runs=3000 -seed=1 -dict=fuzz/cli.dict fuzz/corpus/cli
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "fuzz/fuzz_support.h"
#include "sim/cli/run_cli.h"

namespace {

constexpr size_t kMaxArguments = 64;

constexpr std::array<std::string_view, 5> kCommands = {"estimate", "program", "config", "topology",
                                                       "hw"};
// Commands that write files or take long (train, explore, validate, op, export-hf) and the
// options and keys of the allowed ones that write or read directories.
constexpr std::array<std::string_view, 14> kDropped = {
    "train", "explore",    "validate", "export-hf", "op",    "--html", "--trace",
    "--dot", "_directory", "_file",    "_dir",      "_path", "--out",  "base_output"};

bool dropped(std::string_view argument) {
  return std::any_of(kDropped.begin(), kDropped.end(), [&](std::string_view word) {
    return word.starts_with("-") || word.find('_') != std::string_view::npos
               ? argument.find(word) != std::string_view::npos
               : argument == word;
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest = tpusim::fuzz::as_text(data, size);
  std::vector<std::string> arguments = {"tpusim"};
  while (!rest.empty() && arguments.size() <= kMaxArguments) {
    const size_t end = rest.find('\n');
    const std::string_view argument = rest.substr(0, end);
    // A NUL would end the argument early, as no real command line can carry one.
    if (argument.find('\0') == std::string_view::npos && !dropped(argument)) {
      arguments.emplace_back(argument);
    }
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  if (arguments.size() < 2 ||
      std::find(kCommands.begin(), kCommands.end(), arguments[1]) == kCommands.end()) {
    return 0;
  }
  std::vector<char*> argv;
  for (std::string& argument : arguments) {
    argv.push_back(argument.data());
  }
  argv.push_back(nullptr);
  const int code = tpusim::run_cli(static_cast<int>(arguments.size()), argv.data());
  if (code != 0 && code != tpusim::kUserErrorExitCode) {
    tpusim::fuzz::report_and_abort(
        "cli", "run_cli returned " + std::to_string(code) + " (an internal error) for: " + [&] {
          std::string line;
          for (const std::string& argument : arguments) {
            line += "'" + argument + "' ";
          }
          return line;
        }());
  }
  return 0;
}
