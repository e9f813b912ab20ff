// tests/sim/cli/input_limits_command_test.cpp: the bounds on input size (config files, values,
// keys) end to end through the built tpusim, in an executable of its own so that its ctest TIMEOUT
// can be short: these inputs once took minutes (red-team item 19), and must fail at once.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

// Red-team item 19: a 2 MB unknown key took 171 s before its error (the did-you-mean distance)
// and a 200 MB value 47 s and 1.6 GB. Each is now refused at once, naming the limit; this
// executable's ctest TIMEOUT (tests/CMakeLists.txt) is the backstop should that ever regress.
TEST(RedTeam, Item19_OverLongKeysValuesAndFilesAreExit2) {
  const std::string directory = ::testing::TempDir();
  const std::string long_key = directory + "/item19_cli_key.yml";
  std::ofstream(long_key) << "? " << std::string(size_t{2} << 20, 'k') << "\n: 1\n";
  expect_user_error({"config", long_key}, "(a key of 2097152 bytes)");
  const std::string big = directory + "/item19_cli_big.yml";
  std::ofstream(big) << "run_name: \"" << std::string(size_t{5} << 20, 'v') << "\"\n";
  expect_user_error({"config", big}, "4 MiB");
  // validate reads a row's args from a CSV file, with no command-line length limit.
  const std::string csv = directory + "/item19_cli_rows.csv";
  std::ofstream(csv) << "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,v5e,"
                     << "model_name=tiny-llama compile_topology=v5e-4 run_name="
                     << std::string(size_t{1} << 20, 'v') << ",1.0,\n";
  expect_user_error({"validate", csv}, "more than the longest value tpusim reads (65536 bytes");
}

}  // namespace
}  // namespace tpusim
