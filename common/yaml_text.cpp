#include "common/yaml_text.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace tpusim {

std::string read_text_file(const std::string& path) {
  // Only regular files (links followed): a directory, a FIFO or /dev/zero would fail late or
  // never end; a size cap keeps a wrong path from exhausting memory.
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{8} << 30;
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!error && std::filesystem::exists(status) &&
      status.type() != std::filesystem::file_type::regular) {
    throw UserError("'" + path + "' is not a regular file (a directory, device or FIFO)");
  }
  if (!error && std::filesystem::exists(status) &&
      std::filesystem::file_size(path, error) > kMaxBytes) {
    throw UserError("'" + path + "' is larger than 8 GiB, more than tpusim reads");
  }
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    throw UserError("cannot read file '" + path + "'");
  }
  std::ostringstream buffer;
  buffer << stream.rdbuf();
  return buffer.str();
}

YAML::Node parse_yaml(std::string_view text, std::string_view origin) {
  try {
    std::vector<YAML::Node> documents = YAML::LoadAll(std::string(text));
    if (documents.size() > 1) {
      throw UserError(std::string(origin) + " holds " + std::to_string(documents.size()) +
                      " YAML documents (separated by ---); a config is one document");
    }
    return documents.empty() ? YAML::Node() : documents.front();
  } catch (const YAML::Exception& error) {
    throw UserError("malformed YAML in " + std::string(origin) + " at line " +
                    std::to_string(error.mark.line + 1) + ", column " +
                    std::to_string(error.mark.column + 1) + ": " + error.msg);
  }
}

std::string yaml_location(const YAML::Node& node, std::string_view origin) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) {
    return std::string(origin);
  }
  return std::string(origin) + ":" + std::to_string(mark.line + 1);
}

}  // namespace tpusim
