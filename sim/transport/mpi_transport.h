// sim/transport/mpi_transport.h: one training run spread over the processes of `mpirun`
// (OpenMPI), possibly on several hosts. Built only with TPUSIM_WITH_MPI.
//
// Construct one per process, and only when the process was started by mpirun
// (launched_by_mpirun()): it initializes MPI and finalizes it when destroyed. The program's
// collectives go through MpiCommunicator (mpi_communicator.h); the process-level exchanges of
// transport.h are nonblocking MPI collectives. Every MPI call of the process is made under one
// mutex (MPI_THREAD_SERIALIZED would do; MPI_THREAD_MULTIPLE is requested) and every wait polls its
// requests against a deadline, giving the CPU away between polls, so no thread ever blocks inside
// MPI.
//
// Failures end every rank within a bounded time, with a message naming the rank and what it was
// waiting for:
//   - a wait that outlives collective_timeout_seconds throws std::runtime_error "rank R:
//     collective all_reduce 'x' (op 12, call 3) timed out after 60 s waiting for rank(s) 1"; the
//     train command passes it to abort_run(), which prints it and calls MPI_Abort, and mpirun
//     then ends the other ranks;
//   - when a rank dies, mpirun's default is to end the job at once with SIGTERM: each surviving
//     rank's handler prints what it was waiting for ("tpusim: rank 0: stopped by SIGTERM (mpirun
//     ends the job when a rank fails or it is interrupted) while waiting in collective ... for
//     rank(s) 1") and exits.
//     With `mpirun --mca orte_abort_on_non_zero_status 0` the survivors time out as above instead.
//
// Test hook: environment TPUSIM_FAULT_KILL_RANK=r and TPUSIM_FAULT_AT_STEP=s make rank r stall
// for two seconds at the start of training step s (the other ranks meanwhile block in a
// collective with it), then kill itself with SIGKILL.
//
// Example (the train command):
//   if (MpiTransport::launched_by_mpirun()) {
//     MpiTransport transport;
//     try {
//       Trainer(config, transport).run(options, std::cerr);
//     } catch (const std::exception& error) {
//       transport.abort_run(error.what(), exit_code);
//     }
//   }
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sim/transport/transport.h"

namespace tpusim {

class MpiTransport final : public Transport {
 public:
  // True when this process was started by mpirun (OpenMPI's or a PMIx launcher's environment).
  static bool launched_by_mpirun();

  MpiTransport();
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int num_ranks() const override { return ranks_; }
  int ranks_on_host() const override { return ranks_on_host_; }
  bool distributed() const override { return true; }
  std::unique_ptr<Communicator> make_communicator(const std::array<int, kNumMeshAxes>& sizes,
                                                  const std::vector<int>& owner,
                                                  std::chrono::milliseconds timeout) override;
  std::vector<std::vector<double>> all_gather(const std::vector<double>& mine) override;
  std::vector<std::vector<float>> gather_to_root(const std::vector<float>& mine) override;
  std::string broadcast_from_root(const std::string& bytes) override;
  void at_step(int64_t step) override;

  // Prints "tpusim: rank R: <message>" on stderr and ends the whole job (MPI_Abort with
  // `exit_code`, which mpirun returns). Ranks other than 0 wait a second first, so that a failure
  // every rank shares (a bad config) is reported once, by rank 0, before mpirun ends the others.
  [[noreturn]] void abort_run(const std::string& message, int exit_code);

  // --- For MpiCommunicator. ---

  // The communicator of the program's collectives (point-to-point messages only).
  MPI_Comm collective_comm() const { return collective_comm_; }
  int max_tag() const { return max_tag_; }
  // Every MPI call of the process is made while holding this.
  std::mutex& mpi_mutex() { return mpi_mutex_; }

  // Polls until every request completes (peers[i]: the rank request i talks to, or -1 for a
  // collective of all ranks). Throws std::runtime_error "rank R: <what> timed out after X s
  // waiting for rank(s) ..." after `timeout`, and, once another thread of this process has failed
  // (note_failure), "rank R: <what> abandoned after an earlier failure on this rank". `buffers`
  // holds the memory the requests read or write: after a failure it is kept until the process
  // ends, since MPI may still use it.
  void wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers,
                std::chrono::milliseconds timeout, const std::string& what,
                const std::shared_ptr<void>& buffers);

  // Records the first failure of this process; later waits give up at once.
  void note_failure(const std::string& message);
  bool failed() const { return failed_.load(); }

 private:
  int rank_ = 0;
  int ranks_ = 1;
  int ranks_on_host_ = 1;
  int max_tag_ = 32767;
  MPI_Comm collective_comm_ = MPI_COMM_NULL;
  MPI_Comm control_comm_ = MPI_COMM_NULL;  // the process-level exchanges
  std::mutex mpi_mutex_;
  std::atomic<bool> failed_ = false;
  std::mutex graveyard_mutex_;
  std::vector<std::shared_ptr<void>> graveyard_;  // buffers of failed requests
  int64_t kill_rank_ = -1;                        // TPUSIM_FAULT_KILL_RANK
  int64_t kill_step_ = -1;                        // TPUSIM_FAULT_AT_STEP
};

}  // namespace tpusim
