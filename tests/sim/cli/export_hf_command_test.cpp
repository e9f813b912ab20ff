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
#include <set>
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

std::string file_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

nlohmann::json json_file(const std::string& path) {
  return nlohmann::json::parse(file_bytes(path), nullptr, false);
}

// The __init__ arguments of Transformers' config classes (docs/reference/huggingface.md cites the
// files and commits read), plus what every PretrainedConfig carries.
const std::set<std::string> kPretrainedConfig = {
    "architectures", "model_type",   "torch_dtype",        "bos_token_id",
    "eos_token_id",  "pad_token_id", "tie_word_embeddings"};
const std::set<std::string> kLlamaConfig = {"vocab_size",
                                            "hidden_size",
                                            "intermediate_size",
                                            "num_hidden_layers",
                                            "num_attention_heads",
                                            "num_key_value_heads",
                                            "hidden_act",
                                            "max_position_embeddings",
                                            "initializer_range",
                                            "rms_norm_eps",
                                            "use_cache",
                                            "pretraining_tp",
                                            "rope_theta",
                                            "rope_scaling",
                                            "attention_bias",
                                            "attention_dropout",
                                            "mlp_bias",
                                            "head_dim"};
const std::set<std::string> kMixtralConfig = {"vocab_size",
                                              "hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "num_key_value_heads",
                                              "head_dim",
                                              "hidden_act",
                                              "max_position_embeddings",
                                              "initializer_range",
                                              "rms_norm_eps",
                                              "use_cache",
                                              "rope_theta",
                                              "sliding_window",
                                              "attention_dropout",
                                              "num_experts_per_tok",
                                              "num_local_experts",
                                              "output_router_logits",
                                              "router_aux_loss_coef",
                                              "router_jitter_noise"};
// Qwen3MoeConfig has no head_dim argument: it is kept as an extra attribute, which its attention
// reads (docs/reference/huggingface.md).
const std::set<std::string> kQwen3MoeConfig = {"vocab_size",
                                               "hidden_size",
                                               "intermediate_size",
                                               "num_hidden_layers",
                                               "num_attention_heads",
                                               "num_key_value_heads",
                                               "hidden_act",
                                               "max_position_embeddings",
                                               "initializer_range",
                                               "rms_norm_eps",
                                               "use_cache",
                                               "rope_theta",
                                               "rope_scaling",
                                               "attention_bias",
                                               "use_sliding_window",
                                               "sliding_window",
                                               "attention_dropout",
                                               "decoder_sparse_step",
                                               "moe_intermediate_size",
                                               "num_experts_per_tok",
                                               "num_experts",
                                               "norm_topk_prob",
                                               "output_router_logits",
                                               "router_aux_loss_coef",
                                               "mlp_only_layers",
                                               "head_dim"};
const std::set<std::string> kGenerationConfig = {"bos_token_id", "eos_token_id", "pad_token_id",
                                                 "do_sample", "max_length"};

void expect_keys_within(const nlohmann::json& json, const std::set<std::string>& arguments,
                        const std::string& what) {
  for (const auto& [key, value] : json.items()) {
    EXPECT_TRUE(arguments.contains(key) || kPretrainedConfig.contains(key))
        << what << " has no argument '" << key << "'";
  }
}

