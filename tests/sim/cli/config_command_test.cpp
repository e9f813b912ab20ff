// tests/sim/cli/config_command_test.cpp: `tpusim config`: the loading order, files on disk, and bad
// inputs (sim/cli/config_command.cpp), end to end through the built tpusim.
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

TEST(ConfigCommand, LoadingOrderAndMesh) {
  const auto result = run_tpusim({"config", "model_name=llama3.1-70b", "compile_topology=v6e-256",
                                  "per_device_batch_size=4", "ici_tensor_parallelism=4", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["config"]["base_emb_dim"], 8192);
  EXPECT_EQ(json["config"]["per_device_batch_size"], 4.0);
  EXPECT_EQ(json["mesh"]["fsdp"]["ici"], 64);
  EXPECT_EQ(json["mesh"]["tensor"]["ici"], 4);
  EXPECT_EQ(json["devices"], 256);
}

TEST(ConfigCommand, ReadsBaseFileFromDiskWithPresetsBesideIt) {
  const std::string base = testing::source_dir() + "/configs/base.yml";
  const auto result = run_tpusim({"config", base, "model_name=mistral-7b", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out)["config"]["base_mlp_dim"], 14336);
}

TEST(ConfigCommand, EveryBadInputClassExits2) {
  expect_user_error({"config", "ici_fsdp_paralelism=4"}, "ici_fsdp_parallelism");
  expect_user_error({"config", "base_emb_dim=abc"}, "base_emb_dim");
  expect_user_error({"config", "base_emb_dim=99999999999"}, "base_emb_dim");
  expect_user_error({"config", "per_device_batch_size=0"}, "per_device_batch_size");
  expect_user_error({"config", "model_name=llama9-1b"}, "llama9-1b");
  expect_user_error({"config", "compile_topology=v5p-100"}, "v5p-100");
  expect_user_error({"config", "compile_topology=v5p-128", "ici_tensor_parallelism=3"},
                    "ici_fsdp_parallelism");
  expect_user_error({"config", "ici_data_parallelism=-1"}, "-1");
  expect_user_error({"config", "compile_topology=v5p-128", "ici_fsdp_parallelism=8"}, "64");
  expect_user_error({"config", "mlp_activations=[silu"}, "mlp_activations");
  expect_user_error({"config", "notakeyvalue"}, "notakeyvalue");
  expect_user_error({"config", "/nonexistent/base.yml"}, "/nonexistent/base.yml");
  expect_user_error({"config", "remat_policy=fulll"}, "remat_policy");
  // A rule naming an unknown mesh axis: printed with exit 0, though estimate refuses it.
  expect_user_error({"config", "logical_axis_rules=[[embed, fsdpp]]"}, "'fsdpp'");
}

// Red-team item 7: 4294967298 slices were narrowed to 2 (exit 0); the slice count is checked
// before it becomes an int, in every command that reads it.
TEST(RedTeam, Item7_SliceCountIsRangeCheckedBeforeNarrowing) {
  for (const char* command : {"config", "estimate", "explore"}) {
    expect_user_error({command, "model_name=tiny-llama", "compile_topology=v5e-4",
                       "compile_topology_num_slices=4294967298"},
                      "compile_topology_num_slices: 4294967298");
  }
  expect_user_error({"topology", "v5e-4", "--num-slices", "4294967298"}, "4294967298");
}

// Red-team item 20: a config file giving a key twice was accepted (the last value won), and of
// several unknown keys only the first was reported.
TEST(RedTeam, Item20_DuplicateKeysAndEveryUnknownKeyAreReported) {
  const std::string directory = ::testing::TempDir();
  const std::string duplicated = directory + "/item20_cli_dup.yml";
  std::ofstream(duplicated) << "model_name: tiny-llama\nsteps: 5\nsteps: 7\n";
  expect_user_error({"config", duplicated}, duplicated + ": key 'steps' appears twice");
  const auto several = run_tpusim(
      {"config", "model_name=tiny-llama", "remat_polcy=full", "stpes=3", "ici_fsdp_paralelism=2"});
  EXPECT_EQ(several.exit_code, 2);
  for (const char* key : {"'remat_polcy'", "'stpes'", "'ici_fsdp_paralelism'"}) {
    EXPECT_NE(several.err.find(key), std::string::npos) << key << "\n" << several.err;
  }
  EXPECT_EQ(std::count(several.err.begin(), several.err.end(), '\n'), 1) << several.err;
}

// An empty or null model_name estimated MaxText's default model, labelled "" ("model  on
// v5p-8"), with exit 0; MaxText loads configs/models/<model_name>.yml for any name but "default".
TEST(RedTeam, S60_EmptyOrNullModelNameIsBadInput) {
  for (const char* command : {"config", "estimate"}) {
    expect_user_error({command, "model_name="}, "model_name: empty");
  }
  const std::string file = ::testing::TempDir() + "/s60_null_model.yml";
  std::ofstream(file) << "model_name: null\nper_device_batch_size: 2\n";
  expect_user_error({"estimate", file}, "model_name: empty");
  EXPECT_EQ(run_tpusim({"config", "model_name=default"}).exit_code, 0);
}

// MaxText's num_slices overrides the slice count at run time; tpusim estimated one slice for
// num_slices=2 without a word. It must agree with compile_topology_num_slices.
TEST(RedTeam, S60_NumSlicesMustAgreeWithCompileTopologyNumSlices) {
  expect_user_error({"estimate", "model_name=tiny-llama", "compile_topology=v5e-4", "num_slices=2"},
                    "num_slices: 2 but compile_topology_num_slices is -1");
  // 0 is no slice count (it was told "set it to 0").
  expect_user_error({"estimate", "model_name=tiny-llama", "compile_topology=v5e-4", "num_slices=0"},
                    "num_slices: 0 must be -1 (compile_topology_num_slices decides) or a positive");
  EXPECT_EQ(run_tpusim({"estimate", "model_name=tiny-llama", "compile_topology=v5e-4",
                        "compile_topology_num_slices=2", "num_slices=2"})
                .exit_code,
            0);
  EXPECT_EQ(
      run_tpusim({"estimate", "model_name=tiny-llama", "compile_topology=v5e-4", "num_slices=1"})
          .exit_code,
      0);
}

}  // namespace
}  // namespace tpusim
