// sim/cli/run_cli.h: the tpusim command line as a function, for main() and for the fuzz drivers.
//
// run_cli parses argv (argv[0] is the program name), runs the subcommand and returns the exit
// code: 0 success, 2 (kUserErrorExitCode) bad input, with the message on stderr (and a JSON
// error object on stdout under --json), 3 a check the user asked for failed (train --verify,
// estimate --require-fit on a run that does not fit), 1 (kInternalErrorExitCode) a programming
// error. It never lets an exception escape, so a driver can call it many times in one process:
//
//   char* argv[] = {"tpusim", "estimate", "model_name=tiny-llama", "compile_topology=v5e-4"};
//   int code = tpusim::run_cli(4, argv);  // 0, the estimate printed on stdout
#pragma once

namespace tpusim {

int run_cli(int argc, char** argv);

}  // namespace tpusim