// The bundle beside the weights: the tokenizer (byte-level here), the special ids, the generation
// config, the model record; --dtype bfloat16 halves the weights; float32 loads back bit for bit.
TEST(ExportHfCommand, WritesACompleteBundle) {
  const std::string base =
      ::testing::TempDir() + "/tpusim_export_bundle_" + std::to_string(::getpid());
  const std::vector<std::string> train = {"train",
                                          "model_name=tiny-llama",
                                          "compile_topology=v5e-1",
                                          "per_device_batch_size=1",
                                          "max_target_length=16",
                                          "steps=1",
                                          "--quiet"};
  std::vector<std::string> run = train;
  run.insert(run.end(),
             {"enable_checkpointing=true", "base_output_directory=" + base, "run_name=r"});
  ASSERT_EQ(run_tpusim(run).exit_code, 0);
  const std::string checkpoint = base + "/r/checkpoints/1";
  const std::string out = base + "/hf";
  const auto exported = run_tpusim({"export-hf", checkpoint, out});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const nlohmann::json config = json_file(out + "/config.json");
  EXPECT_TRUE(config.at("bos_token_id").is_null());  // the byte tokenizer has no special tokens
  EXPECT_TRUE(config.at("eos_token_id").is_null());
  EXPECT_EQ(config.at("torch_dtype"), "float32");
  expect_keys_within(config, kLlamaConfig, "LlamaConfig");
  const nlohmann::json generation = json_file(out + "/generation_config.json");
  expect_keys_within(generation, kGenerationConfig, "GenerationConfig");
  EXPECT_EQ(generation.at("do_sample"), false);
  EXPECT_FALSE(generation.contains("max_length"));  // a checkpoint does not record its length
  const nlohmann::json tokenizer = json_file(out + "/tokenizer.json");
  EXPECT_EQ(tokenizer.at("pre_tokenizer").at("type"), "ByteLevel");
  EXPECT_EQ(tokenizer.at("model").at("vocab").size(), 256u);
  EXPECT_EQ(tokenizer.at("model").at("vocab").at("A"), 65);
  EXPECT_EQ(tokenizer.at("model").at("vocab").at("\xc4\xa0"), 32);  // GPT-2's character of ' '
  EXPECT_EQ(json_file(out + "/tokenizer_config.json").at("tokenizer_class"),
            "PreTrainedTokenizerFast");
  EXPECT_FALSE(std::filesystem::exists(out + "/tokenizer.model"));
  EXPECT_EQ(json_file(out + "/tpusim_model.json").at("model_config").at("model_name"),
            "tiny-llama");
  // Round trip: the weights train loads from the export are the checkpoint's, bit for bit (the
  // same safetensors bytes: names, shapes and values).
  std::vector<std::string> load = train;
  load.insert(load.end(), {"load_parameters_path=" + out, "--dump", base + "/dump"});
  const auto loaded = run_tpusim(load);
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  EXPECT_EQ(file_bytes(base + "/dump/initial/model.safetensors"),
            file_bytes(checkpoint + "/model.safetensors"));
  // bfloat16: half the bytes, BF16 in the header, still loadable.
  const std::string half = base + "/hf-bf16";
  ASSERT_EQ(run_tpusim({"export-hf", checkpoint, half, "--dtype", "bfloat16"}).exit_code, 0);
  const std::string half_weights = file_bytes(half + "/model.safetensors");
  EXPECT_NE(half_weights.find("\"BF16\""), std::string::npos);
  EXPECT_EQ(half_weights.find("\"F32\""), std::string::npos);
  EXPECT_LT(100 * half_weights.size(), 51 * file_bytes(out + "/model.safetensors").size());
  EXPECT_EQ(json_file(half + "/config.json").at("torch_dtype"), "bfloat16");
  load = train;
  load.push_back("load_parameters_path=" + half);
  EXPECT_EQ(run_tpusim(load).exit_code, 0);
  expect_user_error({"export-hf", checkpoint, base + "/hf16", "--dtype", "float16"}, "float16");
  std::filesystem::remove_all(base);
}

