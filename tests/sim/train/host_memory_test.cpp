// tests/sim/train/host_memory_test.cpp: the host-memory pre-flight (sim/train/host_memory.h)
// against what the functional engine really allocates, counted by this executable's own
// operator new and delete (every std::vector of the engine goes through them), and the
// available-memory reading under a lowered RLIMIT_AS.
//
// Its own executable: the counting operator new would otherwise count every other test too.
#include "sim/train/host_memory.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/config.h"
#include "sim/train/dataset.h"
#include "sim/train/sharded_model.h"

namespace {

std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};

// Each block carries its size in a header (asking the allocator would call back into operator
// new under tcmalloc).
constexpr size_t kHeader = alignof(std::max_align_t);

void* counted_allocation(size_t size) {
  auto* block = static_cast<char*>(std::malloc(size + kHeader));
  if (block == nullptr) {
    throw std::bad_alloc();
  }
  *reinterpret_cast<size_t*>(block) = size;
  const int64_t now = live_bytes.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
  return block + kHeader;
}

void counted_free(void* pointer) {
  if (pointer != nullptr) {
    char* block = static_cast<char*>(pointer) - kHeader;
    live_bytes.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(block)));
    std::free(block);
  }
}

}  // namespace

void* operator new(size_t size) {
  return counted_allocation(size);
}
void* operator new[](size_t size) {
  return counted_allocation(size);
}
void operator delete(void* pointer) noexcept {
  counted_free(pointer);
}
void operator delete[](void* pointer) noexcept {
  counted_free(pointer);
}
void operator delete(void* pointer, size_t) noexcept {
  counted_free(pointer);
}
void operator delete[](void* pointer, size_t) noexcept {
  counted_free(pointer);
}

