#include "sim/cli/model_source.h"

#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/input_files.h"
#include "common/yaml_text.h"
#include "sim/cli/command_args.h"
#include "sim/train/hf_names.h"
#include "sim/train/model_identity.h"
#include "sim/train/safetensors.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;

std::set<std::string> user_keys(const std::vector<std::string>& args) {
  std::set<std::string> keys;
  for (const std::string& item : split_command_args(args).overrides) {
    keys.insert(split_override(item).first);
  }
  return keys;
}

nlohmann::json read_json(const fs::path& path, const std::string& command) {
  try {
    return nlohmann::json::parse(read_text_file(path.string()));
  } catch (const nlohmann::json::exception& error) {
    throw UserError(command + ": '" + path.string() + "' is not valid JSON: " + error.what());
  }
}

ModelSource load_hugging_face(const fs::path& directory, const std::vector<std::string>& args,
                              std::vector<std::string> defaults, const std::string& command,
                              const std::function<void(const Config&)>& check) {
  std::error_code error;
  const std::set<std::string> keys = user_keys(args);
  const fs::path tokenizer = directory / "tokenizer.model";
  if (!keys.contains("tokenizer_path") && fs::is_regular_file(tokenizer, error)) {
    defaults.push_back("tokenizer_path=" + tokenizer.string());
  }
  ModelSource source;
  source.hugging_face = true;
  if (const fs::path record = directory / kTpusimModelFile; fs::is_regular_file(record, error)) {
    const nlohmann::json recorded = read_json(record, command);
    if (!recorded.is_object() || !recorded.contains("model_config")) {
      throw UserError(command + ": '" + record.string() + "' has no model_config");
    }
    source.config =
        recorded_config(recorded["model_config"], record.string(), args, defaults, check);
  } else if (!keys.contains("model_name")) {
    throw UserError(command + ": '" + directory.string() + "' has no " + kTpusimModelFile +
                        " (not written by tpusim export-hf): name its model with model_name=... "
                        "and the keys that differ from that preset",
                    "model_name");
  } else {
    std::vector<std::string> all = defaults;
    all.insert(all.end(), args.begin(), args.end());
    source.config = load_command_config(all, "", nullptr, check);
  }
  if (const fs::path config = directory / "config.json"; fs::is_regular_file(config, error)) {
    check_hf_config(source.config, read_json(config, command), config.string());
  }
  source.checkpoint.weights =
      from_hf(source.config, read_safetensors((directory / "model.safetensors").string()));
  return source;
}

}  // namespace

Config recorded_config(const nlohmann::json& model_config, const std::string& where,
                       const std::vector<std::string>& args,
                       const std::vector<std::string>& defaults,
                       const std::function<void(const Config&)>& check) {
  if (!model_config.is_object() || !model_config.contains("model_name")) {
    throw UserError("'" + where +
                    "' records no model_config (written by an older tpusim): cannot tell which "
                    "model it holds");
  }
  // A key the user's arguments set is theirs (they are applied over the recorded model): passing
  // both made "'model_name' is given twice on the command line" when it was given once.
  const std::set<std::string> keys = user_keys(args);
  std::vector<std::string> overrides;
  if (!keys.contains("override_model_config")) {
    overrides.emplace_back("override_model_config=true");
  }
  for (const auto& [key, value] : model_config.items()) {
    if (key == "query_scaling" || key == "tokenizer" || keys.contains(key)) {
      continue;  // markers of the numerics and of the token ids (not config keys); a user's key
    }
    overrides.push_back(key + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
  }
  for (const std::string& item : defaults) {
    if (!keys.contains(split_override(item).first)) {
      overrides.push_back(item);
    }
  }
  std::vector<std::string> all = args;
  all.insert(all.begin(), overrides.begin(), overrides.end());
  return load_command_config(all, "", nullptr, check);
}

ModelSource load_model_source(const std::string& path, const std::vector<std::string>& args,
                              const std::vector<std::string>& defaults, const std::string& command,
                              const std::function<void(const Config&)>& check) {
  note_input(path);
  std::error_code error;
  const fs::path directory(path);
  if (fs::is_regular_file(directory / "state.json", error)) {
    ModelSource source;
    source.checkpoint = load_checkpoint(path);
    const nlohmann::json& metadata = source.checkpoint.metadata;
    source.config = recorded_config(
        metadata.is_object() ? metadata.value("model_config", nlohmann::json()) : nlohmann::json(),
        path, args, defaults, check);
    check_made_from(source.checkpoint, path, source.config, /*with_optimizer=*/false);
    return source;
  }
  if (fs::is_regular_file(directory / "model.safetensors", error)) {
    return load_hugging_face(directory, args, defaults, command, check);
  }
  throw UserError(command + ": '" + path +
                  "' is neither a tpusim checkpoint (no state.json) nor a Hugging Face model "
                  "directory (no model.safetensors)");
}

}  // namespace tpusim
