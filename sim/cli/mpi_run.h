// sim/cli/mpi_run.h: runs one rank's part of a command under mpirun and turns what it throws into
// the end of the whole run: MpiTransport::abort_run with the CLI's exit code (2 for bad input or a
// malformed value, 3 for a failed --verify, 1 for anything else), so that every rank stops and the
// user sees one message, as without mpirun.
//
// Example (train_command.cpp):
//   MpiTransport transport;
//   run_rank_or_abort(transport, [&] { train(args, options, &transport); });
#pragma once

#ifdef TPUSIM_WITH_MPI
#include <exception>
#include <string>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "sim/transport/mpi_transport.h"

namespace tpusim {

template <typename Run>
void run_rank_or_abort(MpiTransport& transport, Run&& run) {
  try {
    run();
  } catch (const UserError& error) {
    transport.abort_run(error.what(), kUserErrorExitCode);
  } catch (const VerifyFailure& failure) {
    transport.abort_run(failure.what(), kVerifyFailedExitCode);
  } catch (const YAML::Exception& error) {
    transport.abort_run(std::string("malformed value: ") + error.what(), kUserErrorExitCode);
  } catch (const std::exception& error) {
    transport.abort_run(error.what(), 1);
  }
}

}  // namespace tpusim
#endif
