#include "sim/functional/kernel_threads.h"

#include <stdexcept>
#include <string>

namespace tpusim {

KernelThreads::KernelThreads(int count) {
  if (count < 1) {
    throw std::logic_error("KernelThreads: " + std::to_string(count) + " threads");
  }
  for (int index = 1; index < count; ++index) {
    helpers_.emplace_back([this] { work(); });
  }
}

KernelThreads::~KernelThreads() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& helper : helpers_) {
    helper.join();
  }
}

// Takes items until none are left (called with the lock not held).
void KernelThreads::run_items() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (next_ < items_) {
    const int64_t item = next_++;
    const std::function<void(int64_t)>& body = *body_;
    lock.unlock();
    std::exception_ptr error;
    try {
      body(item);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) {
      error_ = error;
    }
    if (++done_ == items_) {
      finished_.notify_all();
    }
  }
}

void KernelThreads::work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) {
        return;
      }
      seen = generation_;
    }
    run_items();
  }
}

void KernelThreads::parallel_for(int64_t items, const std::function<void(int64_t)>& body) {
  if (items <= 0) {
    return;
  }
  if (helpers_.empty() || items == 1) {
    tpusim::parallel_for(nullptr, items, body);
    return;
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    items_ = items;
    next_ = 0;
    done_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_items();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return done_ == items_; });
    error = error_;
    // Helpers that wake late find next_ == items_ and take nothing.
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

void parallel_for(KernelThreads* threads, int64_t items, const std::function<void(int64_t)>& body) {
  if (threads != nullptr) {
    threads->parallel_for(items, body);
    return;
  }
  std::exception_ptr error;
  for (int64_t item = 0; item < items; ++item) {
    try {
      body(item);
    } catch (...) {
      if (!error) {
        error = std::current_exception();
      }
    }
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

}  // namespace tpusim
