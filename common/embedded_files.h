// common/embedded_files.h: the default configs (configs/**.yml) compiled into the binary.
//
// tpusim runs from any directory with no files beside it: base.yml, the model presets and the
// hardware catalog are embedded at build time (cmake/EmbedFiles.cmake). A file given on the command
// line is read from disk instead.
//
// Example:
//   std::optional<std::string_view> text = embedded_file("configs/hw/v5p.yml");
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

struct EmbeddedFile {
  const char* path;  // relative to the project root, e.g. "configs/models/llama2-7b.yml"
  const char* text;
};

// Defined in the generated translation unit.
const std::vector<EmbeddedFile>& embedded_file_table();

// The text of an embedded file, or nullopt.
std::optional<std::string_view> embedded_file(std::string_view path);

// Paths of embedded files whose path starts with `prefix`, sorted.
std::vector<std::string> embedded_files_under(std::string_view prefix);

}  // namespace tpusim
