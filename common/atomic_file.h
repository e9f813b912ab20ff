// common/atomic_file.h: write a file so readers never see it half-written.
//
// The content goes to "<path>.tmp.<pid>" in the same directory, is flushed, then renamed over
// `path` (rename is atomic on POSIX file systems). Used for every file tpusim writes: reports,
// traces, Graphviz, checkpoints.
//
// Example:
//   write_file_atomically("topology.dot", dot_text);
#pragma once

#include <string>
#include <string_view>

namespace tpusim {

// Throws UserError naming the path when the directory is not writable.
void write_file_atomically(const std::string& path, std::string_view content);

}  // namespace tpusim
