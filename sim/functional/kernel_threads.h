// sim/functional/kernel_threads.h: threads inside one simulated device's kernels.
//
// When a process simulates fewer devices than num_threads allows, each device gets a share of
// the rest as helper threads: its big kernels (einsum GEMMs, attention) split their work into
// parallel_for items. Results never depend on the thread count: a kernel cuts its work into items
// by the shapes alone, each item computes the same thing on whichever thread runs it, and no item
// reduces into another's output.
//
// Example:
//   KernelThreads threads(4);                       // the calling thread + 3 helpers
//   threads.parallel_for(items, [&](int64_t item) { ... });   // returns when all are done
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tpusim {

class KernelThreads {
 public:
  // `count` >= 1 threads work on a parallel_for: the caller and count - 1 helpers.
  explicit KernelThreads(int count);
  ~KernelThreads();
  KernelThreads(const KernelThreads&) = delete;
  KernelThreads& operator=(const KernelThreads&) = delete;

  int count() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs body(0..items-1), each once, on the caller and the helpers; returns when every item is
  // done. An exception from an item is rethrown here (the first one; the other items still run).
  // One parallel_for at a time per object (a device's kernels run one after another).
  void parallel_for(int64_t items, const std::function<void(int64_t)>& body);

 private:
  void work();
  void run_items();

  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t items_ = 0;
  int64_t next_ = 0;
  int64_t done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// parallel_for on `threads`, or a plain loop without them.
void parallel_for(KernelThreads* threads, int64_t items, const std::function<void(int64_t)>& body);

}  // namespace tpusim
