// common/atomic_file.h: write a file so readers never see it half-written.
//
// The content goes to a new "<path>.tmp.<pid>.<random>" in the same directory (created with
// O_CREAT | O_EXCL | O_NOFOLLOW, so a planted file or link there is never written through), is
// flushed, then renamed over `path` (rename is atomic on POSIX file systems). An output that is
// one of the run's inputs, or inside an input directory, is refused (common/input_files.h). Used
// for every file tpusim writes: reports, traces, Graphviz, checkpoints. write_file_durably also
// fsyncs the file before the rename and the directory after it, for files another run reads back
// and trusts (the token cache): after a crash the file is either the old one or the whole new one.
//
// Example:
//   write_file_atomically("topology.dot", dot_text);
//   write_file_durably("cache/index.json", index_text);
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tpusim {

// Throws UserError naming the path when the directory is not writable, or when `path` exists and
// is not a regular file: a device (/dev/full), a directory, a FIFO or a symbolic link would be
// replaced by the rename, so tpusim writes only to regular files and new paths.
void write_file_atomically(const std::string& path, std::string_view content);

// As write_file_atomically, with fsync of the temporary before the rename and of the directory
// after it.
void write_file_durably(const std::string& path, std::string_view content);

// Removes the temporaries "<name>.tmp.<pid>.<16 hex digits>" in `directory` left by a writer
// that was killed before its rename (its process no longer runs); a live writer's are kept.
// Best effort: returns how many it removed.
int remove_stale_temporaries(const std::string& directory);

// True when two output paths name one file (another spelling, "./", "..", a symbolic link in a
// directory on the way): both resolved with std::filesystem::weakly_canonical. A path that does
// not resolve (a permission error on the way) is compared as written, so a failure never makes
// two different paths equal.
bool same_output_path(const std::string& a, const std::string& b);

// Several files that belong together (a Hugging Face export's weights and config): every
// content is written to its temporary first, and only when all are complete are they renamed
// into place, so a failure leaves every previous file as it was.
void write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace tpusim
