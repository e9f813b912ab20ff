#include "sim/train/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "model/builder/layer_plan.h"
#include "model/model_dims.h"
#include "sharding/device_mesh.h"
#include "sim/functional/execution_slots.h"
#include "sim/train/train_settings.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kKiB = 1024.0;
constexpr double kFloatBytes = 4;  // the engine's values are float32 (tensor_data.h)

// "7645.66 GiB", "12.3 MiB", "96 KiB": enough digits to tell the parts of a tiny model apart.
std::string gib(double bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::ostringstream text;
  text << std::fixed;
  if (bytes >= kGiB) {
    text << std::setprecision(2) << bytes / kGiB << " GiB";
  } else if (bytes >= kMiB) {
    text << std::setprecision(1) << bytes / kMiB << " MiB";
  } else {
    text << std::setprecision(0) << bytes / kKiB << " KiB";
  }
  return text.str();
}

std::string whole_bytes(double bytes) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(0) << bytes;
  return text.str();
}

// The value of `key` ("MemAvailable:") in a "/proc/.../status"-style file, in bytes (the files
// give kB); negative when absent.
double proc_kib_field(const std::string& path, const std::string& key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream fields(line.substr(key.size()));
      double kib = -1;
      fields >> kib;
      return kib < 0 ? -1 : kib * kKiB;
    }
  }
  return -1;
}

// A cgroup file holding one number ("max" and absurdly large values, v1's "no limit", are none):
// negative when absent.
double cgroup_number(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  if (!(file >> text) || text == "max") {
    return -1;
  }
  try {
    const double value = std::stod(text);
    constexpr double kNoLimit = 1e18;  // v1 writes PAGE_COUNTER_MAX (about 9.2e18) for none
    return value >= kNoLimit ? -1 : value;
  } catch (const std::exception&) {
    return -1;
  }
}

// The cgroup's limit less its usage, and which file said so; negative when there is no limit.
std::pair<double, std::string> cgroup_room() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) {
      continue;
    }
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {  // v2: "0::/path"
      const std::string dir = "/sys/fs/cgroup" + path;
      if (const double limit = cgroup_number(dir + "/memory.max"); limit >= 0) {
        return {limit - std::max(0.0, cgroup_number(dir + "/memory.current")), "cgroup memory.max"};
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      const std::string dir = "/sys/fs/cgroup/memory" + path;
      if (const double limit = cgroup_number(dir + "/memory.limit_in_bytes"); limit >= 0) {
        return {limit - std::max(0.0, cgroup_number(dir + "/memory.usage_in_bytes")),
                "cgroup memory.limit_in_bytes"};
      }
    }
  }
  return {-1, ""};
}

// The square matrices sim/functional/kernels/attention.cpp holds for one (batch, query head) item
// of an attention op: the scores/probabilities P, the copy the matmul with v reads, and in the
// backward pass dP and dS. Measured with `/usr/bin/time -f %M` on tiny-llama, one device: 4.05
// matrices per item at once (train, max_target_length=4096: 259 MiB more resident per extra
// thread; generate, a 6000-token prompt: 556 MiB per extra thread).
constexpr double kAttentionMatricesPerItem = 4;

// The local size of `tensor`'s dim `name`, 1 without one.
double size_of(const Tensor& tensor, const char* name) {
  const int index = tensor.dim_index(name);
  return index < 0 ? 1.0 : static_cast<double>(tensor.dims[static_cast<size_t>(index)].size);
}

// Bytes the attention kernels hold beyond the program's tensors (which the memory model counts
// as flash attention's, without the length x length scores): kAttentionMatricesPerItem
// matrices of query rows x keys per item, for as many items as run at once: one per computing
// thread, at most the (batch, head) items of the process's devices. `scalar_bytes`: the
// kernels' Scalar, 8 (double) under functional_precision=reference, else 4.
double attention_scores_bytes(const StepProgram& program, double devices, double threads,
                              double scalar_bytes) {
  const Graph& graph = program.program.graph;
  double largest = 0;
  for (const Op& op : graph.ops()) {
    if (op.kind != OpKind::kAttention && op.kind != OpKind::kAttentionGrad) {
      continue;
    }
    const size_t first = op.kind == OpKind::kAttentionGrad ? 1 : 0;
    const Tensor& query = graph.tensor(op.inputs.at(first));
    const Tensor& key = graph.tensor(op.inputs.at(first + 1));
    double keys = size_of(key, "length");
    if (op.attrs.compress_ratio > 0) {  // a block of compress_ratio tokens joins the keys
      keys += std::ceil(keys / static_cast<double>(op.attrs.compress_ratio));
    }
    const double items = devices * size_of(query, "batch") * size_of(query, "heads");
    largest = std::max(largest, std::min(threads, items) * kAttentionMatricesPerItem *
                                    size_of(query, "length") * keys * scalar_bytes);
  }
  return largest;
}

// The attention kernels' Scalar in bytes: double for the fp32 reference (neither bf16 matmul
// inputs nor the fast kernels), float otherwise (attention.cpp's run_attention).
double scalar_bytes(const FunctionalSettings& numerics) {
  return numerics.bf16_matmul_inputs || numerics.fast_kernels ? kFloatBytes : 2 * kFloatBytes;
}

}  // namespace

double HostMemoryNeed::total() const {
  double sum = 0;
  for (const auto& part : parts) {
    sum += part.second;
  }
  return sum;
}

