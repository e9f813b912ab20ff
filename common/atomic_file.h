// common/atomic_file.h: write a file so readers never see it half-written.
//
// The content goes to "<path>.tmp.<pid>" in the same directory, is flushed, then renamed over
// `path` (rename is atomic on POSIX file systems). Used for every file tpusim writes: reports,
// traces, Graphviz, checkpoints. write_file_durably also fsyncs the file before the rename and
// the directory after it, for files another run reads back and trusts (the token cache): after a
// crash the file is either the old one or the whole new one.
//
// Example:
//   write_file_atomically("topology.dot", dot_text);
//   write_file_durably("cache/index.json", index_text);
#pragma once

#include <string>
#include <string_view>

namespace tpusim {

// Throws UserError naming the path when the directory is not writable, or when `path` exists and
// is not a regular file: a device (/dev/full), a directory, a FIFO or a symbolic link would be
// replaced by the rename, so tpusim writes only to regular files and new paths.
void write_file_atomically(const std::string& path, std::string_view content);

// As write_file_atomically, with fsync of the temporary before the rename and of the directory
// after it.
void write_file_durably(const std::string& path, std::string_view content);

}  // namespace tpusim
