#include "sim/explore/search_space.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <sstream>
#include <string_view>

#include "common/error.h"
#include "hw/chip_spec.h"
#include "model/autodiff/remat_policy.h"
#include "model/autodiff/training_step.h"
#include "model/batch_plan.h"
#include "model/config.h"
#include "sharding/device_mesh.h"
#include "sharding/step_program.h"

namespace tpusim {
namespace {

constexpr const char* kCommandLine = "command line";

// A limit as the user would write it (0.25, 1e+309 -> inf), for messages.
std::string format_number(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

// The mesh axes the explorer factorizes the devices over (MaxText's parallelism axes). The stage
// axis is not factorized here: explore() searches pipeline schedules one at a time, each with
// its stage count pinned (sim/explore/explorer.h).
const std::vector<std::string> kIciSearchAxes = {
    "data", "fsdp", "fsdp_transpose", "tensor", "tensor_sequence", "context", "expert"};
const std::vector<std::string> kDcnSearchAxes = {"data", "fsdp"};

// Named policies searched when remat_policy is free. The *_quantization ones only differ from
// their base policy with quantized matmuls, and "custom" needs per-tensor choices.
const std::vector<std::string> kNamedRematPolicies = {"none",
                                                      "minimal_with_context",
                                                      "minimal",
                                                      "save_dot_with_context_except_mlp",
                                                      "save_dot_except_mlp",
                                                      "save_dot_except_mlpwi",
                                                      "save_qkv_proj",
                                                      "save_out_proj",
                                                      "qkv_proj_offloaded",
                                                      "minimal_offloaded",
                                                      "full"};

const std::vector<int64_t> kFlashBlockSizes = {512, 1024, 2048};

// What the search reads from the config: the keys the user gave on the command line (pinned:
// kept as they are) and the values of the keys the search starts from.
struct SearchKeys {
  std::set<std::string, std::less<>> pinned;
  double per_device_batch_size = 0;
  int64_t gradient_accumulation_steps = 1;
  std::string remat_policy;
  int64_t ici_pipeline_stages = 1;  // ici_pipeline_parallelism
  int64_t dcn_pipeline_stages = 1;  // dcn_pipeline_parallelism
  int64_t pipeline_microbatches = -1;
  bool delay_activation_forwarding = false;
  std::string attention;
  int64_t max_target_length = 0;
  int64_t sa_block_q = 0;
  int64_t sa_block_kv = 0;
  std::string sparse_core_collective_offload;
  bool collective_matmul = false;

  bool is_pinned(std::string_view key) const { return pinned.contains(key); }
};

SearchKeys search_keys_from_config(const Config& config) {
  SearchKeys keys;
  for (const std::string& key : config.keys()) {
    if (config.origin(key) == kCommandLine) {
      keys.pinned.insert(key);
    }
  }
  keys.per_device_batch_size = config.get_float("per_device_batch_size");
  keys.gradient_accumulation_steps = config.get_int("gradient_accumulation_steps");
  keys.remat_policy = config.get_string("remat_policy");
  keys.ici_pipeline_stages = config.get_int("ici_pipeline_parallelism");
  keys.dcn_pipeline_stages = config.get_int("dcn_pipeline_parallelism");
  keys.pipeline_microbatches = config.get_int("num_pipeline_microbatches");
  keys.delay_activation_forwarding = config.get_bool("pipeline_delay_activation_forwarding");
  keys.attention = config.get_string("attention");
  keys.max_target_length = config.get_int("max_target_length");
  keys.sa_block_q = config.get_int("sa_block_q");
  keys.sa_block_kv = config.get_int("sa_block_kv");
  keys.sparse_core_collective_offload = config.get_string("sparse_core_collective_offload");
  keys.collective_matmul = config.get_bool("collective_matmul");
  return keys;
}

// A mesh axis key's value (1 when the schema has no such key), read when the search reaches it so
// that a bad value is refused in the order estimate refuses it.
int64_t axis_value_from_config(const Config& config, bool dcn, int axis) {
  const std::string key = mesh_axis_key(dcn, mesh_axis_names()[static_cast<size_t>(axis)]);
  return config.has(key) ? mesh_axis_value_from_config(config, dcn, axis) : 1;
}

// Every way to write `remaining` as an ordered product over `axes` (sizes >= 1), into `out`.
void factorize(int remaining, const std::vector<int>& axes, size_t index, bool dcn,
               MeshShape& current, std::vector<MeshShape>& out) {
  if (index == axes.size()) {
    if (remaining == 1) {
      out.push_back(current);
    }
    return;
  }
  auto& sizes = dcn ? current.dcn : current.ici;
  const size_t axis = static_cast<size_t>(axes[index]);
  for (int size = 1; size <= remaining; ++size) {
    if (remaining % size == 0) {
      sizes[axis] = size;
      factorize(remaining / size, axes, index + 1, dcn, current, out);
    }
  }
  sizes[axis] = 1;
}

// Sizes of the pinned axes of one group (ici or dcn); searched axes start at 1. Returns the
// product the searched axes must make. UserError when the pins contradict the slice.
int pin_axes(const Config& config, const SearchKeys& given, bool dcn,
             const std::vector<std::string>& searchable, int total,
             std::array<int, kNumMeshAxes>& sizes, std::vector<int>& searched,
             std::vector<std::string>& searched_keys) {
  long long pinned_product = 1;
  std::string pinned_text;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    const std::string& name = mesh_axis_names()[static_cast<size_t>(axis)];
    const std::string key = mesh_axis_key(dcn, name);
    const bool can_search =
        std::find(searchable.begin(), searchable.end(), name) != searchable.end();
    // The same check as estimate's (sharding/mesh.h): 0, -3 or 2^32 is an error, not a divisor.
    const int64_t value = axis_value_from_config(config, dcn, axis);
    if (can_search && (!given.is_pinned(key) || value == -1)) {
      searched.push_back(axis);
      searched_keys.push_back(key);
      sizes[static_cast<size_t>(axis)] = 1;
      continue;
    }
    // Axes the explorer does not search keep their value; MaxText's default -1 (fill) there
    // means 1 once the searched axes take the devices.
    const int size = value == -1 ? 1 : static_cast<int>(value);
    sizes[static_cast<size_t>(axis)] = size;
    if (size > 1) {
      pinned_product *= size;
      if (pinned_product > total) {
        throw UserError("explore: pinned " + pinned_text + (pinned_text.empty() ? "" : " x ") +
                            key + "=" + std::to_string(size) + " is more than the " +
                            std::to_string(total) + (dcn ? " slices" : " devices of a slice"),
                        key);
      }
      pinned_text += (pinned_text.empty() ? "" : " x ") + key + "=" + std::to_string(size);
    }
  }
  if (total % pinned_product != 0) {
    throw UserError("explore: pinned " + pinned_text + " (" + std::to_string(pinned_product) +
                    ") does not divide the " + std::to_string(total) +
                    (dcn ? " slices" : " devices of a slice"));
  }
  if (searched.empty() && pinned_product != total) {
    throw UserError("explore: pinned " + (pinned_text.empty() ? std::string("mesh") : pinned_text) +
                    " makes " + std::to_string(pinned_product) + ", not the " +
                    std::to_string(total) + (dcn ? " slices" : " devices of a slice"));
  }
  return static_cast<int>(total / pinned_product);
}

std::vector<BatchChoice> batch_choices(const SearchKeys& given, const ExploreLimits& limits,
                                       int devices, std::vector<std::string>& searched_keys) {
  const bool batch_pinned = given.is_pinned("per_device_batch_size");
  const bool accumulation_pinned = given.is_pinned("gradient_accumulation_steps");
  const double pinned_batch = given.per_device_batch_size;
  const int64_t pinned_accumulation = given.gradient_accumulation_steps;
  std::vector<BatchChoice> choices;
  auto add = [&](double per_device, int64_t accumulation) {
    const BatchPlan plan = plan_batch(per_device, devices, accumulation);
    if (plan.microbatch < 1 || !plan.whole) {
      return;  // explore proposes only batches of whole sequences
    }
    choices.push_back({per_device, accumulation, plan.microbatch, plan.loaded_microbatch});
  };
  if (limits.global_batch_size > 0) {
    const int64_t global = limits.global_batch_size;
    for (int64_t accumulation = 1; accumulation <= limits.max_accumulation_steps; ++accumulation) {
      if (global % accumulation != 0 ||
          (accumulation_pinned && accumulation != pinned_accumulation)) {
        continue;
      }
      // global / accumulation is exact: accumulation divides global (checked above).
      const double per_device =
          static_cast<double>(global / accumulation) /  // NOLINT(bugprone-integer-division)
          static_cast<double>(devices);
      if (per_device > limits.max_per_device_batch + 1e-12 ||
          (batch_pinned && std::abs(per_device - pinned_batch) > 1e-12)) {
        continue;
      }
      add(per_device, accumulation);
    }
    if (choices.empty()) {
      std::ostringstream why;
      why << "explore: no batch gives global_batch_size " << global << " on " << devices
          << " devices";
      if (batch_pinned) {
        why << " with the pinned per_device_batch_size=" << pinned_batch;
      }
      if (accumulation_pinned) {
        why << " with the pinned gradient_accumulation_steps=" << pinned_accumulation;
      }
      why << " (per_device_batch_size <= " << limits.max_per_device_batch
          << ", gradient_accumulation_steps <= " << limits.max_accumulation_steps << ")";
      throw UserError(why.str());
    }
    if (!accumulation_pinned) {
      searched_keys.emplace_back("gradient_accumulation_steps");
    }
  } else if (batch_pinned) {
    add(pinned_batch, pinned_accumulation);
    if (choices.empty()) {
      throw UserError("per_device_batch_size: " + std::to_string(pinned_batch) + " x " +
                      std::to_string(devices) + " devices is not a whole number of sequences");
    }
  } else {
    // Powers of two from the smallest that gives one sequence per microbatch.
    for (double per_device = 1.0 / 64; per_device <= limits.max_per_device_batch + 1e-12;
         per_device *= 2) {
      add(per_device, pinned_accumulation);
    }
    if (choices.empty()) {
      throw UserError("explore: no per_device_batch_size up to " +
                      format_number(limits.max_per_device_batch) + " gives a whole sequence on " +
                      std::to_string(devices) + " devices");
    }
    searched_keys.emplace_back("per_device_batch_size");
  }
  std::sort(choices.begin(), choices.end(),
            [](const BatchChoice& a, const BatchChoice& b) { return a.microbatch < b.microbatch; });
  return choices;
}

// Checkpoint names of this model's decoder layers (what custom per-tensor keys can act on).
std::vector<std::string> model_checkpoint_names(const Config& config) {
  const TrainingStep step = build_training_step(config, 1);
  std::set<std::string> present;
  for (const Tensor& tensor : step.graph.tensors()) {
    if (!tensor.remat_name.empty()) {
      present.insert(tensor.remat_name);
    }
  }
  std::vector<std::string> names;
  for (const std::string& name : checkpoint_names()) {
    if (present.count(name) > 0) {
      names.push_back(name);
    }
  }
  return names;
}

// The model's per-tensor remat keys of a custom policy: those given on the command line with
// their value (`fixed`), the others searched (`free`).
void custom_tensors_from_config(const Config& config, const SearchKeys& given,
                                std::vector<std::pair<std::string, std::string>>& fixed,
                                std::vector<std::string>& free,
                                std::vector<std::string>& searched_keys) {
  for (const std::string& name : model_checkpoint_names(config)) {
    if (given.is_pinned(name)) {
      fixed.emplace_back(name, config.get_string(name));
    } else {
      free.push_back(name);
      searched_keys.push_back(name);
    }
  }
}

std::vector<RematChoice> remat_choices(const Config& config, const SearchKeys& given,
                                       std::vector<std::string>& searched_keys) {
  const std::string& policy = given.remat_policy;
  if (!given.is_pinned("remat_policy")) {
    std::vector<RematChoice> choices;
    choices.reserve(kNamedRematPolicies.size());
    for (const std::string& name : kNamedRematPolicies) {
      choices.push_back({name, {}});
    }
    searched_keys.emplace_back("remat_policy");
    return choices;
  }
  if (policy != "custom") {
    return {{policy, {}}};
  }
  // Custom: every combination of the tensors the user left free.
  std::vector<std::pair<std::string, std::string>> fixed;
  std::vector<std::string> free;
  custom_tensors_from_config(config, given, fixed, free, searched_keys);
  constexpr int kMaxFreeTensors = 10;  // 3^10 = 59049 policies
  if (static_cast<int>(free.size()) > kMaxFreeTensors) {
    throw UserError("remat_policy: custom with " + std::to_string(free.size()) +
                    " free per-tensor keys is 3^" + std::to_string(free.size()) +
                    " policies; pin some of them (e.g. mlpwo=remat)");
  }
  // The layer input is always kept (remat of it is device: model/autodiff/remat_policy.cpp), so
  // only device and offload are distinct for it.
  static const std::vector<std::string> kDecisions = {"remat", "device", "offload"};
  static const std::vector<std::string> kCarryDecisions = {"device", "offload"};
  auto decisions_of = [](const std::string& name) -> const std::vector<std::string>& {
    return name == "decoder_layer_input" ? kCarryDecisions : kDecisions;
  };
  std::vector<RematChoice> choices;
  std::vector<size_t> digits(free.size(), 0);
  while (true) {
    RematChoice choice{"custom", fixed};
    for (size_t index = 0; index < free.size(); ++index) {
      choice.tensors.emplace_back(free[index], decisions_of(free[index])[digits[index]]);
    }
    choices.push_back(std::move(choice));
    size_t position = 0;
    while (position < digits.size() && ++digits[position] == decisions_of(free[position]).size()) {
      digits[position++] = 0;
    }
    if (position == digits.size()) {
      break;
    }
  }
  return choices;
}

}  // namespace

std::string RematChoice::label() const {
  if (tensors.empty()) {
    return policy;
  }
  std::string text = policy + "(";
  for (size_t index = 0; index < tensors.size(); ++index) {
    text += (index > 0 ? "," : "") + tensors[index].first + "=" + tensors[index].second;
  }
  return text + ")";
}

std::vector<PerfChoice> SearchSpace::perf_choices(const std::string& attention_kind) const {
  std::vector<PerfChoice> choices;
  const std::vector<std::pair<int64_t, int64_t>> no_blocks = {{0, 0}};
  const auto& blocks = attention_kind == "flash" ? flash_blocks : no_blocks;
  for (const auto& [block_q, block_kv] : blocks) {
    for (const std::string& sparse_core : sparse_core_values) {
      for (const bool collective_matmul : collective_matmul_values) {
        choices.push_back({block_q, block_kv, sparse_core, collective_matmul});
      }
    }
  }
  return choices;
}

int64_t SearchSpace::variants_per_placement() const {
  // perf_choices(kind).size() summed, counted without building the choices (the explorer asks per
  // batch it prunes).
  int64_t variants = 0;
  for (const std::string& kind : attention_kinds) {
    const size_t blocks = kind == "flash" ? flash_blocks.size() : 1;
    variants +=
        static_cast<int64_t>(blocks * sparse_core_values.size() * collective_matmul_values.size());
  }
  return variants;
}

int64_t SearchSpace::candidates_per_mesh_and_batch() const {
  return variants_per_placement() * static_cast<int64_t>(placements.size()) *
         static_cast<int64_t>(remats.size());
}

std::string SearchSpace::placement_text(size_t index) const {
  std::string text;
  for (const int axis : placements[index]) {
    text += (text.empty() ? "" : ",") + mesh_axis_names()[static_cast<size_t>(axis)];
  }
  return text;
}

int64_t SearchSpace::size() const {
  return static_cast<int64_t>(meshes.size()) * static_cast<int64_t>(batches.size()) *
         candidates_per_mesh_and_batch();
}

void check_explore_limits(const ExploreLimits& limits) {
  // Written so NaN fails too. The largest batch bounds the search's loop (1e309 was an endless
  // loop); below the smallest candidate (1/64) nothing would be searched.
  constexpr double kSmallestBatch = 1.0 / 64;
  constexpr double kLargestBatch = 65536;
  if (!(limits.max_per_device_batch >= kSmallestBatch &&
        limits.max_per_device_batch <= kLargestBatch)) {
    throw UserError("--max-per-device-batch: " + format_number(limits.max_per_device_batch) +
                    " must be from 1/64 to 65536");
  }
  if (!(limits.min_hbm_headroom >= 0 && limits.min_hbm_headroom < 1)) {
    throw UserError("--min-hbm-headroom: " + format_number(limits.min_hbm_headroom) +
                    " must be a fraction from 0 to below 1");
  }
  if (limits.max_accumulation_steps < 1 || limits.global_batch_size < 0) {
    throw UserError("--global-batch-size: " + std::to_string(limits.global_batch_size) +
                    " must be 0 (search the batch) or a number of sequences");
  }
}

namespace {

// Every mesh: the pinned axes keep their size, the searched ones factorize what is left (ICI
// within a slice, DCN across slices); data- and fsdp-parallel meshes first.
void add_meshes(const Config& config, const SearchKeys& given, SearchSpace& space) {
  MeshShape base;
  std::vector<std::string>& keys = space.searched_keys;
  const int ici_left = pin_axes(config, given, false, kIciSearchAxes, space.slice.devices(),
                                base.ici, space.ici_axes, keys);
  const int dcn_left = pin_axes(
      config, given, true, space.slice.num_slices > 1 ? kDcnSearchAxes : std::vector<std::string>{},
      space.slice.num_slices, base.dcn, space.dcn_axes, keys);
  std::vector<MeshShape> ici_meshes;
  MeshShape current = base;
  factorize(ici_left, space.ici_axes, 0, false, current, ici_meshes);
  for (MeshShape& ici_mesh : ici_meshes) {
    std::vector<MeshShape> both;
    factorize(dcn_left, space.dcn_axes, 0, true, ici_mesh, both);
    space.meshes.insert(space.meshes.end(), both.begin(), both.end());
  }
  // Data- and fsdp-parallel meshes first: they are usually among the fastest, so the explorer's
  // branch and bound gets a high bar early. Only the order of the search changes, not its result.
  const int data_axis = mesh_axis_index("data");
  const int fsdp_axis = mesh_axis_index("fsdp");
  std::stable_sort(space.meshes.begin(), space.meshes.end(),
                   [&](const MeshShape& a, const MeshShape& b) {
                     auto other = [&](const MeshShape& mesh) {
                       return mesh.num_devices() / (mesh.size(data_axis) * mesh.size(fsdp_axis));
                     };
                     return other(a) < other(b);
                   });
}

// A pipeline (explore searches one schedule at a time, sim/explore/explorer.h) takes only the
// batches its microbatches divide, as MaxText requires.
void keep_pipeline_batches(const SearchKeys& given, SearchSpace& space) {
  const int64_t stages = std::max<int64_t>(1, given.ici_pipeline_stages) *
                         std::max<int64_t>(1, given.dcn_pipeline_stages);
  if (stages > 1) {
    int64_t microbatches = given.pipeline_microbatches;
    if (microbatches == -1) {
      microbatches = stages * (given.delay_activation_forwarding ? 2 : 1);
    }
    std::erase_if(space.batches, [&](const BatchChoice& choice) {
      return microbatches < 1 || choice.microbatch % microbatches != 0;
    });
    if (space.batches.empty()) {
      throw UserError("num_pipeline_microbatches=" + std::to_string(microbatches) +
                      ": divides none of the batches searched");
    }
  }
}

// The attention kinds and, for the fused kernel on TPU, the splash block sizes.
void add_attention_choices(const SearchKeys& given, SearchSpace& space) {
  std::vector<std::string>& keys = space.searched_keys;
  // On a GPU node the fused attention is cuDNN's (Transformer Engine), with no splash blocks.
  const bool gpu = space.slice.chip->is_gpu();
  const std::string fused_attention = gpu ? "cudnn_flash_te" : "flash";
  if (given.is_pinned("attention")) {
    const std::string& kind = given.attention;
    if (kind != "dot_product" && kind != fused_attention && kind != "autoselected") {
      throw UserError("attention: explore times dot_product and " + fused_attention + " (" +
                      (gpu ? "GPU" : "TPU") + "), not '" + kind + "'");
    }
    const int64_t length = given.max_target_length;
    space.attention_kinds = {
        kind == "autoselected" ? (length < 128 ? "dot_product" : fused_attention) : kind};
  } else {
    space.attention_kinds = {"dot_product", fused_attention};
    keys.emplace_back("attention");
  }
  const bool block_q_pinned = given.is_pinned("sa_block_q");
  const bool block_kv_pinned = given.is_pinned("sa_block_kv");
  const int64_t length = given.max_target_length;
  std::vector<int64_t> block_q_values;
  std::vector<int64_t> block_kv_values;
  for (const int64_t block : kFlashBlockSizes) {
    if (block <= std::max<int64_t>(length, kFlashBlockSizes.front())) {
      block_q_values.push_back(block);
      block_kv_values.push_back(block);
    }
  }
  if (block_q_pinned || gpu) {  // splash blocks are a TPU kernel's
    block_q_values = {given.sa_block_q};
  } else {
    keys.emplace_back("sa_block_q");
  }
  if (block_kv_pinned || gpu) {
    block_kv_values = {given.sa_block_kv};
  } else {
    keys.emplace_back("sa_block_kv");
  }
  for (const int64_t block_q : block_q_values) {
    for (const int64_t block_kv : block_kv_values) {
      space.flash_blocks.emplace_back(block_q, block_kv);
    }
  }
}

// SparseCore collective offload (chips that have SparseCores) and collective matmul (TPU).
void add_collective_switches(const SearchKeys& given, SearchSpace& space) {
  std::vector<std::string>& keys = space.searched_keys;
  const bool gpu = space.slice.chip->is_gpu();
  const bool has_sparse_cores = space.slice.chip->sparsecores_per_chip > 0;
  if (given.is_pinned("sparse_core_collective_offload") || !has_sparse_cores) {
    space.sparse_core_values = {given.sparse_core_collective_offload};
  } else {
    space.sparse_core_values = {"off", "on"};
    keys.emplace_back("sparse_core_collective_offload");
  }
  if (given.is_pinned("collective_matmul") || gpu) {
    // TPU's async collective fusion; XLA GPU's windowed einsum is another switch, not searched.
    space.collective_matmul_values = {given.collective_matmul};
  } else {
    space.collective_matmul_values = {false, true};
    keys.emplace_back("collective_matmul");
  }
}

// The default placement (or the pinned one), then each ICI axis that is larger than 1 in some
// mesh, placed first.
void add_placements(const Config& config, const SearchKeys& given, SearchSpace& space) {
  std::vector<std::string>& keys = space.searched_keys;
  space.placements = {placement_from_config(config)};
  if (!given.is_pinned("mesh_placement_first")) {
    // Each ICI axis that is larger than 1 in some mesh, placed first.
    for (int axis = 0; axis < kNumMeshAxes; ++axis) {
      const bool used = std::any_of(space.meshes.begin(), space.meshes.end(),
                                    [&](const MeshShape& mesh) { return mesh.ici[axis] > 1; });
      if (used) {
        space.placements.push_back({axis});
      }
    }
    if (space.placements.size() > 1) {
      keys.emplace_back("mesh_placement_first");
    }
  }
}

}  // namespace

SearchSpace build_search_space(const Config& config, const ExploreLimits& limits) {
  check_explore_limits(limits);
  SearchSpace space;
  space.slice = slice_from_config(config);
  const SearchKeys given = search_keys_from_config(config);
  add_meshes(config, given, space);
  space.batches = batch_choices(given, limits, space.slice.total_devices(), space.searched_keys);
  keep_pipeline_batches(given, space);
  space.remats = remat_choices(config, given, space.searched_keys);
  add_attention_choices(given, space);
  add_collective_switches(given, space);
  add_placements(config, given, space);
  return space;
}

}  // namespace tpusim
