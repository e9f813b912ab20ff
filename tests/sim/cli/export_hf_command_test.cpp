// tests/sim/cli/export_hf_command_test.cpp: `tpusim export-hf`: a checkpoint under Hugging Face
// names, loaded back (sim/cli/export_hf_command.cpp), end to end through the built tpusim.
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

// export-hf writes model.safetensors and config.json from a checkpoint; load_parameters_path
// reads the directory back; bad input exits 2 naming the path, tensor or key.
TEST(ExportHfCommand, ExportsLoadsBackAndRefusesBadInput) {
  const std::string base = ::testing::TempDir() + "/tpusim_export_hf_" + std::to_string(::getpid());
  const std::vector<std::string> run = {"train",
                                        "compile_topology=v5e-1",
                                        "per_device_batch_size=1",
                                        "max_target_length=16",
                                        "steps=1",
                                        "enable_checkpointing=true",
                                        "base_output_directory=" + base,
                                        "--quiet"};
  for (const std::string model : {"tiny-llama", "tiny-moe", "tiny-qwen3"}) {
    std::vector<std::string> args = run;
    args.push_back("model_name=" + model);
    args.push_back("run_name=" + model);
    const auto trained = run_tpusim(args);
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
  }
  const std::string out = base + "/hf";
  const auto exported = run_tpusim({"export-hf", base + "/tiny-llama/checkpoints/1", out});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  std::ifstream config_file(out + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config.at("architectures"), nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(config.at("num_hidden_layers"), 2);
  std::vector<std::string> load = {"train",
                                   "model_name=tiny-llama",
                                   "compile_topology=v5e-1",
                                   "per_device_batch_size=1",
                                   "max_target_length=16",
                                   "steps=1",
                                   "load_parameters_path=" + out,
                                   "--quiet"};
  const auto loaded = run_tpusim(load);
  EXPECT_EQ(loaded.exit_code, 0) << loaded.err;
  // Qwen3 (qk-norm): Qwen3ForCausalLM with its own head_dim, read back the same way.
  const std::string qwen3_out = base + "/qwen3-hf";
  const auto qwen3 = run_tpusim({"export-hf", base + "/tiny-qwen3/checkpoints/1", qwen3_out});
  ASSERT_EQ(qwen3.exit_code, 0) << qwen3.err;
  std::ifstream qwen3_file(qwen3_out + "/config.json");
  const nlohmann::json qwen3_config = nlohmann::json::parse(qwen3_file);
  EXPECT_EQ(qwen3_config.at("architectures"), nlohmann::json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(qwen3_config.at("head_dim"), 32);
  std::vector<std::string> load_qwen3 = load;
  load_qwen3[1] = "model_name=tiny-qwen3";
  load_qwen3[6] = "load_parameters_path=" + qwen3_out;
  const auto qwen3_loaded = run_tpusim(load_qwen3);
  EXPECT_EQ(qwen3_loaded.exit_code, 0) << qwen3_loaded.err;
  // Bad input: a missing checkpoint, a family with no Transformers names, weights of another
  // model (a Llama config.json for tiny-gpt3, a GPT-2).
  expect_user_error({"export-hf", base + "/nowhere", out}, base + "/nowhere");
  expect_user_error({"export-hf", base + "/tiny-moe/checkpoints/1", base + "/moe-hf"},
                    "decoder_block 'mixtral'");
  load[1] = "model_name=tiny-gpt3";
  expect_user_error(load, "model_type");
}

// Red-team item 20: export-hf put the checkpoint's model keys on the command line before the
// user's, so `model_name=tiny-llama`, given once, was "given twice on the command line". The
// user's keys now replace the recorded ones.
TEST(RedTeam, Item20_ExportHfKeyGivenOnceIsNotGivenTwice) {
  const std::string base =
      ::testing::TempDir() + "/tpusim_item20_export_" + std::to_string(::getpid());
  const auto trained = run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-1",
                                   "per_device_batch_size=1", "max_target_length=16", "steps=1",
                                   "enable_checkpointing=true", "base_output_directory=" + base,
                                   "run_name=r", "--quiet"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const auto exported =
      run_tpusim({"export-hf", base + "/r/checkpoints/1", base + "/hf", "model_name=tiny-llama"});
  EXPECT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_EQ(exported.err.find("twice"), std::string::npos) << exported.err;
  // Given twice by the user, it still is.
  expect_user_error({"export-hf", base + "/r/checkpoints/1", base + "/hf2", "model_name=tiny-llama",
                     "model_name=tiny-llama"},
                    "'model_name' is given twice on the command line");
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace tpusim
