// sim/train/model_identity.h: what a checkpoint was made from, and the check that it loads only
// into that model.
//
// A checkpoint records the config keys that fix the model's math (its architecture and, for a
// resume, its optimizer) in its metadata as "model_config"; a run whose values differ refuses it,
// naming the first key that differs, even where the tensor shapes would fit. The mesh, batch and
// run settings may differ (a checkpoint resumes on another mesh or stage count).
//
// Example:
//   checkpoint.metadata["model_config"] = model_identity_from_config(config);
//   check_made_from(load_checkpoint(dir), dir, config, /*with_optimizer=*/true);  // or UserError
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "sim/train/checkpoint.h"

namespace tpusim {

// The values of the identity keys in `config` (and the query-scaling convention).
nlohmann::json model_identity_from_config(const Config& config);

// UserError naming the key when `checkpoint` (read from `directory`) was made from another model
// (or, when `with_optimizer`, another optimizer) than `config`'s.
void check_made_from(const Checkpoint& checkpoint, const std::string& directory,
                     const Config& config, bool with_optimizer);

}  // namespace tpusim
