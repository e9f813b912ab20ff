// functional_precision=fast against the reference numerics, and its determinism.
//  (1) One training step with the fast kernels (fp32 GEMMs and attention) equals the reference
//      (double accumulation) within fp32 rounding: loss, every gradient, updated weight and Adam
//      moment within relative L2 1e-5, on one device and sharded (which lays the einsum operands
//      out differently: used in place, transposed or packed).
//  (2) The fast step is bitwise the same run to run and for any num_threads, whether the threads
//      run several devices or work inside one device's kernels.
//  (3) KernelThreads runs every item exactly once and passes an item's exception on.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"
#include "sim/functional/kernel_threads.h"
#include "tests/support/one_step.h"

namespace tpusim {
namespace {

constexpr double kTolerance = 1e-5;

Config config_of(const std::vector<std::string>& base, const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = base;
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return Config::load("", overrides);
}

// 256 tokens per device step: the einsums' row dims span several blocks (kernels/einsum.cpp).
const std::vector<std::vector<std::string>>& cases() {
  static const std::vector<std::vector<std::string>> all = {
      {"model_name=tiny-llama", "compile_topology=v5e-1", "per_device_batch_size=4",
       "max_target_length=64"},
      {"model_name=tiny-llama", "compile_topology=v5e-4", "per_device_batch_size=2",
       "max_target_length=64", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"},
      {"model_name=tiny-gpt3", "compile_topology=v5e-1", "per_device_batch_size=4",
       "max_target_length=64"},
      {"model_name=tiny-mla", "compile_topology=v5e-4", "per_device_batch_size=2",
       "max_target_length=32", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"},
  };
  return all;
}

std::string describe(const std::vector<std::string>& overrides) {
  std::string text;
  for (const std::string& item : overrides) {
    text += item + " ";
  }
  return text;
}

TEST(FastKernels, MatchReferenceWithinFp32Rounding) {
  for (const std::vector<std::string>& overrides : cases()) {
    SCOPED_TRACE(describe(overrides));
    const testing::OneStep fast =
        testing::run_one_step(config_of(overrides, {"functional_precision=fast"}));
    const testing::OneStep reference =
        testing::run_one_step(config_of(overrides, {"functional_precision=reference"}));
    EXPECT_NEAR(fast.loss, reference.loss, kTolerance * reference.loss);
    std::string worst;
    EXPECT_LE(testing::worst_relative_difference(fast.gradients, reference.gradients, &worst),
              kTolerance)
        << worst;
    // The updated weights and Adam moments (the fast AdamW runs in fp32 too).
    EXPECT_LE(testing::worst_relative_difference(fast.state, reference.state, &worst), kTolerance)
        << worst;
    // The fast path does compute differently (else this test would compare a path with itself).
    EXPECT_NE(fast.gradients, reference.gradients);
  }
}

TEST(FastKernels, BitwiseSameRunToRunAndForAnyThreadCount) {
  for (const std::vector<std::string>& overrides : cases()) {
    SCOPED_TRACE(describe(overrides));
    const testing::OneStep first =
        testing::run_one_step(config_of(overrides, {"functional_precision=fast", "num_threads=1"}));
    for (const char* threads :
         {"num_threads=1", "num_threads=2", "num_threads=3", "num_threads=8"}) {
      SCOPED_TRACE(threads);
      const testing::OneStep again =
          testing::run_one_step(config_of(overrides, {"functional_precision=fast", threads}));
      EXPECT_EQ(again.loss, first.loss);
      EXPECT_EQ(again.gradients, first.gradients);
      EXPECT_EQ(again.state, first.state);
    }
  }
}

TEST(KernelThreads, RunsEveryItemOnceAndRethrows) {
  for (const int count : {1, 2, 4}) {
    KernelThreads threads(count);
    EXPECT_EQ(threads.count(), count);
    for (const int64_t items : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(items));
      threads.parallel_for(items, [&](int64_t item) { ++runs[static_cast<size_t>(item)]; });
      for (const std::atomic<int>& run : runs) {
        EXPECT_EQ(run.load(), 1);
      }
    }
    std::atomic<int> ran{0};
    EXPECT_THROW(threads.parallel_for(10,
                                      [&](int64_t item) {
                                        ++ran;
                                        if (item == 3) {
                                          throw std::runtime_error("item 3");
                                        }
                                      }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 10);
  }
  EXPECT_THROW(KernelThreads(0), std::logic_error);
}

}  // namespace
}  // namespace tpusim
