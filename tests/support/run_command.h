// tests/support/run_command.h: runs the tpusim binary in a test and captures what it prints.
//
// The binary's path is the one CMake built (TPUSIM_BINARY in the environment overrides it).
//
// Example:
//   CommandResult result = run_tpusim({"topology", "v5p-128", "--json"});
//   EXPECT_EQ(result.exit_code, 0);
#pragma once

#include <string>
#include <vector>

namespace tpusim::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

CommandResult run_tpusim(const std::vector<std::string>& args);

// Path of the project source tree (TPUSIM_SOURCE_DIR in the environment overrides it).
std::string source_dir();

}  // namespace tpusim::testing
