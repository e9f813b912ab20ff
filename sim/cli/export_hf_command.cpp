// `tpusim export-hf CHECKPOINT OUT_DIR [config.yml ...] [key=value ...] [--dtype D]`: writes a
// tpusim checkpoint as a Hugging Face Transformers model directory:
//   model.safetensors        the weights under Transformers' names and layouts
//                            (sim/train/hf_names.h), float32 or (--dtype bfloat16) bfloat16
//   config.json              LlamaConfig / MistralConfig / Qwen3Config / GPT2Config fields, with
//                            the tokenizer's bos/eos/pad ids and torch_dtype
//   generation_config.json   the same ids, greedy decoding
//   tokenizer files          sim/train/hf_tokenizer.h: tokenizer.model (SentencePiece),
//                            tokenizer.json, tokenizer_config.json, special_tokens_map.json
//   tpusim_model.json        the model the checkpoint records, so that tpusim (generate,
//                            load_parameters_path) reads the directory without naming it again
// The model is the one the checkpoint records (model_name and its model_config keys); further
// arguments are applied over it. A checkpoint trained with a SentencePiece model needs that model
// as tokenizer_path=... (the checkpoint records its content, not its path). Every file is written
// atomically. Exit 0 on success, 2 on bad input (a missing or damaged checkpoint, a checkpoint
// without a recorded model, a family with no Transformers mapping, another tokenizer than the
// checkpoint's, a --dtype other than float32 or bfloat16).
//
// Example:
//   tpusim export-hf runs/a/checkpoints/200 /tmp/tiny-llama-hf --dtype bfloat16
//   tpusim train model_name=tiny-llama load_parameters_path=/tmp/tiny-llama-hf ...  # round trip
#include <filesystem>
#include <iostream>
#include <memory>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_files.h"
#include "model/config.h"
#include "sim/cli/commands.h"
#include "sim/cli/model_source.h"
#include "sim/train/checkpoint.h"
#include "sim/train/hf_names.h"
#include "sim/train/hf_tokenizer.h"
#include "sim/train/model_identity.h"
#include "sim/train/text_tokenizer.h"

namespace tpusim {
namespace {

// config.json and generation_config.json of the export.
std::pair<std::string, std::string> hf_configs(const Config& config, const TextTokenizer& tokenizer,
                                               const std::string& dtype) {
  nlohmann::json model = hf_config_json(config);
  const nlohmann::json ids = hf_special_token_ids(tokenizer);
  model.update(ids);
  model["torch_dtype"] = dtype;
  // GenerationConfig: tpusim generate's default (greedy). No max_length: a checkpoint does not
  // record the length it was trained on.
  nlohmann::json generation = ids;
  generation["do_sample"] = false;
  return {model.dump(2) + "\n", generation.dump(2) + "\n"};
}

void export_hf(const std::string& checkpoint_path, const std::string& out_directory,
               const std::vector<std::string>& args, const std::string& dtype) {
  if (dtype != "float32" && dtype != "bfloat16") {
    throw UserError("export-hf: --dtype '" + dtype + "': expected float32 or bfloat16");
  }
  note_input(checkpoint_path);
  const Checkpoint checkpoint = load_checkpoint(checkpoint_path);
  const nlohmann::json& metadata = checkpoint.metadata;
  const nlohmann::json recorded =
      metadata.is_object() ? metadata.value("model_config", nlohmann::json()) : nlohmann::json();
  const Config config = recorded_config(recorded, checkpoint_path, args);
  // The tokenizer must be the checkpoint's (its recorded content); its files join the bundle.
  check_made_from(checkpoint, checkpoint_path, config, /*with_optimizer=*/false);
  const TextTokenizer tokenizer(tokenizer_path_from_config(config));
  const std::map<std::string, CheckpointTensor> tensors = to_hf(config, checkpoint.weights);
  // Every file's content is made before anything is written, and renamed into place only when
  // all are complete: a failed export leaves the previous one whole.
  const std::filesystem::path out(out_directory);
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back((out / "model.safetensors").string(),
                     encode_safetensors(tensors, dtype == "bfloat16"));
  auto [model_json, generation_json] = hf_configs(config, tokenizer, dtype);
  files.emplace_back((out / "config.json").string(), std::move(model_json));
  files.emplace_back((out / "generation_config.json").string(), std::move(generation_json));
  for (auto& [name, text] : hf_tokenizer_files(tokenizer)) {
    files.emplace_back((out / name).string(), std::move(text));
  }
  const nlohmann::json identity = {{"model_config", model_identity_from_config(config)}};
  files.emplace_back((out / kTpusimModelFile).string(), identity.dump(2) + "\n");
  for (const auto& [path, text] : files) {
    check_not_an_input(path);
  }
  std::error_code error;
  std::filesystem::create_directories(out_directory, error);
  if (error) {
    throw UserError("export-hf: cannot create '" + out_directory + "': " + error.message());
  }
  write_files_atomically(files);
  if (tokenizer.bytes()) {
    std::filesystem::remove(out / "tokenizer.model", error);  // an earlier export's
  }
  std::cerr << "export-hf: " << tensors.size() << " tensors (" << hf_family(config) << ", " << dtype
            << ", tokenizer "
            << (tokenizer.bytes() ? "byte-level" : tokenizer.model_type() + " SentencePiece")
            << ") -> " << out_directory << " (" << files.size() << " files)\n";
}

}  // namespace

void register_export_hf_command(CLI::App& app) {
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto args = std::make_shared<std::vector<std::string>>();
  auto dtype = std::make_shared<std::string>("float32");
  CLI::App* command = app.add_subcommand(
      "export-hf",
      "Write a checkpoint as a Hugging Face model directory (weights, config, tokenizer)");
  command->add_option("checkpoint", *checkpoint, "checkpoint directory (runs/<run>/checkpoints/N)")
      ->required();
  command->add_option("out_dir", *out, "output directory of the Hugging Face model")->required();
  command->add_option("args", *args,
                      "[config.yml ...] key=value ... over the recorded model (tokenizer_path=... "
                      "for a SentencePiece-trained checkpoint)");
  command->add_option("--dtype", *dtype, "weights' dtype: float32 (default) or bfloat16");
  command->callback(
      [checkpoint, out, args, dtype] { export_hf(*checkpoint, *out, *args, *dtype); });
}

}  // namespace tpusim
