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

// The listing's columns line up for every chip, the longest names included (h100-a3high):
// each row's first number ends where the header's "bf16 TF/s" ends.
TEST(HwCommand, ListingColumnsLineUp) {
  const auto result = run_tpusim({"hw"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::istringstream lines(result.out);
  std::string header;
  std::getline(lines, header);
  const size_t column_end = header.find("bf16 TF/s") + std::string("bf16 TF/s").size();
  ASSERT_NE(header.find("bf16 TF/s"), std::string::npos) << header;
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    const size_t name_end = line.find(' ');
    const size_t number_start = line.find_first_not_of(' ', name_end);
    const size_t number_end = line.find(' ', number_start);
    EXPECT_EQ(number_end, column_end) << line;
    ++rows;
  }
  EXPECT_GE(rows, 5);
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
