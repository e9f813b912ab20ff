#include "common/input_files.h"

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

#include "common/error.h"

namespace tpusim {
namespace {

using FileId = std::pair<dev_t, ino_t>;

struct Inputs {
  std::mutex mutex;
  std::map<FileId, std::string> files;        // as the user named them
  std::map<FileId, std::string> directories;  // likewise
};

Inputs& inputs() {
  static Inputs registry;
  return registry;
}

// The file's identity, following symbolic links; false when it does not exist.
bool identity(const std::string& path, FileId& id, bool& is_directory) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) {
    return false;
  }
  id = {status.st_dev, status.st_ino};
  is_directory = S_ISDIR(status.st_mode);
  return true;
}

}  // namespace

void note_input(const std::string& path) {
  FileId id;
  bool is_directory = false;
  if (path.empty() || !identity(path, id, is_directory)) {
    return;
  }
  Inputs& registry = inputs();
  const std::lock_guard<std::mutex> lock(registry.mutex);
  (is_directory ? registry.directories : registry.files).emplace(id, path);
}

void check_not_an_input(const std::string& output) {
  Inputs& registry = inputs();
  const std::lock_guard<std::mutex> lock(registry.mutex);
  if (registry.files.empty() && registry.directories.empty()) {
    return;
  }
  FileId id;
  bool is_directory = false;
  if (identity(output, id, is_directory)) {
    const auto& same = is_directory ? registry.directories : registry.files;
    if (const auto found = same.find(id); found != same.end()) {
      throw UserError("output '" + output + "' is the input '" + found->second +
                      "' of this run; refusing to overwrite it (name another output)");
    }
  }
  std::filesystem::path parent = std::filesystem::path(output).parent_path();
  if (parent.empty()) {
    parent = ".";
  }
  if (identity(parent.string(), id, is_directory) && is_directory) {
    if (const auto found = registry.directories.find(id); found != registry.directories.end()) {
      throw UserError("output '" + output + "' would be written inside '" + found->second +
                      "', an input directory of this run; refusing to change it (name another "
                      "output)");
    }
  }
}

void clear_inputs() {
  Inputs& registry = inputs();
  const std::lock_guard<std::mutex> lock(registry.mutex);
  registry.files.clear();
  registry.directories.clear();
}

}  // namespace tpusim
