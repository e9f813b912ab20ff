// sim/train/safetensors.h: the safetensors file format (https://huggingface.co/docs/safetensors).
//
// A little-endian uint64 header size, a JSON header ({"name": {"dtype", "shape", "data_offsets"},
// optional "__metadata__"}) padded with spaces to a multiple of 8 bytes, then the tensors
// contiguous in header order. tpusim writes F32 (or BF16 for export-hf --dtype bfloat16) and reads
// F32, BF16 and F16 (converted to float), so a public checkpoint saved in half precision loads as
// is. Names are kept exactly as given.
//
// Example:
//   std::map<std::string, CheckpointTensor> tensors;
//   tensors["lm_head.weight"] = {.shape = {256, 64}, .values = weights};
//   write_file_atomically("model.safetensors", encode_safetensors(tensors));
//   auto back = read_safetensors("model.safetensors");  // same names, shapes and values
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

// One float32 tensor, row-major; a scalar has shape {} and one value.
struct CheckpointTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The file's bytes, tensors in map order, dtype F32 (BF16, rounded to nearest even, with
// `bfloat16`), metadata {"format": "pt"}. Throws std::logic_error for a tensor whose values do not
// match its shape, or an empty or reserved name.
std::string encode_safetensors(const std::map<std::string, CheckpointTensor>& tensors,
                               bool bfloat16 = false);

// Decodes a whole file's `bytes`; `path` names it in errors. Throws UserError naming the file and
// the problem: truncated, bad header, tensors that do not tile the data, unsupported dtype.
std::map<std::string, CheckpointTensor> decode_safetensors(const std::string& path,
                                                           std::string_view bytes);

// Reads and decodes the file at `path` (UserError when missing or unreadable).
std::map<std::string, CheckpointTensor> read_safetensors(const std::string& path);

}  // namespace tpusim
