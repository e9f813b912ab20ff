#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/input_files.h"
#include "common/process.h"

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

void refuse_non_regular(const std::string& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, error);
  if (!error && std::filesystem::exists(status) &&
      status.type() != std::filesystem::file_type::regular) {
    throw UserError("'" + path +
                    "' exists and is not a regular file (a link, directory, device or FIFO); "
                    "tpusim replaces output files whole, so it writes only regular files and new "
                    "paths");
  }
}

// A new file beside `path`, "<path>.tmp.<pid>.<random>", created with O_CREAT | O_EXCL |
// O_NOFOLLOW: a file or a symbolic link someone planted at that name makes the open fail
// instead of being written through, and the name cannot be guessed ahead. Returns its descriptor.
int create_temporary(const std::string& path, std::string& temporary) {
  static std::mutex mutex;
  static std::mt19937_64 generator{std::random_device{}()};
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint64_t nonce = 0;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      nonce = generator();
    }
    char suffix[17];
    std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(nonce));
    temporary = path + ".tmp." + std::to_string(::getpid()) + "." + suffix;
    const int descriptor =
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (descriptor >= 0) {
      return descriptor;
    }
    if (errno != EEXIST) {
      throw UserError("cannot write file '" + path + "': " + std::strerror(errno));
    }
  }
  throw UserError("cannot create a temporary file beside '" + path + "'");
}

bool write_all(int descriptor, std::string_view content) {
  while (!content.empty()) {
    const ssize_t written = ::write(descriptor, content.data(), content.size());
    if (written < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    content.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}

// Writes `content` to a new temporary beside `path` (flushed to disk when `durable`) and returns
// its name; nothing at `path` changes yet.
std::string write_temporary(const std::string& path, std::string_view content, bool durable) {
  check_not_an_input(path);
  refuse_non_regular(path);
  std::string temporary;
  const int descriptor = create_temporary(path, temporary);
  const bool written = write_all(descriptor, content) && (!durable || ::fsync(descriptor) == 0);
  const bool closed = ::close(descriptor) == 0;
  if (!written || !closed) {
    std::remove(temporary.c_str());
    throw UserError("failed while writing file '" + path + "'");
  }
  return temporary;
}

void move_into_place(const std::string& temporary, const std::string& path, bool durable) {
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

void write_file(const std::string& path, std::string_view content, bool durable) {
  move_into_place(write_temporary(path, content, durable), path, durable);
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view content) {
  write_file(path, content, /*durable=*/false);
}

void write_file_durably(const std::string& path, std::string_view content) {
  write_file(path, content, /*durable=*/true);
}

int remove_stale_temporaries(const std::string& directory) {
  std::error_code error;
  std::filesystem::directory_iterator entry(directory, error);
  std::vector<std::filesystem::path> stale;
  for (; !error && entry != std::filesystem::directory_iterator(); entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || !entry->is_regular_file(error)) {
      continue;
    }
    // "<pid>.<16 hex>" after ".tmp."
    const std::string tail = name.substr(at + 5);
    const size_t dot = tail.find('.');
    if (dot == std::string::npos || dot == 0 || tail.size() - dot - 1 != 16 ||
        tail.find_first_not_of("0123456789") != dot ||
        tail.find_first_not_of("0123456789abcdef", dot + 1) != std::string::npos) {
      continue;
    }
    int64_t pid = 0;
    const auto parsed = std::from_chars(tail.data(), tail.data() + dot, pid);
    if (parsed.ec == std::errc() && pid != ::getpid() && process_has_exited(pid)) {
      stale.push_back(entry->path());
    }
  }
  int removed = 0;
  for (const std::filesystem::path& path : stale) {
    removed += std::filesystem::remove(path, error) ? 1 : 0;
  }
  return removed;
}

void write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::string> temporaries;
  try {
    for (const auto& [path, content] : files) {
      temporaries.push_back(write_temporary(path, content, /*durable=*/false));
    }
  } catch (...) {
    for (const std::string& temporary : temporaries) {
      std::remove(temporary.c_str());
    }
    throw;
  }
  for (size_t index = 0; index < files.size(); ++index) {
    move_into_place(temporaries[index], files[index].first, /*durable=*/false);
  }
}

bool same_output_path(const std::string& a, const std::string& b) {
  const auto resolved = [](const std::string& path) {
    std::error_code error;
    std::filesystem::path canonical = std::filesystem::weakly_canonical(path, error);
    return error ? std::filesystem::path(path).lexically_normal() : canonical;
  };
  return resolved(a) == resolved(b);
}

}  // namespace tpusim
