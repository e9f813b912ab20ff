// common/error.h: the one exception type for expected failures caused by the user's input.
//
// Bad input (unknown key, wrong type, impossible mesh, unknown slice, malformed YAML/CSV, absurd
// sizes) throws UserError with a one-line message that names the bad key or value. The CLI catches
// it, prints "tpusim: <message>" on stderr (and, under --json, {"error", "key", "exit"} on stdout)
// and exits with kUserErrorExitCode. Programming errors
// (broken invariants) are not UserErrors: they use assert or std::logic_error.
//
// Example:
//   if (chips <= 0) throw UserError("compile_topology: '" + name + "' has no chips");
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace tpusim {

// Exit status of the CLI for any invalid input.
inline constexpr int kUserErrorExitCode = 2;
// Exit status of the CLI for a programming error (anything but a UserError escaped a command).
inline constexpr int kInternalErrorExitCode = 1;
// Exit status of `tpusim train --verify` when a sharded step differs from the unsharded
// reference by more than the tolerance of its numerics (VerifyFailure).
inline constexpr int kVerifyFailedExitCode = 3;

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
  // With the config key the message is about, for machine-readable errors (`--json`).
  UserError(const std::string& message, std::string key)
      : std::runtime_error(message), key_(std::move(key)) {}

  const std::string& key() const { return key_; }  // "" when the error names no single key

 private:
  std::string key_;
};

// A sharded training step that --verify found different from the unsharded reference.
class VerifyFailure : public std::runtime_error {
 public:
  explicit VerifyFailure(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tpusim
