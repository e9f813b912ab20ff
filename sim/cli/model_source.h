// sim/cli/model_source.h: the model a command reads from a path the user names: a tpusim
// checkpoint directory (state.json, its model recorded in the metadata) or a Hugging Face
// directory (model.safetensors and config.json, as `tpusim export-hf` writes it, whose
// tpusim_model.json records the same model; without that file the arguments name it, e.g.
// model_name=tiny-llama). The command's arguments ([config.yml ...] key=value ...) are applied
// over the recorded model, and `defaults` under them (the user's keys win).
//
// The tokenizer: a checkpoint records which one its embedding rows belong to (by content); the
// arguments' tokenizer_path must be that one (UserError naming tokenizer_path otherwise). A
// Hugging Face directory's tokenizer.model is used when the arguments give no tokenizer_path.
//
// Example:
//   ModelSource source = load_model_source("runs/a/checkpoints/200", {"tokenizer_path=t.model"},
//                                          {"compile_topology=v5e-1"}, "generate");
//   ShardedModel model(source.config);
//   model.restore(source.checkpoint, /*with_optimizer=*/false);
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "sim/train/checkpoint.h"

namespace tpusim {

struct ModelSource {
  Config config;
  Checkpoint checkpoint;  // the weights (global, tpusim's names); metadata as recorded
  bool hugging_face = false;
};

// UserError (exit 2) naming the path when it is neither kind of directory, and whatever loading
// the checkpoint or the weights refuses; `command` names the command in messages.
ModelSource load_model_source(const std::string& path, const std::vector<std::string>& args,
                              const std::vector<std::string>& defaults, const std::string& command,
                              const std::function<void(const Config&)>& check = nullptr);

// The config of a recorded model ({"model_name": ..., keys that fix its math}) with `args` applied
// over it and `defaults` under them; `where` names the record in messages.
Config recorded_config(const nlohmann::json& model_config, const std::string& where,
                       const std::vector<std::string>& args,
                       const std::vector<std::string>& defaults = {},
                       const std::function<void(const Config&)>& check = nullptr);

// The file of a Hugging Face directory that records the tpusim model of its weights.
inline constexpr const char* kTpusimModelFile = "tpusim_model.json";

}  // namespace tpusim
