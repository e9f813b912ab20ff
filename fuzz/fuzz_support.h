// fuzz/fuzz_support.h: what every fuzz target shares: the product's contract, a private scratch
// directory and file writing.
//
// The contract: bad input throws tpusim::UserError (exit 2 with a message). Any other exception
// escaping is a bug; run_guarded prints it and calls std::abort(), so libFuzzer (or the standalone
// driver) records the input as a crash. Crashes, sanitizer reports and hangs are caught by
// libFuzzer itself.
//
// Example:
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     const std::string_view bytes = as_text(data, size);
//     tpusim::fuzz::run_guarded("safetensors", [&] { tpusim::decode_safetensors("x", bytes); });
//     return 0;
//   }
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "common/error.h"

namespace tpusim::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Where run_guarded reports a contract violation: stderr, or the standalone driver's copy of it
// when the driver silences the targets' own output (-close_fd_mask).
inline int report_fd = 2;

[[noreturn]] inline void report_and_abort(const char* what, const std::string& message) {
  const std::string line = std::string("fuzz ") + what + ": " + message + "\n";
  [[maybe_unused]] const ssize_t written = ::write(report_fd, line.data(), line.size());
  std::abort();
}

// Runs `body`; a UserError is the expected outcome of bad input, anything else aborts.
template <typename Body>
void run_guarded(const char* what, Body&& body) {
  try {
    body();
  } catch (const UserError&) {
    // Bad input reported as the contract says.
  } catch (const std::exception& error) {
    report_and_abort(what,
                     std::string("an exception other than UserError escaped: ") + error.what());
  } catch (...) {
    report_and_abort(what, "a non-std exception escaped");
  }
}

// A directory of this process's own under $TMPDIR (created once, removed at exit), so targets whose
// reader takes a path write their input there; nothing outside it is written.
inline const std::filesystem::path& scratch_directory() {
  // Never destroyed, so the atexit handler can still use it.
  static const std::filesystem::path* const directory = [] {
    std::string base = std::filesystem::temp_directory_path() / "tpusim-fuzz-XXXXXX";
    if (mkdtemp(base.data()) == nullptr) {
      report_and_abort("scratch", "mkdtemp failed for " + base);
    }
    auto* path = new std::filesystem::path(base);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_directory(), ignored);
    });
    return path;
  }();
  return *directory;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    report_and_abort("write_file", "cannot write " + path.string());
  }
}

}  // namespace tpusim::fuzz
