#include "sim/functional/execution_slots.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

namespace tpusim {

ExecutionSlots::ExecutionSlots(int count) : count_(count), free_(count) {
  if (count < 1 || count > kMaxSlots) {
    throw std::logic_error("ExecutionSlots: " + std::to_string(count) + " slots (1.." +
                           std::to_string(kMaxSlots) + ")");
  }
}

void ExecutionSlots::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  freed_.wait(lock, [this] { return free_ > 0; });
  --free_;
}

void ExecutionSlots::release() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++free_;
  }
  freed_.notify_one();
}

int ExecutionSlots::available() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return free_;
}

int resolve_num_threads(int64_t configured, int ranks_on_host) {
  if (configured > 0) {
    return static_cast<int>(configured);
  }
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hardware / std::max(1, ranks_on_host));
}

}  // namespace tpusim
