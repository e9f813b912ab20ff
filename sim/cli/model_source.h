// sim/cli/model_source.h: the config of the model a command reads weights from, given as a tpusim
// checkpoint directory or as Hugging Face weights (`tpusim eval`, `export-hf`, and `generate`).
//
// A tpusim checkpoint records its model (model_name and the model_config keys that fix its math,
// sim/train/model_identity.h): the config is that model with the command's arguments applied over
// it (a key the user gives replaces the recorded one). Hugging Face weights (an export-hf
// directory or a .safetensors file) record no tpusim model: the arguments must name it
// (model_name), and loading checks the directory's config.json against it.
//
// Example:
//   const Config config = model_source_config("runs/a/checkpoints/200", {"dataset_path=t.txt"});
//   model.restore(load_model_weights("runs/a/checkpoints/200", config, transport), false);
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "sim/train/checkpoint.h"
#include "sim/transport/transport.h"

namespace tpusim {

// The config of the model `metadata` (a checkpoint's, read from `directory`) records, with `args`
// applied over it. UserError when it records no model.
Config recorded_config(const nlohmann::json& metadata, const std::string& directory,
                       const std::vector<std::string>& args,
                       const std::function<void(const Config&)>& check = nullptr);
inline Config recorded_config(const Checkpoint& checkpoint, const std::string& directory,
                              const std::vector<std::string>& args) {
  return recorded_config(checkpoint.metadata, directory, args);
}

// The config for the weights at `path` (a checkpoint directory or Hugging Face weights): rank 0
// reads a checkpoint's state.json and every rank gets its metadata. UserError naming the path when
// it does not exist, and model_name when Hugging Face weights come without one. `check` runs on
// the config first (a command's own refusals).
Config model_source_config(const std::string& path, const std::vector<std::string>& args,
                           Transport& transport,
                           const std::function<void(const Config&)>& check = nullptr);

}  // namespace tpusim
