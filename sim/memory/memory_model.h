// sim/memory/memory_model.h: peak HBM per device, from liveness over the per-device program.
//
// Categories (bytes per device):
//   weights            parameters (weight_dtype), the whole step
//   optimizer_state    Adam's two moments (mu_dtype), the whole step
//   gradients          parameter gradients, from the backward region that produces them to the
//                      optimizer update (updates are in place: parameters and moments are donated)
//   saved_activations  forward tensors kept for backward by the remat policy, from their forward
//                      region to their backward region (offloaded ones live in host memory)
//   gathered_weights   all-gathered (FSDP) weights, live from the gather to their last use
//   temporaries        every other intermediate, live from its producer to its last use; with
//                      attention=dot_product also each attention op's scores while it runs:
//                      batch x heads x q length x kv length local elements in the query's dtype,
//                      one buffer forward and two backward (probabilities and their gradient).
//                      That is a lower bound (an assumption, not measured: XLA may keep the
//                      scores and their exponentials apart, and remat_policy=none would also
//                      save the probabilities for backward, which is not counted).
// Buffer reuse as XLA assigns it: an elementwise-shaped op (elementwise, rope, norm and
// cross-entropy gradients) writes its output over an operand it reads for the last time, a
// temporary or, in a backward region, a saved activation (the logits' gradient over the logits).
// A repeated region (scanned layers) is one iteration's program: saved activations and gradients
// accumulate per iteration, temporaries do not. The peak is the largest total over the step's
// checkpoints: the end of each forward region, the first and last iteration of each backward
// region, and the optimizer update.
// Which tensors are state or final gradients, and where each one is read last, come from
// sim/memory/liveness.h, the analysis the functional executor frees its values by.
//
// Example:
//   MemoryEstimate memory = estimate_memory(build_step_program(config));
//   memory.peak_bytes; memory.at_peak.saved_activations; memory.fits;
#pragma once

#include <string>
#include <vector>

#include "common/mechanisms.h"
#include "sharding/step_program.h"

namespace tpusim {

struct MemoryBreakdown {
  double weights = 0;
  double optimizer_state = 0;
  double gradients = 0;
  double saved_activations = 0;
  double gathered_weights = 0;
  double temporaries = 0;

  // Host memory is not HBM: offloaded activations are reported beside, not in, the total.
  double total() const {
    return weights + optimizer_state + gradients + saved_activations + gathered_weights +
           temporaries;
  }
};

// Memory in use at one point of the step.
struct MemoryCheckpoint {
  std::string where;  // "layer" (end of its forward), "layer/grad (first iteration)", ...
  MemoryBreakdown memory;
  double host_offloaded_bytes = 0;
};

struct MemoryEstimate {
  std::vector<MemoryCheckpoint> timeline;  // every checkpoint, in step order
  MemoryBreakdown at_peak;                 // the categories at the peak
  double peak_bytes = 0;
  std::string peak_region;          // where the peak occurs, e.g. "layer/grad (first iteration)"
  double host_offloaded_bytes = 0;  // saved activations kept in host memory at the peak
  // Usable HBM per device (catalog hbm_usable_gib) less hbm_headroom_fraction.
  double capacity_bytes = 0;
  bool fits = false;
};

// `mechanisms`: in_place_buffers applies unless switched off.
MemoryEstimate estimate_memory(const StepProgram& program,
                               const MechanismSet& mechanisms = MechanismSet());

}  // namespace tpusim
