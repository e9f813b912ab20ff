// sim/train/checkpoint.h: save and restore the training state of `tpusim train`.
//
// A checkpoint is a directory of three files:
//   model.safetensors      the model parameters (global, unsharded), float32
//   optimizer.safetensors  the Adam moments ("<parameter>/mu", "<parameter>/nu"), float32
//   state.json             {"step": n, "metadata": {...}, "files": {"model.safetensors":
//                           {"bytes": n, "sha256": "<hex>"}, "optimizer.safetensors": {...}}}
// The .safetensors files follow https://huggingface.co/docs/safetensors (safetensors.h; dtype
// "F32"), so other tools can read them; tensor names are kept
// exactly as given ('/', '#' and '.' included). The checksums are those of `sha256sum`.
//
// Saving is atomic as a whole: the files go to "<directory>.tmp.<pid>", are fsync'd, and the
// directory is then renamed into place, so a reader (or a resumed run after a crash) sees either
// the previous checkpoint or the complete new one, never a mix. Run directories keep one
// checkpoint per step under "<run_dir>/checkpoints/<step>".
//
// Example:
//   Checkpoint checkpoint;
//   checkpoint.step = 100;
//   checkpoint.weights["decoder/wq#0"] = {.shape = {512, 8, 64}, .values = wq};
//   checkpoint.optimizer["decoder/wq#0/mu"] = {.shape = {512, 8, 64}, .values = mu};
//   checkpoint.metadata = {{"data_position", 100}};
//   save_checkpoint(checkpoint_directory(run_dir, checkpoint.step), checkpoint);
//   ...
//   if (std::string latest = latest_checkpoint(run_dir); !latest.empty()) {
//     Checkpoint restored = load_checkpoint(latest);
//   }
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/train/safetensors.h"

namespace tpusim {

struct Checkpoint {
  int64_t step = 0;                                   // updates applied
  std::map<std::string, CheckpointTensor> weights;    // model parameters (global, unsharded)
  std::map<std::string, CheckpointTensor> optimizer;  // Adam moments (names end in /mu, /nu)
  nlohmann::json metadata;                            // free-form: data position, config summary
};

// Writes the checkpoint to `directory` (parent directories are created), replacing an existing
// checkpoint there only once the new one is complete on disk. Throws UserError naming the path
// when it cannot be written, and std::logic_error for an inconsistent checkpoint (negative step,
// a tensor whose values do not match its shape, an empty or reserved tensor name, invalid UTF-8).
void save_checkpoint(const std::string& directory, const Checkpoint& checkpoint);

// Reads and verifies a checkpoint. Throws UserError naming the file and the problem for a missing
// directory or file, a truncated file, a bad safetensors header, a checksum mismatch, or a dtype
// other than F32.
Checkpoint load_checkpoint(const std::string& directory);

// "<run_directory>/checkpoints/<step>".
std::string checkpoint_directory(const std::string& run_directory, int64_t step);

// The directory of the highest-step complete checkpoint of the run (as checkpoint_directory
// names it), or "" when there is none. Leftovers of interrupted saves ("<step>.tmp.<pid>") are
// ignored (and removed by the next save once their process is gone); a step directory without all
// three files is skipped with a message on stderr when it is newer than the one resumed from.
std::string latest_checkpoint(const std::string& run_directory);

}  // namespace tpusim
