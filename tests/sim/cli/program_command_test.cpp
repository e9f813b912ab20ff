// tests/sim/cli/program_command_test.cpp: `tpusim program`: the per-device program as text
// (sim/cli/program_command.cpp), end to end through the built tpusim.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/csv.h"
#include "common/yaml_text.h"
#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

TEST(ProgramCommand, PrintsLocalShapesAndCollectivesWithBytes) {
  const auto result =
      run_tpusim({"program", "model_name=tiny-llama", "compile_topology=v5e-4",
                  "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "--layer", "0"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("region layer x2 (fwd)"), std::string::npos);
  EXPECT_NE(result.out.find("region layer/grad x2 (bwd)"), std::string::npos);
  EXPECT_NE(result.out.find("embed:32@tensor"), std::string::npos);  // a split dim, local size
  EXPECT_NE(result.out.find("reduce_scatter"), std::string::npos);
  EXPECT_NE(result.out.find("over {tensor} group 2 bytes"), std::string::npos);
  const auto whole = run_tpusim({"program", "model_name=tiny-llama", "compile_topology=v5e-4"});
  ASSERT_EQ(whole.exit_code, 0);
  EXPECT_NE(whole.out.find("region optimizer/layer"), std::string::npos);
}

}  // namespace
}  // namespace tpusim
