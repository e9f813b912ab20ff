#include "sim/cli/model_source.h"

#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/yaml_text.h"
#include "sim/cli/command_args.h"
#include "sim/train/model_identity.h"
#include "sim/train/train_settings.h"
#include "sim/train/trainer.h"

namespace tpusim {

Config recorded_config(const nlohmann::json& metadata, const std::string& directory,
                       const std::vector<std::string>& args,
                       const std::function<void(const Config&)>& check) {
  if (!metadata.is_object() || !metadata.contains("model_config") ||
      !metadata["model_config"].is_object() || !metadata["model_config"].contains("model_name")) {
    throw UserError("checkpoint '" + directory +
                    "' records no model_config (written by an older tpusim): cannot tell which "
                    "model it holds");
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
  return load_command_config(all, "", nullptr, check);
}

Config model_source_config(const std::string& path, const std::vector<std::string>& args,
                           Transport& transport, const std::function<void(const Config&)>& check) {
  namespace fs = std::filesystem;
  const bool root = transport.rank() == 0;
  std::error_code error;
  if (root && !fs::exists(path, error)) {
    throw UserError("'" + path +
                    "' does not exist (give a tpusim checkpoint directory, runs/<run>/checkpoints/"
                    "<step>, or Hugging Face weights: an export-hf directory or a .safetensors "
                    "file)");
  }
  const std::string kind =
      transport.broadcast_from_root(root ? (is_hf_weights(path)             ? "hf"
                                            : fs::is_directory(path, error) ? "tpusim"
                                                                            : "other")
                                         : "");
  if (kind == "other") {
    throw UserError("'" + path +
                    "' is neither a checkpoint directory nor Hugging Face weights (.safetensors)");
  }
  if (kind == "tpusim") {
    const std::string state = (fs::path(path) / "state.json").string();
    if (root && !fs::is_regular_file(state, error)) {
      throw UserError("checkpoint '" + path + "' has no state.json (not a tpusim checkpoint)");
    }
    const std::string text = transport.broadcast_from_root(root ? read_text_file(state) : "");
    const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      throw UserError("checkpoint '" + path + "': state.json is not a JSON object");
    }
    Checkpoint recorded;  // the metadata alone: the model is checked before anything is loaded
    recorded.metadata = parsed.value("metadata", nlohmann::json());
    Config config = recorded_config(recorded.metadata, path, args, check);
    check_made_from(recorded, path, config, /*with_optimizer=*/false);
    return config;
  }
  Config config = load_command_config(args, "", nullptr, check);
  if (FunctionalSettings::from_config(config).model_name == "default") {
    throw UserError("model_name: Hugging Face weights ('" + path +
                        "') record no tpusim model; name it (model_name=..., and the keys the "
                        "model was trained with)",
                    "model_name");
  }
  return config;
}

}  // namespace tpusim
