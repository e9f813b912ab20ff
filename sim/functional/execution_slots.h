// sim/functional/execution_slots.h: how many simulated devices compute at once (num_threads).
//
// Every simulated device runs its program on its own OS thread, because a device blocks inside a
// collective until its whole group has arrived: a pool of fewer workers than devices would
// deadlock there (the workers all waiting for members that have no worker). The threads are
// cheap; what costs is computing, so num_threads limits how many devices COMPUTE at once. A
// device's thread holds one of the slots while it runs kernels and gives it back while it waits
// in a collective (Communicator brackets every wait with leave_slot()/reenter_slot()), so a
// single slot runs the devices one after another and can never deadlock. Results do not depend
// on the slot count or the scheduling: every collective combines its members in a fixed group
// order (communicator.h).
//
// The count is a mutex and a condition variable, not std::counting_semaphore: libstdc++ 12's
// semaphore (bits/semaphore_base.h, atomic_wait.h) reads the counter before spinning and then
// sleeps until the counter differs from that stale value, while release() wakes sleepers only when
// the counter was 0. A slot taken and given back during the spin (1 -> 0 -> 1) is a wakeup lost:
// the acquiring device sleeps beside a free slot. When every other device then waits for it in a
// collective, nothing releases again and the step hangs until the collective timeout; this
// happened once in the sanitizer tier (reports/reliability.md).
//
// Example:
//   ExecutionSlots slots(resolve_num_threads(config.get_int("num_threads")));
//   communicator.set_execution_slots(&slots);
//   // on each device's thread:
//   ExecutionSlots::Hold hold(slots);   // waits for a free slot
//   executor.compute_gradients();       // collectives give the slot back while they wait
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace tpusim {

class ExecutionSlots {
 public:
  // `count` >= 1 (std::logic_error otherwise).
  explicit ExecutionSlots(int count);

  ExecutionSlots(const ExecutionSlots&) = delete;
  ExecutionSlots& operator=(const ExecutionSlots&) = delete;

  int count() const { return count_; }

  // Takes a slot, blocking until one is free; gives it back. Calls must pair up on each thread.
  void acquire();
  void release();

  // Slots free right now (for tests).
  int available() const;

  // Holds a slot for the lifetime of the object (the scope of one device's work).
  class Hold {
   public:
    explicit Hold(ExecutionSlots& slots) : slots_(slots) { slots_.acquire(); }
    ~Hold() { slots_.release(); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    ExecutionSlots& slots_;
  };

 private:
  static constexpr int kMaxSlots = 1 << 16;
  int count_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  int free_;
};

// The slot count of the num_threads key: `configured` when positive; 0 means this host's
// hardware threads shared among the `ranks_on_host` processes of the run on it (at least 1).
int resolve_num_threads(int64_t configured, int ranks_on_host = 1);

}  // namespace tpusim
