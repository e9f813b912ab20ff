#include "support/run_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tpusim::testing {
namespace {

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (const char character : text) {
    quoted += character == '\'' ? std::string("'\\''") : std::string(1, character);
  }
  return quoted + "'";
}

std::string slurp(const std::string& path) {
  std::ifstream stream(path);
  std::ostringstream buffer;
  buffer << stream.rdbuf();
  return buffer.str();
}

}  // namespace

std::string source_dir() {
  const char* dir = std::getenv("TPUSIM_SOURCE_DIR");
  return dir != nullptr ? dir : TPUSIM_DEFAULT_SOURCE_DIR;
}

CommandResult run_tpusim(const std::vector<std::string>& args) {
  const char* from_environment = std::getenv("TPUSIM_BINARY");
  const char* binary = from_environment != nullptr ? from_environment : TPUSIM_DEFAULT_BINARY;
  static int counter = 0;
  const auto base = std::filesystem::temp_directory_path() /
                    ("tpusim_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string out_path = base.string() + ".out";
  const std::string err_path = base.string() + ".err";
  std::string command = shell_quote(binary);
  for (const std::string& arg : args) {
    command += " " + shell_quote(arg);
  }
  command += " >" + shell_quote(out_path) + " 2>" + shell_quote(err_path) + " </dev/null";
  const int status = std::system(command.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  return result;
}

}  // namespace tpusim::testing