namespace tpusim {
namespace {

// Bytes the engine allocated over two training steps of `config` (build, initialize, then
// gradients and update twice: the buffers it keeps for reuse are there from the second), above
// what was live before.
int64_t measured_step_bytes(const Config& config) {
  const int64_t before = live_bytes.load();
  peak_bytes.store(before);
  {
    ShardedModel model(config);
    std::vector<Batch> batches;
    const Dataset data = Dataset::from_config(config);
    for (int64_t micro = 0; micro < model.program().accumulation_steps; ++micro) {
      batches.push_back(data.train_batch(0, micro, model.program().microbatch));
    }
    for (int64_t step = 1; step <= 2; ++step) {
      model.compute_gradients(batches);
      model.apply_update(DeviceContext::Optimizer{.learning_rate = 1e-3, .step = step});
    }
  }
  return peak_bytes.load() - before;
}

// The pre-flight's need against the engine's allocations on tiny models, one device and sharded,
// with microbatches and a chunked head: the estimate is within 15% (the memory model matches the
// engine's live bytes within 10%, tests/sim/interpreters_agree_test.cpp; the rest is the engine's
// bookkeeping and the buffers it keeps for reuse).
TEST(HostMemory, NeedMatchesWhatTheEngineAllocates) {
  const std::vector<std::vector<std::string>> runs = {
      {"compile_topology=v5e-1"},
      {"compile_topology=v5e-4", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"},
      {"compile_topology=v5e-1", "gradient_accumulation_steps=2"},
      {"compile_topology=v5e-4", "ici_fsdp_parallelism=4", "num_vocab_tiling=2"}};
  for (const std::vector<std::string>& run : runs) {
    // Wider than the tiny preset, so that the tensors outweigh the program's own bookkeeping.
    std::vector<std::string> overrides = {"model_name=tiny-llama",  "override_model_config=true",
                                          "base_emb_dim=256",       "base_mlp_dim=1024",
                                          "vocab_size=4096",        "max_target_length=128",
                                          "per_device_batch_size=2"};
    overrides.insert(overrides.end(), run.begin(), run.end());
    const Config config = Config::load("", overrides);
    SCOPED_TRACE(run.back());
    const LocalTransport transport;
    const HostMemoryNeed need = training_host_memory(config, {}, transport);
    const int64_t measured = measured_step_bytes(config);
    std::cout << "  " << run.back() << ": measured " << measured << " B, need " << need.total()
              << " B (" << need.describe() << "), ratio "
              << static_cast<double>(measured) / need.total() << "\n";
    EXPECT_NEAR(static_cast<double>(measured) / need.total(), 1.0, 0.15);
  }
}

// --verify adds the unsharded reference; checkpoints add their staging copies: both grow the need.
TEST(HostMemory, VerifyAndCheckpointsAddTheirCopies) {
  const Config config = Config::load(
      "", {"model_name=tiny-llama", "compile_topology=v5e-4", "ici_fsdp_parallelism=4"});
  const LocalTransport transport;
  const double plain = training_host_memory(config, {}, transport).total();
  const HostMemoryNeed verify = training_host_memory(config, {.verify = true}, transport);
  EXPECT_GT(verify.total(), plain);
  EXPECT_EQ(verify.parts.back().first, "--verify reference");
  const HostMemoryNeed staged =
      training_host_memory(config, {.checkpoint_staging = true}, transport);
  EXPECT_EQ(staged.parts.back().first, "checkpoint staging");
  // Weights and two Adam moments of the whole model, twice: 2 x 3 x 4 bytes per parameter.
  const HostMemoryNeed weights_only = training_host_memory(
      config, {.checkpoint_staging = true, .optimizer_in_checkpoint = false}, transport);
  EXPECT_NEAR(staged.parts.back().second / weights_only.parts.back().second, 3.0, 1e-9);
}

// The attention kernels hold length x length matrices per (batch, head) item beyond the
// program's tensors: P, the copy the matmul with v reads, dP and dS, 4 of them (resident memory
// of `tpusim train model_name=tiny-llama max_target_length=4096` grew by 259 MiB per extra
// thread, 4 x 4096^2 x 4 bytes = 256 MiB). Without them a 30000-token `generate` prompt was
// allowed 0.3 GiB, then killed by the OOM killer at 24 GB.
TEST(HostMemory, CountsTheAttentionScoreMatrices) {
  auto scores = [](const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"model_name=tiny-llama", "compile_topology=v5e-1",
                                          "per_device_batch_size=1", "max_target_length=4096"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    const LocalTransport transport;
    const HostMemoryNeed need =
        training_host_memory(Config::load("", overrides), {.verify = true}, transport);
    double bytes = 0;
    for (const auto& [name, part] : need.parts) {
      bytes += name == "attention scores" ? part : 0;
    }
    return bytes;
  };
  constexpr double kMatrix = 4096.0 * 4096.0 * 4;  // float32
  EXPECT_DOUBLE_EQ(scores({"num_threads=1"}), 4 * kMatrix);
  EXPECT_DOUBLE_EQ(scores({"num_threads=2"}), 2 * 4 * kMatrix);  // two (batch, head) items
  EXPECT_DOUBLE_EQ(scores({"num_threads=1", "functional_precision=reference"}), 2 * 4 * kMatrix);
  // tiny-llama has 4 query heads: no more than 4 items of its one sequence run at once.
  EXPECT_DOUBLE_EQ(scores({"num_threads=16"}), 4 * 4 * kMatrix);
}

// A KV cache: keys and values of every layer, kv heads x head_dim each, in float32. tiny-llama
// (configs/models/tiny-llama.yml): 2 layers, 2 kv heads of 16.
TEST(HostMemory, KvCacheBytes) {
  const Config config = Config::load("", {"model_name=tiny-llama"});
  EXPECT_DOUBLE_EQ(kv_cache_host_bytes(config, 3, 100), 4.0 * 2 * 2 * 2 * 16 * 3 * 100);
}

// Under a soft RLIMIT_AS a little above what the process maps, the room left is what is available
// (and the need beyond it is refused, naming both numbers in bytes).
TEST(HostMemory, AvailableFollowsRlimitAs) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  const HostMemoryAvailable unlimited = available_host_memory();
  EXPECT_GT(unlimited.bytes, 0);
  std::string status;
  {
    std::ostringstream text;
    text << std::ifstream("/proc/self/status").rdbuf();
    status = text.str();
  }
  const size_t at = status.find("VmSize:");
  ASSERT_NE(at, std::string::npos);
  const double mapped = std::stod(status.substr(at + 7)) * 1024;
  constexpr double kRoom = 512.0 * 1024 * 1024;
  rlimit lowered = saved;
  lowered.rlim_cur = static_cast<rlim_t>(mapped + kRoom);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);
  const HostMemoryAvailable limited = available_host_memory();
  HostMemoryNeed need;
  need.parts = {{"weights", 2 * kRoom}};
  std::string message;
  try {
    require_host_memory(need, "train of test");
  } catch (const UserError& error) {
    message = error.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  EXPECT_LE(limited.bytes, kRoom);
  EXPECT_GT(limited.bytes, kRoom / 2);  // the test itself maps a little between the two readings
  EXPECT_NE(limited.limited_by.find("RLIMIT_AS"), std::string::npos) << limited.limited_by;
  EXPECT_NE(message.find("needs 1073741824 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("RLIMIT_AS"), std::string::npos) << message;
}

}  // namespace
}  // namespace tpusim
