// tests/sim/cli/hw_command_test.cpp: `tpusim hw`: the chip catalog with its sources
// (sim/cli/hw_command.cpp), end to end through the built tpusim.
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

TEST(HwCommand, ListsCatalogWithSources) {
  const auto result = run_tpusim({"hw", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_GE(json.size(), 5u);
  for (const auto& chip : json) {
    for (const auto& [key, spec] : chip["specs"].items()) {
      EXPECT_TRUE(spec.contains("source") != spec.contains("assumption")) << key;
      EXPECT_TRUE(spec["value"].is_number()) << key;
    }
  }
  expect_user_error({"hw", "v9z"}, "v9z");
  const auto one = run_tpusim({"hw", "v5p"});
  EXPECT_EQ(one.exit_code, 0);
  EXPECT_NE(one.out.find("hbm_bandwidth_gbps"), std::string::npos);
}

}  // namespace
}  // namespace tpusim
