// tests/sim/cli/topology_command_test.cpp: `tpusim topology`: the slice as JSON, text and Graphviz
// dot (sim/cli/topology_command.cpp), end to end through the built tpusim.
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

TEST(TopologyCommand, JsonContract) {
  const auto result = run_tpusim({"topology", "tpu7x-128", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["chips"], 64);
  EXPECT_EQ(json["devices"], 128);
  EXPECT_EQ(json["shape"], nlohmann::json({4, 4, 4}));
  EXPECT_EQ(json["wraparound"], nlohmann::json({true, true, true}));
  EXPECT_EQ(json["hosts"], 16);
  EXPECT_EQ(json["chips_per_host"], 4);
}

// MaxText spells the slice as a key; `topology compile_topology=v5e-32` is that slice (it was
// "unknown TPU generation 'compile_topology=v5e'").
TEST(TopologyCommand, AcceptsTheSliceWrittenAsMaxTextsKey) {
  const auto as_key = run_tpusim({"topology", "compile_topology=v5e-32", "--json"});
  ASSERT_EQ(as_key.exit_code, 0) << as_key.err;
  const auto as_name = run_tpusim({"topology", "v5e-32", "--json"});
  ASSERT_EQ(as_name.exit_code, 0) << as_name.err;
  EXPECT_EQ(nlohmann::json::parse(as_key.out), nlohmann::json::parse(as_name.out));
  EXPECT_EQ(nlohmann::json::parse(as_key.out)["chips"], 32);
}

TEST(TopologyCommand, MultisliceAndHumanOutput) {
  const auto json_result = run_tpusim({"topology", "v5e-256", "--num-slices", "2", "--json"});
  ASSERT_EQ(json_result.exit_code, 0) << json_result.err;
  EXPECT_EQ(nlohmann::json::parse(json_result.out)["chips"], 512);
  const auto human = run_tpusim({"topology", "v6e-256"});
  ASSERT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("16x16"), std::string::npos);
  EXPECT_NE(human.out.find("bisection"), std::string::npos);
  // The per-slice figures come from one slice's graph: the most slices give the same figures
  // (10,000 slices of a 256-chip pod took 1.4 GB as one graph of all of them).
  const auto many = run_tpusim({"topology", "v5e-256", "--num-slices", "10000", "--json"});
  ASSERT_EQ(many.exit_code, 0) << many.err;
  nlohmann::json many_json = nlohmann::json::parse(many.out);
  nlohmann::json two_json = nlohmann::json::parse(json_result.out);
  EXPECT_EQ(many_json["chips"], 2560000);
  for (const char* key : {"axes", "bisection_bandwidth_tbps", "ici_links_per_chip",
                          "dcn_bandwidth_per_slice_gbps", "chips_per_slice"}) {
    EXPECT_EQ(many_json[key], two_json[key]) << key;
  }
}

TEST(TopologyCommand, DotToStdout) {
  const auto result = run_tpusim({"topology", "v5p-8", "--dot"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.rfind("graph", 0), 0u);
}

TEST(TopologyCommand, InvalidInputsExit2) {
  expect_user_error({"topology", "v5q-128"}, "v5q");
  expect_user_error({"topology", "v5p-100"}, "v5p-100");
  expect_user_error({"topology", "v6e-512"}, "v6e-512");
  expect_user_error({"topology", "v5p:3x3x3"}, "3x3x3");
  expect_user_error({"topology", "v5p-128", "--num-slices", "0"}, "num_slices");
  // A million slices used to take 26 s and 2.9 GB: the slice count is bounded.
  expect_user_error({"topology", "v5p-16", "--num-slices", "1000000"}, "1000000");
  expect_user_error({"topology"}, "slice");
  expect_user_error({"topology", "v5p-8", "--bogus"}, "--bogus");
  expect_user_error({"topology", "v5p-8", "--json", "--dot"}, "--dot");
  // Drawing every device of 300 pods is refused, not attempted.
  expect_user_error({"topology", "v5e-256", "--num-slices", "300", "--dot", "/tmp/never.dot"},
                    "65536");
}

// Red-team item 12: a slice whose chip product overflows 32 bits (2^32 chips -> 0) crashed with
// SIGFPE in parse_slice, and one that wraps negative printed -1,530,494,976 chips with exit 0;
// every command that reads compile_topology goes through the same parse.
// An explicit shape was refused with the name's size rule ("legal sizes: 8, 16, 32, 64, or a
// multiple of 128"), which v5p:16x16x35's 17920 cores meet: the rule for a shape is its dims.
TEST(RedTeam, S60_AnIllegalShapeIsToldTheShapeRule) {
  expect_user_error({"topology", "v5p:16x16x35"}, "every dim a multiple of 4");
  expect_user_error({"topology", "v5p:8x8x6"}, "legal shapes: 2x2x1");
  EXPECT_EQ(run_tpusim({"topology", "v5p:16x16x32"}).exit_code, 0);
}

TEST(RedTeam, Item12_SliceChipProductOverflowIsExit2) {
  expect_user_error({"topology", "v5p:1024x2048x2048"}, "v5p:1024x2048x2048");
  expect_user_error({"topology", "v5p:100000x100000x100000"}, "v5p:100000x100000x100000");
  const std::string slice = "compile_topology=v5p:1024x2048x2048";
  for (const char* command : {"estimate", "explore", "config", "train"}) {
    expect_user_error({command, "model_name=tiny-llama", slice}, "v5p:1024x2048x2048");
  }
  expect_user_error({"op", "matmul", "m=128", "n=128", "k=128", slice}, "v5p:1024x2048x2048");
  const std::string csv = ::testing::TempDir() + "/item12_rows.csv";
  std::ofstream(csv) << "id,hardware,args,measured_step_s,measured_tokens_s_chip\n"
                     << "A,v5p,model_name=tiny-llama " << slice << ",1.0,\n";
  expect_user_error({"validate", csv}, "v5p:1024x2048x2048");
}

}  // namespace
}  // namespace tpusim
