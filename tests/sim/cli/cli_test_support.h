// tests/sim/cli/cli_test_support.h: what the command-line tests share. They run the built
// tpusim end to end (tests/support/run_command.h) and check output contracts and exit codes, one
// file per command (<command>_command_test.cpp, as sim/cli/<command>_command.cpp).
//
// Example:
//   expect_user_error({"estimate", "model_name=nope"}, "nope");  // exit 2, one line naming it
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/run_command.h"

namespace tpusim {

// A bad input must exit 2 with exactly one line on stderr that names the bad value.
inline void expect_user_error(const std::vector<std::string>& args, const std::string& named) {
  const auto result = testing::run_tpusim(args);
  std::string joined;
  for (const auto& arg : args) {
    joined += arg + " ";
  }
  EXPECT_EQ(result.exit_code, 2) << joined << "\n" << result.err;
  EXPECT_NE(result.err.find(named), std::string::npos) << joined << "\n" << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
}

}  // namespace tpusim
