#include "common/atomic_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace tpusim {

void write_file_atomically(const std::string& path, std::string_view content) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, error);
  if (!error && std::filesystem::exists(status) &&
      status.type() != std::filesystem::file_type::regular) {
    throw UserError("'" + path +
                    "' exists and is not a regular file (a link, directory, device or FIFO); "
                    "tpusim replaces output files whole, so it writes only regular files and new "
                    "paths");
  }
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream stream(temporary, std::ios::binary | std::ios::trunc);
    if (!stream) {
      throw UserError("cannot write file '" + path + "'");
    }
    stream.write(content.data(), static_cast<std::streamsize>(content.size()));
    stream.flush();
    if (!stream) {
      std::remove(temporary.c_str());
      throw UserError("failed while writing file '" + path + "'");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw UserError("cannot move finished file into place at '" + path + "'");
  }
}

}  // namespace tpusim
