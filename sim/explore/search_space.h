// sim/explore/search_space.h: the configurations `tpusim explore` searches for one model and slice.
//
// The space is a product of independent choices, each searched unless the user pinned its key on
// the command line (a pinned key is one value, not a dimension):
//   - mesh: every factorization of the devices of a slice over the ICI axes data, fsdp,
//     fsdp_transpose, tensor, tensor_sequence, context and expert (ici_*_parallelism), and of the
//     slices over the DCN axes data and fsdp (dcn_*_parallelism). Pinned axes keep their size; the
//     searched ones multiply to what is left. Placement on the physical axes (torus, chiplet pair,
//     DCN) follows from the mesh and the placement choice below (sharding/device_mesh.h). The
//     stage axis keeps its configured size: explore() runs one space per pipeline schedule, and
//     with stages > 1 only the batches num_pipeline_microbatches divides are kept;
//   - batch: per_device_batch_size in powers of two up to a limit, or, with a fixed global batch,
//     every gradient_accumulation_steps that divides it (per_device_batch_size = global /
//     (accumulation x devices), fractional values allowed as in MaxText);
//   - remat: MaxText's named remat policies; with remat_policy=custom pinned, every combination of
//     {remat, device, offload} for the per-tensor keys that this model has and the user did not
//     pin;
//   - attention kind (dot_product, flash) and, for flash, the splash block sizes sa_block_q x
//     sa_block_kv in {512, 1024, 2048} (capped at the sequence length);
//   - sparse_core_collective_offload on/off (chips with SparseCores) and collective_matmul on/off;
//   - placement (tpusim's mesh_placement_first): which mesh axis is laid onto the physical axes
//     first (the v7x chiplet pair, the exactly-sized torus axis), or create_device_mesh's order.
//     One choice per ICI axis that can be larger than 1, plus the default; a choice that places
//     a mesh exactly as an earlier one does (or its axis has size 1 there) is a duplicate.
// The first three change the per-device program; the others only its timing (the attention kind
// selects the kernel's cost, not the ops; the placement only where collectives run), so the
// explorer builds one program per (mesh, batch, remat) and times it once per placement, attention
// kind and perf variant.
//
// Example:
//   Config config = Config::load("", {"model_name=llama2-7b", "compile_topology=v5p-32"});
//   SearchSpace space = build_search_space(config, {.max_per_device_batch = 8});
//   space.size();  // meshes x batches x remats x (attention and perf variants)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hw/slice.h"
#include "sharding/mesh.h"

namespace tpusim {

class Config;

// The user's limits on the search (tpusim explore options).
struct ExploreLimits {
  int64_t global_batch_size = 0;     // sequences per optimizer step; 0 = per_device_batch searched
  double max_per_device_batch = 16;  // largest per_device_batch_size tried
  int64_t max_accumulation_steps = 64;
  double min_hbm_headroom = 0;  // fraction of usable HBM that must stay free
};

struct BatchChoice {
  double per_device_batch_size = 1;
  int64_t accumulation_steps = 1;
  int64_t microbatch = 1;         // sequences per microbatch: per_device_batch_size x devices
  int64_t loaded_microbatch = 1;  // the batch that must split evenly (BatchPlan)
};

// A remat policy with the per-tensor keys it sets (for remat_policy=custom).
struct RematChoice {
  std::string policy;
  std::vector<std::pair<std::string, std::string>> tensors;  // custom: key -> remat/device/offload
  std::string label() const;  // "full", "custom(decoder_layer_input=offload,...)"
};

// The timing-only switches of one candidate.
struct PerfChoice {
  int64_t block_q = 0;              // flash only
  int64_t block_kv = 0;             // flash only
  std::string sparse_core_offload;  // "on"/"off", or the config's value when not searched
  bool collective_matmul = true;
};

struct SearchSpace {
  Slice slice;
  std::vector<int> ici_axes;  // searched mesh axes, by index
  std::vector<int> dcn_axes;
  std::vector<MeshShape> meshes;
  std::vector<BatchChoice> batches;  // ascending microbatch (memory grows along it)
  std::vector<RematChoice> remats;
  std::vector<std::string> attention_kinds;
  std::vector<std::pair<int64_t, int64_t>> flash_blocks;  // (sa_block_q, sa_block_kv)
  std::vector<std::string> sparse_core_values;
  std::vector<bool> collective_matmul_values;
  // Placement choices: the mesh axes placed first (mesh_placement_first); [0] is the default (or
  // the pinned value).
  std::vector<std::vector<int>> placements;
  std::vector<std::string> searched_keys;  // for the report

  // Timing variants of a program with this attention kind.
  std::vector<PerfChoice> perf_choices(const std::string& attention_kind) const;
  // Candidates below one (mesh, batch): remats x placements x attention kinds x perf variants.
  int64_t candidates_per_mesh_and_batch() const;
  // Timing variants per placement: attention kinds x their perf variants.
  int64_t variants_per_placement() const;
  // "fsdp,tensor" for placements[index] ("" for the default order).
  std::string placement_text(size_t index) const;
  int64_t size() const;
};

// UserError (exit 2) for contradicting pins (a pinned mesh that does not divide the slice, a
// per_device_batch_size that contradicts the global batch, limits out of range).
SearchSpace build_search_space(const Config& config, const ExploreLimits& limits);

// UserError naming the option when a limit is out of range (--max-per-device-batch from 1/64 to
// 65536, --min-hbm-headroom from 0 to below 1, --global-batch-size 0 or more); build_search_space
// checks it, and `tpusim plan` before it searches any slice.
void check_explore_limits(const ExploreLimits& limits);

}  // namespace tpusim
