// common/input_files.h: the files and directories this run reads, so that no output replaces one.
//
// A command notes each input the user named (config files, the dataset, the tokenizer, a
// checkpoint or Hugging Face directory, a CSV to validate, a hardware catalog). The atomic writers
// (common/atomic_file.h) then refuse, with a UserError naming both, an output that is the same
// file as an input (by device and inode, so another spelling of the path, a hard link or a
// symbolic link to it is caught too) or that would land inside an input directory: `export-hf
// CK CK` would otherwise overwrite the checkpoint it reads, `metrics_file=<dataset_path>` the
// corpus, `estimate my.yml --html my.yml` the config.
//
// Example:
//   note_input("configs/my.yml");
//   check_not_an_input("configs/my.yml");   // throws UserError: it is an input of this run
//   check_not_an_input("out/step.html");    // returns
#pragma once

#include <string>

namespace tpusim {

// Records `path` (a file or a directory) as read by this run; a path that does not exist is
// ignored (reading it fails on its own).
void note_input(const std::string& path);

// Throws UserError when `output` is a noted input, or its directory is a noted input directory.
void check_not_an_input(const std::string& output);

// Forgets every noted input (tests, and a process that runs several commands).
void clear_inputs();

}  // namespace tpusim