// A SentencePiece-trained checkpoint exports its model file as tokenizer.model (given as
// tokenizer_path: the checkpoint records its content, not its path), its tokenizer.json and ids.
TEST(ExportHfCommand, CopiesTheSentencePieceTokenizer) {
  const std::string base =
      ::testing::TempDir() + "/tpusim_export_spm_" + std::to_string(::getpid());
  std::filesystem::create_directories(base);
  const std::string text = "/usr/share/common-licenses/GPL-3";  // on every Debian machine
  const std::string command = "spm_train --input=" + text + " --model_prefix=" + base +
                              "/text --vocab_size=200 --model_type=unigram "
                              "--character_coverage=1.0 > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "spm_train (Debian package sentencepiece)";
  const std::string model = base + "/text.model";
  ASSERT_EQ(
      run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-1",
                  "per_device_batch_size=1", "max_target_length=16", "steps=1", "dataset_type=text",
                  "dataset_path=" + text, "tokenizer_path=" + model, "enable_checkpointing=true",
                  "base_output_directory=" + base, "run_name=r", "--quiet"})
          .exit_code,
      0);
  const std::string checkpoint = base + "/r/checkpoints/1";
  expect_user_error({"export-hf", checkpoint, base + "/hf"}, "tokenizer_path");
  const auto exported =
      run_tpusim({"export-hf", checkpoint, base + "/hf", "tokenizer_path=" + model});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_EQ(file_bytes(base + "/hf/tokenizer.model"), file_bytes(model));
  const nlohmann::json tokenizer = json_file(base + "/hf/tokenizer.json");
  EXPECT_EQ(tokenizer.at("model").at("type"), "Unigram");
  EXPECT_EQ(tokenizer.at("model").at("vocab").size(), 200u);
  // spm_train's defaults: <unk> 0, <s> 1, </s> 2, no pad.
  const nlohmann::json config = json_file(base + "/hf/config.json");
  EXPECT_EQ(config.at("bos_token_id"), 1);
  EXPECT_EQ(config.at("eos_token_id"), 2);
  EXPECT_TRUE(config.at("pad_token_id").is_null());
  EXPECT_EQ(json_file(base + "/hf/special_tokens_map.json").at("eos_token"), "</s>");
  // generate reads the directory's tokenizer.model: the prompt is SentencePiece's pieces.
  const auto generated = run_tpusim(
      {"generate", base + "/hf", "--prompt", "the program", "--max-tokens", "2", "--json"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const nlohmann::json result = nlohmann::json::parse(generated.out);
  EXPECT_LT(result.at("prompt_tokens").size(), 11u);  // fewer pieces than bytes
  std::filesystem::remove_all(base);
}

// The MoE families: Mixtral names for mixtral, Qwen3-MoE names for qwen3_moe; each export loads
// back bit for bit, and generate reads the same logits from it as from the checkpoint.
TEST(ExportHfCommand, ExportsMixtralAndQwen3MoeAndLoadsThemBack) {
  const std::string base =
      ::testing::TempDir() + "/tpusim_export_moe_" + std::to_string(::getpid());
  const std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {"MixtralForCausalLM", {"model_name=tiny-moe"}},
      {"Qwen3MoeForCausalLM",
       {"model_name=tiny-qwen3", "override_model_config=true", "decoder_block=qwen3_moe",
        "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=64"}}};
  for (const auto& [architecture, model] : models) {
    const std::string run = base + "/" + architecture;
    std::vector<std::string> train = {"train",
                                      "compile_topology=v5e-1",
                                      "per_device_batch_size=1",
                                      "max_target_length=16",
                                      "steps=1",
                                      "--quiet"};
    train.insert(train.end(), model.begin(), model.end());
    std::vector<std::string> first = train;
    first.insert(first.end(),
                 {"enable_checkpointing=true", "base_output_directory=" + run, "run_name=r"});
    const auto trained = run_tpusim(first);
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
    const std::string checkpoint = run + "/r/checkpoints/1";
    const auto exported = run_tpusim({"export-hf", checkpoint, run + "/hf"});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
    const nlohmann::json config = json_file(run + "/hf/config.json");
    EXPECT_EQ(config.at("architectures"), nlohmann::json({architecture}));
    const std::string weights = file_bytes(run + "/hf/model.safetensors");
    if (architecture == "MixtralForCausalLM") {
      expect_keys_within(config, kMixtralConfig, "MixtralConfig");
      EXPECT_EQ(config.at("num_local_experts"), 4);
      EXPECT_NE(weights.find("model.layers.1.block_sparse_moe.experts.3.w2.weight"),
                std::string::npos);
    } else {
      expect_keys_within(config, kQwen3MoeConfig, "Qwen3MoeConfig");
      EXPECT_EQ(config.at("num_experts"), 4);
      EXPECT_EQ(config.at("moe_intermediate_size"), 64);
      // qwen3_moe's router renormalizes whatever the key says (MaxText moe.py get_topk).
      EXPECT_EQ(config.at("norm_topk_prob"), true);
      EXPECT_NE(weights.find("model.layers.1.mlp.experts.3.down_proj.weight"), std::string::npos);
    }
    std::vector<std::string> load = train;
    load.insert(load.end(), {"load_parameters_path=" + run + "/hf", "--dump", run + "/dump"});
    const auto loaded = run_tpusim(load);
    ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
    EXPECT_EQ(file_bytes(run + "/dump/initial/model.safetensors"),
              file_bytes(checkpoint + "/model.safetensors"))
        << architecture;
    const std::vector<std::string> generate = {"--prompt", "ab",     "--max-tokens",
                                               "3",        "--json", "--with-logits"};
    std::vector<std::string> from_checkpoint = {"generate", checkpoint};
    std::vector<std::string> from_export = {"generate", run + "/hf"};
    from_checkpoint.insert(from_checkpoint.end(), generate.begin(), generate.end());
    from_export.insert(from_export.end(), generate.begin(), generate.end());
    const auto a = run_tpusim(from_checkpoint);
    const auto b = run_tpusim(from_export);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out) << b.err;
  }
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace tpusim
