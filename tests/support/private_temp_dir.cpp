// tests/support/private_temp_dir.cpp: gives every test process a temporary directory of its own.
//
// Tests write into ::testing::TempDir() (and tpusim, run by a test, into the system's temporary
// directory). Those used to be /tmp itself, shared by every checkout's test run on the machine,
// with file names made unique at most by the process id. A later process that got the same id met
// what an earlier run had left behind: a checkpoint directory already at step 3 made a test's
// `train steps=3` find nothing left to train. Linked into every test executable (cmake/
// TpusimHelpers.cmake), this file makes a fresh directory with mkdtemp before main runs, points
// TEST_TMPDIR (read by ::testing::TempDir()) and TMPDIR (read by std::filesystem::
// temp_directory_path() here and in the tpusim processes tests start) at it, and removes it when
// the process exits normally.
//
// Example: in a test, ::testing::TempDir() == "/tmp/tpusim_test_k3Q9aZ/", empty when it starts.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

class PrivateTempDir {
 public:
  PrivateTempDir() : owner_(::getpid()) {
    const char* parent = std::getenv("TMPDIR");
    std::string pattern = std::string(parent != nullptr && parent[0] != '\0' ? parent : "/tmp") +
                          "/tpusim_test_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return;  // keep the shared directory: tests still run, as before
    }
    path_ = pattern;
    ::setenv("TEST_TMPDIR", path_.c_str(), 1);
    ::setenv("TMPDIR", path_.c_str(), 1);
  }
  ~PrivateTempDir() {
    if (!path_.empty() && ::getpid() == owner_) {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;

 private:
  pid_t owner_;
  std::string path_;
};

const PrivateTempDir private_temp_dir;

}  // namespace
