// model/batch_plan.h: how many sequences a training step holds, from per_device_batch_size.
//
// MaxText (pyconfig calculate_global_batch_sizes): a microbatch is per_device_batch_size x
// devices sequences (per_device_batch_size may be a fraction: 0.25 on 8 devices is 2 sequences);
// an optimizer step runs gradient_accumulation_steps microbatches. This is the one place the
// product becomes a whole number of sequences: `estimate` (sharding/step_program.cpp) and
// `explore` (sim/explore/search_space.cpp) both call it.
//
// Example:
//   BatchPlan plan = plan_batch(/*per_device_batch_size=*/0.25, /*devices=*/8,
//                               /*accumulation_steps=*/4);
//   plan.microbatch;    // 2
//   plan.global_batch;  // 8
//   plan.whole;         // true; plan_batch(0.3, 8, 1) gives microbatch 2, whole = false
//   plan.loaded_microbatch;  // 8: a fraction loads one sequence per device
#pragma once

#include <cstdint>

namespace tpusim {

struct BatchPlan {
  int64_t microbatch = 0;          // sequences per microbatch (the graph's batch)
  int64_t accumulation_steps = 1;  // microbatches per optimizer step
  int64_t global_batch = 0;        // sequences per optimizer step
  // per_device_batch_size x devices is a whole number (within 1e-9): nothing is dropped.
  bool whole = false;
  // The sequences per microbatch the input pipeline loads and shards over the batch's mesh axes
  // (MaxText micro_batch_size_to_load): the microbatch, but one sequence per device when
  // per_device_batch_size < 1 (the step then keeps the first `microbatch` of them, which XLA may
  // split unevenly). This is the batch that must split evenly (sharding/divisibility.h).
  int64_t loaded_microbatch = 0;
};

// The product rounded down to whole sequences; 1e-9 of slack lets a product that floating point
// lands just below a whole number (e.g. 3 / 9216 x 9216) count as that number.
BatchPlan plan_batch(double per_device_batch_size, int64_t devices, int64_t accumulation_steps);

}  // namespace tpusim
