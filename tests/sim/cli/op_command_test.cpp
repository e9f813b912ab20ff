// tests/sim/cli/op_command_test.cpp: `tpusim op`: one op or collective timed on its own
// (sim/cli/op_command.cpp), end to end through the built tpusim.
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

TEST(OpCommand, MatmulAndCollectives) {
  const auto matmul = run_tpusim(
      {"op", "matmul", "m=8192", "n=8192", "k=8192", "compile_topology=v5e-1", "--json"});
  ASSERT_EQ(matmul.exit_code, 0) << matmul.err;
  const nlohmann::json json = nlohmann::json::parse(matmul.out);
  EXPECT_GT(json["percent_of_peak"].get<double>(), 50);
  EXPECT_LT(json["percent_of_peak"].get<double>(), 100);
  const auto gather =
      run_tpusim({"op", "all_gather", "bytes=33554432", "axes=fsdp", "compile_topology=v5e-32",
                  "ici_fsdp_parallelism=4", "ici_data_parallelism=-1", "--json"});
  ASSERT_EQ(gather.exit_code, 0) << gather.err;
  EXPECT_EQ(nlohmann::json::parse(gather.out)["group_size"], 4);
}

TEST(OpCommand, BadInputExits2) {
  expect_user_error({"op", "matmull", "m=1", "n=1", "k=1"}, "matmull");
  expect_user_error({"op", "matmul", "m=0", "n=1", "k=1"}, "m");
  expect_user_error({"op", "matmul", "m=8", "n=8"}, "k");
  expect_user_error({"op", "matmul", "m=x", "n=1", "k=1"}, "m");
  expect_user_error({"op", "all_gather", "bytes=100", "axes=fsdpp"}, "fsdpp");
  expect_user_error({"op", "all_gather", "axes=fsdp"}, "bytes");
  expect_user_error({"op", "all_gather", "bytes=100", "axes=tensor"}, "tensor");
}

}  // namespace
}  // namespace tpusim
