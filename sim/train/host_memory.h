// sim/train/host_memory.h: the host memory `tpusim train`, `eval` and `generate` will allocate,
// computed and checked before anything large is allocated (the pre-flight).
//
// The functional engine holds every value in float32, whatever the IR dtype (tensor_data.h), and
// frees each one after its last reader (sim/memory/liveness.h). So what it allocates for one device
// is what the memory model (sim/memory/memory_model.h) charges for the same per-device program with
// every tensor made float32 and without in-place buffers (the engine writes each output to a new
// buffer): weights, Adam moments, gradients, saved activations, gathered weights and temporaries.
// Beyond those live values the engine keeps a float32 sum of each parameter's gradient over the
// microbatches and the buffers it released, for reuse, up to its largest live set (about one more
// working set of activations). A process executes its block of the mesh's devices, each with its
// own copy of that per-device state. On top of that: the unsharded reference of --verify, the
// global copies a checkpoint is staged through (gathered, then encoded), for decoding a KV cache
// (kv_cache_host_bytes), and the attention kernels' length x length score matrices (P, dP, dS:
// about 4 per (batch, head) item, one item per computing thread), which the memory model, counting
// flash attention, leaves out: 256 MiB per thread at max_target_length=4096.
//
// What is available is the smallest of MemAvailable (/proc/meminfo), the cgroup's limit less its
// usage (v2 memory.max - memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes) and,
// when set (ulimit -v), RLIMIT_AS less the address space the process already maps (VmSize). Under
// mpirun the ranks on one host share it.
//
// Example:
//   const HostMemoryNeed need = training_host_memory(config, {.verify = true}, transport);
//   std::cerr << require_host_memory(need, "train") << "\n";  // UserError when it does not fit
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "sharding/step_program.h"
#include "sim/memory/memory_model.h"
#include "sim/transport/transport.h"

namespace tpusim {

// Bytes by what holds them, for the message.
struct HostMemoryNeed {
  std::vector<std::pair<std::string, double>> parts;  // ("weights", bytes), ...
  double total() const;
  // "1.25 GiB (weights 0.50 GiB, gradients 0.25 GiB, ...)".
  std::string describe() const;
};

struct HostMemoryAvailable {
  double bytes = 0;
  std::string limited_by;  // "MemAvailable", "cgroup memory.max", "RLIMIT_AS (ulimit -v)"
};

HostMemoryAvailable available_host_memory();

// What the functional engine allocates for ONE device running `program` (float32 everywhere, no
// in-place buffers), by the memory model's categories at its peak.
MemoryBreakdown engine_bytes_per_device(const StepProgram& program);

struct HostMemoryOptions {
  bool verify = false;                  // the unsharded reference beside the run
  bool checkpoint_staging = false;      // checkpoints saved or loaded: global copies of the weights
  bool optimizer_in_checkpoint = true;  // ... and of the Adam moments
};

// What `tpusim train` (and `eval`, which runs the same step program) allocates in this process:
// the devices `transport` gives this rank, times engine_bytes_per_device, plus the options'.
HostMemoryNeed training_host_memory(const Config& config, const HostMemoryOptions& options,
                                    const Transport& transport);

// A decoding KV cache in float32: keys and values of every layer for `sequences` x `length`
// positions (per kv head x head_dim; MLA: the latent kv_lora_rank + qk_rope_head_dim).
double kv_cache_host_bytes(const Config& config, int64_t sequences, int64_t length);

// The line that says the need and what is available ("host memory: 1.25 GiB (...) of 20.00 GiB
// available (MemAvailable)"); UserError naming both, in bytes, when the need (times the ranks on
// this host) exceeds what is available. `command` names the run in the message ("train of
// llama3.1-405b on v5e-1").
std::string require_host_memory(const HostMemoryNeed& need, const std::string& command,
                                int ranks_on_host = 1);

}  // namespace tpusim
