// `tpusim export-hf CHECKPOINT OUT_DIR [config.yml ...] [key=value ...]`: writes a tpusim
// checkpoint's weights as a Hugging Face Transformers model directory: OUT_DIR/model.safetensors
// (Transformers' tensor names and layouts, float32; sim/train/hf_names.h) and OUT_DIR/config.json
// (LlamaConfig / MistralConfig / Qwen3Config / GPT2Config fields). The model is the one the
// checkpoint records (model_name and its model_config keys); further arguments are applied over it.
// Both files are written atomically. Exit 0 on success, 2 on bad input (a missing or damaged
// checkpoint, a checkpoint without a recorded model, a family with no Transformers mapping).
//
// Example:
//   tpusim export-hf runs/a/checkpoints/200 /tmp/tiny-llama-hf
//   tpusim train model_name=tiny-llama load_parameters_path=/tmp/tiny-llama-hf ...  # round trip
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_files.h"
#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/train/checkpoint.h"
#include "sim/train/hf_names.h"

namespace tpusim {
namespace {

// The config of the model `checkpoint` records, with `args` applied over it.
Config recorded_config(const Checkpoint& checkpoint, const std::string& directory,
                       const std::vector<std::string>& args) {
  const nlohmann::json& metadata = checkpoint.metadata;
  if (!metadata.is_object() || !metadata.contains("model_config") ||
      !metadata["model_config"].is_object() || !metadata["model_config"].contains("model_name")) {
    throw UserError("checkpoint '" + directory +
                    "' records no model_config (written by an older tpusim): export-hf cannot "
                    "tell which model it holds");
  }
  // A key the user's arguments set is theirs (they are applied over the checkpoint's model):
  // passing both made "'model_name' is given twice on the command line" when it was given once.
  std::set<std::string> user_keys;
  for (const std::string& item : split_command_args(args).overrides) {
    user_keys.insert(split_override(item).first);
  }
  std::vector<std::string> overrides;
  if (!user_keys.contains("override_model_config")) {
    overrides.emplace_back("override_model_config=true");
  }
  for (const auto& [key, value] : metadata["model_config"].items()) {
    if (key == "query_scaling" || key == "tokenizer" || user_keys.contains(key)) {
      continue;  // markers of the numerics and of the token ids (not config keys); a user's key
    }
    overrides.push_back(key + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
  }
  std::vector<std::string> all = args;
  all.insert(all.begin(), overrides.begin(), overrides.end());
  return load_command_config(all);
}

void export_hf(const std::string& checkpoint_path, const std::string& out_directory,
               const std::vector<std::string>& args) {
  note_input(checkpoint_path);
  const Checkpoint checkpoint = load_checkpoint(checkpoint_path);
  const Config config = recorded_config(checkpoint, checkpoint_path, args);
  const std::map<std::string, CheckpointTensor> tensors = to_hf(config, checkpoint.weights);
  // Both files' contents are made before anything is written, and renamed into place only when
  // both are complete: a failed export leaves the previous one whole.
  std::string weights = encode_safetensors(tensors);
  std::string config_text = hf_config_json(config).dump(2) + "\n";
  const std::filesystem::path out(out_directory);
  check_not_an_input((out / "model.safetensors").string());
  std::error_code error;
  std::filesystem::create_directories(out_directory, error);
  if (error) {
    throw UserError("export-hf: cannot create '" + out_directory + "': " + error.message());
  }
  write_files_atomically({{(out / "model.safetensors").string(), std::move(weights)},
                          {(out / "config.json").string(), std::move(config_text)}});
  std::cerr << "export-hf: " << tensors.size() << " tensors (" << hf_family(config) << ") -> "
            << (out / "model.safetensors").string() << ", " << (out / "config.json").string()
            << "\n";
}

}  // namespace

void register_export_hf_command(CLI::App& app) {
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto args = std::make_shared<std::vector<std::string>>();
  CLI::App* command = app.add_subcommand(
      "export-hf", "Write a checkpoint's weights as a Hugging Face model (safetensors + config)");
  command->add_option("checkpoint", *checkpoint, "checkpoint directory (runs/<run>/checkpoints/N)")
      ->required();
  command->add_option("out_dir", *out, "output directory for model.safetensors and config.json")
      ->required();
  command->add_option("args", *args, "[config.yml ...] key=value ... over the recorded model");
  command->callback([checkpoint, out, args] { export_hf(*checkpoint, *out, *args); });
}

}  // namespace tpusim
