// sim/functional/device_context.h: what a kernel needs to know about the device running it.
//
// A device-local dim split over mesh axes holds the slice [offset, offset + local size) of the
// global dim; its offset follows from the device's coordinate on each mesh axis (major to minor,
// as Dim::sharded_over lists them). Kernels need global positions for RoPE and causal masks (a
// context-parallel shard of the sequence), for embedding lookups (a vocab shard) and for slices.
//
// Example:
//   DeviceContext device{.coordinates = ...};  // fsdp coordinate 2 of 4
//   device.offset(dim);  // dim "batch" of global 16 split over fsdp: 2 * 4 = 8
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/ir/tensor.h"
#include "sharding/mesh.h"
#include "sim/functional/kernel_threads.h"

namespace tpusim {

// Where the cross-entropy kernel records the log-probability of each target token (the token
// probability view, sim/train/token_viz.h): [sequences, length] of one microbatch, global
// indices, NaN for the tokens this device does not compute. The executor sets the current
// microbatch and head chunk before the loss runs.
struct TokenLogProbs {
  int64_t sequences = 0;
  int64_t length = 0;
  int64_t microbatch = 0;  // the microbatch to record
  int64_t current_microbatch = 0;
  int64_t chunk = 0;  // a chunked head (num_vocab_tiling): positions [chunk L/T, (chunk+1) L/T)
  std::vector<float> values;
  // With logits_position >= 0 (`tpusim generate`): also every logit the loss sees (after its
  // multiplier and soft cap) at that position, [sequences, vocab] by global vocab index, NaN for
  // the entries this device does not compute.
  int64_t logits_position = -1;
  int64_t vocab = 0;
  std::vector<float> logits;
};

struct DeviceContext {
  int device = 0;                               // global device index
  std::array<int, kNumMeshAxes> coordinates{};  // position on each mesh axis (ici x dcn)
  std::array<int, kNumMeshAxes> sizes{};        // mesh axis sizes
  bool bf16_matmul_inputs = false;              // functional_dtype=bfloat16_matmul
  // functional_precision=fast: fp32 GEMMs and attention (sim/functional/kernels/); false = the
  // reference numerics (double accumulation).
  bool fast_kernels = false;
  KernelThreads* threads = nullptr;  // helper threads of this device's kernels (none: serial)
  TokenLogProbs* token_log_probs = nullptr;  // when set, the loss records each token's log p

  // The optimizer step (AdamW, MaxText/optax semantics) this program execution applies.
  struct Optimizer {
    double learning_rate = 0;
    int64_t step = 1;  // 1-based, for bias correction
    double b1 = 0.9;
    double b2 = 0.95;
    double eps = 1e-8;
    double eps_root = 0;
    double weight_decay = 0.1;
    double gradient_scale = 1;  // global-norm clipping factor applied to gradients first
    // MaxText's routed_bias_update_rate: the step a router bias moves after AdamW, toward its
    // balanced load (the kAdamUpdate ops that read the bias's expert loads).
    double bias_update_rate = 0;
  } optimizer;

  // Global index of local position 0 of `dim` on this device (0 when the dim is not split).
  int64_t offset(const Dim& dim) const;
  // This device's index among the devices sharing `dim`'s mesh axes (0 .. shards-1).
  int64_t shard_index(const Dim& dim) const;

  // Calls visit(local_flat, global_flat) for every element of this device's block of `tensor`
  // (row-major local index, and row-major index in the whole unsharded tensor); elements in the
  // padding of a dim that does not divide get global_flat = -1.
  void for_each_global_element(const Tensor& tensor,
                               const std::function<void(int64_t, int64_t)>& visit) const;
};

}  // namespace tpusim
