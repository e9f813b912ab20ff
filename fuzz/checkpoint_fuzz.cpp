// fuzz/checkpoint_fuzz.cpp: fuzzes the checkpoint reader of `tpusim train` (resume, export-hf).
//
// Input, by its first non-blank byte:
//   '{'      the state.json of a checkpoint directory whose two .safetensors files are fixed
//            (a small checkpoint the target saves at start-up with save_checkpoint); the target
//            replaces state.json and calls load_checkpoint on the directory
//   other    the bytes of a .safetensors file, given to decode_safetensors; a file that decodes
//            must encode again and decode to the same tensors (names, shapes, bits)
// A UserError is the expected outcome of bad input; any other exception, a crash or a sanitizer
// report is a bug.
//
// TPUSIM_FUZZ_SEED_OUT=<directory>: also write the start-up checkpoint's three files there, seeds
// for both modes (how fuzz/corpus/checkpoint/state.json and the .safetensors seeds were made).
//
// Example (libFuzzer, scripts/fuzz.sh builds it):
//   build-fuzz/fuzz/checkpoint_fuzz -dict=fuzz/checkpoint.dict -max_total_time=60 work_corpus
//   fuzz/corpus/checkpoint
// Example (any compiler, the fixed-seed driver the test suite runs):
//   build/fuzz/checkpoint_fuzz -runs=3000 -seed=1 -dict=fuzz/checkpoint.dict fuzz/corpus/checkpoint
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "sim/train/checkpoint.h"
#include "sim/train/safetensors.h"

namespace {

namespace fs = std::filesystem;
using tpusim::CheckpointTensor;

// The checkpoint directory; not named by digits, so any step in state.json may match it.
const fs::path& fixed_checkpoint() {
  static const fs::path* const directory = [] {
    auto* path = new fs::path(tpusim::fuzz::scratch_directory() / "checkpoint");
    tpusim::Checkpoint checkpoint;
    checkpoint.step = 3;
    checkpoint.weights["decoder/wq#0"] = {.shape = {2, 3}, .values = {1, -2, 0.5f, 0, 3, 4}};
    checkpoint.weights["token_embedder"] = {.shape = {}, .values = {7}};
    checkpoint.optimizer["decoder/wq#0/mu"] = {.shape = {2, 3}, .values = {0, 0, 0, 1, 1, 1}};
    checkpoint.optimizer["decoder/wq#0/nu"] = {.shape = {6}, .values = {1, 2, 3, 4, 5, 6}};
    checkpoint.metadata = {{"data_position", 3}};
    tpusim::save_checkpoint(path->string(), checkpoint);
    if (const char* seed_out = std::getenv("TPUSIM_FUZZ_SEED_OUT")) {
      fs::create_directories(seed_out);
      for (const char* name : {"state.json", "model.safetensors", "optimizer.safetensors"}) {
        fs::copy_file(*path / name, fs::path(seed_out) / name,
                      fs::copy_options::overwrite_existing);
      }
    }
    return path;
  }();
  return *directory;
}

bool same_tensors(const std::map<std::string, CheckpointTensor>& a,
                  const std::map<std::string, CheckpointTensor>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (auto left = a.begin(), right = b.begin(); left != a.end(); ++left, ++right) {
    if (left->first != right->first || left->second.shape != right->second.shape ||
        left->second.values.size() != right->second.values.size() ||
        (!left->second.values.empty() &&
         std::memcmp(left->second.values.data(), right->second.values.data(),
                     left->second.values.size() * sizeof(float)) != 0)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpusim;
  const std::string_view bytes = fuzz::as_text(data, size);
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && bytes[first] == '{') {
    const fs::path& directory = fixed_checkpoint();
    fuzz::write_file(directory / "state.json", bytes);
    fuzz::run_guarded("load_checkpoint", [&] { load_checkpoint(directory.string()); });
    return 0;
  }
  std::map<std::string, CheckpointTensor> decoded;
  bool ok = false;
  fuzz::run_guarded("decode_safetensors", [&] {
    decoded = decode_safetensors("input.safetensors", bytes);
    ok = true;
  });
  if (ok) {
    // What a reader accepts, the writer writes back as it was (tensors pass from export-hf to
    // training and back): a UserError here would be a bug too.
    try {
      const std::string encoded = encode_safetensors(decoded);
      if (!same_tensors(decoded, decode_safetensors("encoded.safetensors", encoded))) {
        fuzz::report_and_abort("safetensors round trip", "the re-encoded tensors differ");
      }
    } catch (const std::exception& error) {
      fuzz::report_and_abort("safetensors round trip",
                             std::string("decoded tensors do not encode: ") + error.what());
    }
  }
  return 0;
}
