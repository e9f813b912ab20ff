// common/process.h: whether a process id still runs, for cleaning up what a killed writer left
// (the temporaries of common/atomic_file.h, a checkpoint's staging directories).
//
// Example:
//   if (process_has_exited(pid_in_the_name)) std::filesystem::remove(leftover);
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <limits>

namespace tpusim {

// True only when `pid` is a valid process id and no process with it runs (kill(pid, 0) fails with
// ESRCH; EPERM means it runs under another user). A value outside pid_t's range is not one tpusim
// wrote, so it is never called exited.
inline bool process_has_exited(int64_t pid) {
  if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) {
    return false;
  }
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace tpusim
