// sim/transport/process_group.h: the processes ("ranks") of one run and the few exchanges they
// make besides the program's collectives, with nothing of the functional engine in sight.
//
// `tpusim explore` under mpirun splits the candidates over ranks and merges their results through
// this interface alone, so the search links no functional engine; `tpusim train` uses the
// Transport (transport.h) that extends it with the communicator the program's collectives meet in.
// Every rank calls the exchanges in the same order; they fail (std::runtime_error naming the
// missing ranks) after the timeout.
//
// Example:
//   ProcessGroup& group = transport;                  // a LocalTransport, or MpiTransport
//   std::vector<std::vector<double>> all = group.all_gather({loss});  // one entry per rank
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tpusim {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int num_ranks() const = 0;
  // Ranks of this run on this host (they share its cores: num_threads=0).
  virtual int ranks_on_host() const = 0;
  // True when the run spans processes (under mpirun, even with one rank).
  virtual bool distributed() const = 0;

  // Bounds the exchanges below (default 60 s).
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Every rank's `mine`, by rank, on every rank.
  virtual std::vector<std::vector<double>> all_gather(const std::vector<double>& mine) = 0;
  // Every rank's `mine`, by rank, on rank 0; an empty list on the other ranks.
  virtual std::vector<std::vector<float>> gather_to_root(const std::vector<float>& mine) = 0;
  // Rank 0's `bytes` on every rank (the argument is ignored on the other ranks).
  virtual std::string broadcast_from_root(const std::string& bytes) = 0;

  // Called by the training loop at the start of each step (1-based): a test hook where a
  // transport may simulate a failure (MpiTransport: TPUSIM_FAULT_KILL_RANK/_AT_STEP).
  virtual void at_step(int64_t /*step*/) {}

 private:
  std::chrono::milliseconds timeout_ = std::chrono::seconds(60);
};

}  // namespace tpusim