std::string HostMemoryNeed::describe() const {
  std::string text = gib(total()) + " (";
  for (size_t index = 0; index < parts.size(); ++index) {
    text += (index > 0 ? ", " : "") + parts[index].first + " " + gib(parts[index].second);
  }
  return text + ")";
}

HostMemoryAvailable available_host_memory() {
  HostMemoryAvailable available;
  available.bytes = proc_kib_field("/proc/meminfo", "MemAvailable:");
  available.limited_by = "MemAvailable";
  if (available.bytes < 0) {
    available.bytes = std::numeric_limits<double>::infinity();
    available.limited_by = "no MemAvailable in /proc/meminfo";
  }
  if (const auto [room, source] = cgroup_room(); room >= 0 && room < available.bytes) {
    available = {room, source};
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const double mapped = std::max(0.0, proc_kib_field("/proc/self/status", "VmSize:"));
    const double room = std::max(0.0, static_cast<double>(limit.rlim_cur) - mapped);
    if (room < available.bytes) {
      available = {room, "RLIMIT_AS (ulimit -v) less the " + gib(mapped) + " already mapped"};
    }
  }
  return available;
}

MemoryBreakdown engine_bytes_per_device(const StepProgram& program) {
  StepProgram host = program;
  Graph& graph = host.program.graph;
  for (size_t id = 0; id < graph.tensors().size(); ++id) {
    graph.mutable_tensor(static_cast<TensorId>(id)).dtype = DType::kF32;
  }
  return estimate_memory(host, MechanismSet::without({"in_place_buffers"})).at_peak;
}

HostMemoryNeed training_host_memory(const Config& config, const HostMemoryOptions& options,
                                    const Transport& transport) {
  const StepProgram program = build_step_program(config, MechanismSet(), train_layer_order(config));
  const std::vector<int> owner =
      assign_devices_to_ranks(physical_devices_of_mesh(program.mesh, program.slice),
                              transport.num_ranks(), program.slice.name);
  const auto devices =
      static_cast<double>(std::count(owner.begin(), owner.end(), transport.rank()));
  const MemoryBreakdown device = engine_bytes_per_device(program);
  const FunctionalSettings numerics = FunctionalSettings::from_config(config);
  const auto threads =
      static_cast<double>(resolve_num_threads(numerics.num_threads, transport.ranks_on_host()));
  HostMemoryNeed need;
  const double activations =
      device.saved_activations + device.gathered_weights + device.temporaries;
  // Beyond the live values the memory model counts, the engine (sim/functional/executor.cpp)
  // sums each microbatch's parameter gradients into a copy of them (Executor::accumulated_, as
  // large as the weights in float32), and keeps released buffers for reuse up to its largest live
  // set (Executor::recycle): about one more working set of activations.
  need.parts = {{"weights", devices * device.weights},
                {"optimizer state", devices * device.optimizer_state},
                {"gradients", devices * device.gradients},
                {"gradient sums", devices * device.weights},
                {"activations", devices * activations},
                {"buffers kept for reuse", devices * activations},
                {"attention scores",
                 attention_scores_bytes(program, devices, threads, scalar_bytes(numerics))}};
  if (!options.verify && !options.checkpoint_staging) {
    return need;
  }
  // The unsharded model: the --verify reference, and the size of the global arrays a checkpoint
  // is gathered into and encoded from (two copies).
  const StepProgram whole_program = build_step_program(unsharded_reference_config(config),
                                                       MechanismSet(), train_layer_order(config));
  const MemoryBreakdown whole = engine_bytes_per_device(whole_program);
  if (options.verify && transport.rank() == 0) {
    // The reference runs in functional_precision=reference: its attention in double.
    need.parts.emplace_back(
        "--verify reference",
        whole.total() + attention_scores_bytes(whole_program, 1, threads, 2 * kFloatBytes));
  }
  if (options.checkpoint_staging && transport.rank() == 0) {
    const double state =
        whole.weights + (options.optimizer_in_checkpoint ? whole.optimizer_state : 0);
    need.parts.emplace_back("checkpoint staging", 2 * state);
  }
  return need;
}

double kv_cache_host_bytes(const Config& config, int64_t sequences, int64_t length) {
  const ModelDims dims = ModelDims::from_config(config);
  const bool mla = dims.attention_type == "mla" || dims.family().always_mla();
  const double per_position = mla ? static_cast<double>(dims.kv_lora_rank + dims.qk_rope_head_dim)
                                  : 2.0 * static_cast<double>(dims.num_kv_heads * dims.head_dim);
  return kFloatBytes * per_position * static_cast<double>(dims.num_layers) *
         static_cast<double>(sequences) * static_cast<double>(length);
}

std::string require_host_memory(const HostMemoryNeed& need, const std::string& command,
                                int ranks_on_host) {
  const HostMemoryAvailable available = available_host_memory();
  const double needed = need.total() * std::max(1, ranks_on_host);
  const std::string ranks =
      ranks_on_host > 1 ? " x " + std::to_string(ranks_on_host) + " ranks on this host" : "";
  if (needed > available.bytes) {
    throw UserError("host memory: " + command + " needs " + whole_bytes(needed) + " bytes (" +
                    need.describe() + ranks + ") but " + whole_bytes(available.bytes) + " bytes (" +
                    gib(available.bytes) + ") are available (" + available.limited_by +
                    "); nothing was allocated: use a smaller model, batch or "
                    "max_target_length, or more mpirun ranks on more hosts");
  }
  return "host memory: " + need.describe() + ranks + " of " + gib(available.bytes) +
         " available (" + available.limited_by + ")";
}

}  // namespace tpusim
