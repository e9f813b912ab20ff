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

// Red-team item 9: a catalog directory (TPUSIM_HW_DIR) whose v5e HBM bandwidth is 0 gave an
// infinite step time; it is exit 2 naming the file and the key, for every command.
TEST(RedTeam, Item9_BadCatalogNumberIsExit2NamingFileAndKey) {
  const std::filesystem::path directory =
      std::filesystem::path(::testing::TempDir()) / "item9_catalog";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  for (const auto& entry :
       std::filesystem::directory_iterator(testing::source_dir() + "/configs/hw")) {
    if (entry.path().extension() == ".yml") {
      std::filesystem::copy_file(entry.path(), directory / entry.path().filename());
    }
  }
  const std::string v5e = (directory / "v5e.yml").string();
  std::string text = read_text_file(v5e);
  const size_t at = text.find("hbm_bandwidth_gbps: {value: ");
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + std::string("hbm_bandwidth_gbps: {value: ").size();
  text.replace(value, text.find(',', value) - value, "0");
  std::ofstream(v5e, std::ios::trunc) << text;
  ::setenv("TPUSIM_HW_DIR", directory.c_str(), 1);
  expect_user_error({"estimate", "model_name=tiny-llama", "compile_topology=v5e-4"},
                    v5e + ": specs.hbm_bandwidth_gbps.value: 0 is out of range");
  expect_user_error({"hw"}, v5e + ": specs.hbm_bandwidth_gbps");
  ::unsetenv("TPUSIM_HW_DIR");
}

}  // namespace
}  // namespace tpusim
