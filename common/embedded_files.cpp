#include "common/embedded_files.h"

#include <algorithm>

namespace tpusim {

std::optional<std::string_view> embedded_file(std::string_view path) {
  for (const EmbeddedFile& file : embedded_file_table()) {
    if (path == file.path) {
      return std::string_view(file.text);
    }
  }
  return std::nullopt;
}

std::vector<std::string> embedded_files_under(std::string_view prefix) {
  std::vector<std::string> paths;
  for (const EmbeddedFile& file : embedded_file_table()) {
    if (std::string_view(file.path).starts_with(prefix)) {
      paths.emplace_back(file.path);
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace tpusim
