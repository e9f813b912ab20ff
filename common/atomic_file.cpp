#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace tpusim {

namespace {

// fsync of an open path (a file or a directory); false when it cannot be opened or synced.
bool sync_path(const std::string& path, int flags) {
  const int descriptor = ::open(path.c_str(), flags);
  if (descriptor < 0) {
    return false;
  }
  const bool synced = ::fsync(descriptor) == 0;
  ::close(descriptor);
  return synced;
}

void write_file(const std::string& path, std::string_view content, bool durable) {
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
  if (durable && !sync_path(temporary, O_RDONLY)) {
    std::remove(temporary.c_str());
    throw UserError("cannot flush file '" + path + "' to disk");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw UserError("cannot move finished file into place at '" + path + "'");
  }
  if (durable) {
    // The rename itself reaches the disk with the directory's entry.
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    sync_path(parent.empty() ? std::string(".") : parent.string(), O_RDONLY | O_DIRECTORY);
  }
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view content) {
  write_file(path, content, /*durable=*/false);
}

void write_file_durably(const std::string& path, std::string_view content) {
  write_file(path, content, /*durable=*/true);
}

}  // namespace tpusim
