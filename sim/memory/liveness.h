// sim/memory/liveness.h: where each tensor of a per-device program is read for the last time, and
// which tensors outlive their reads. The one liveness analysis behind both the memory model's
// peak HBM (sim/memory/memory_model.cpp) and the functional executor's frees
// (sim/functional/executor.cpp), so the two interpreters agree on when a value dies.
//
// Program order is op id order; a region's ops run in that order, once per iteration. Two views:
//   * the whole program (what the executor keeps between regions): last_reader(t) is the id of
//     the last op reading t, and dies_after(t) the op after which no op needs t any more (its
//     last reader, else its producer: an output nobody reads);
//   * one iteration of one region (the memory model's temporaries): last_use_in_region(t, r) is
//     the position, in region_ops(r), of the last op of r reading t, and dies_after_in_region the
//     position after which t is free there.
// Tensors that live on regardless of reads: state (parameters and optimizer moments no op
// produces, kept across steps), final gradients (a parameter's gradient, kept to the update),
// and carry ends (a carry's source is read when the next region or iteration starts).
//
// Example (region 0 with ops  0: y = f(x)   1: z = g(x, y)   2: w = h(z)):
//   Liveness liveness(graph, /*final_gradients=*/{});
//   liveness.last_reader(x);                 // 1 (op id)
//   liveness.last_use_in_region(y, 0);       // 1 (position in region_ops(0))
//   liveness.dies_after(w);                  // 2: nobody reads w, it dies after its producer
//   liveness.dies_after_in_region(w, 0, 2);  // 2, or Liveness::kNone if w were carried out
#pragma once

#include <utility>
#include <vector>

#include "model/ir/graph.h"
#include "sharding/step_program.h"

namespace tpusim {

class Liveness {
 public:
  static constexpr int kNone = -1;

  // `final_gradients`: the program's (local) parameter gradients, which live to the update.
  Liveness(const Graph& graph, const std::vector<TensorId>& final_gradients);

  // Roles.
  bool is_state(TensorId id) const { return state_[index(id)]; }
  bool is_final_gradient(TensorId id) const { return final_gradient_[index(id)]; }
  // State or a final gradient: kept for the whole step.
  bool persistent(TensorId id) const { return is_state(id) || is_final_gradient(id); }
  bool is_carry_source(TensorId id) const { return carry_source_[index(id)]; }
  bool is_carry_end(TensorId id) const { return carry_end_[index(id)]; }

  // Over the whole program.
  int last_reader(TensorId id) const { return last_reader_[index(id)]; }
  // Some op outside the region that produces (or owns) the tensor reads it.
  bool read_outside_own_region(TensorId id) const;
  // The op (id) after which no op reads the tensor: its last reader, else its producer, else
  // kNone (an input or parameter nobody reads).
  int dies_after(TensorId id) const;

  // Inside one iteration of one region.
  const std::vector<const Op*>& region_ops(int region) const {
    return region_ops_[static_cast<size_t>(region)];
  }
  // Position in region_ops(region) of the last op of `region` reading the tensor, or kNone.
  int last_use_in_region(TensorId id, int region) const;
  // For a tensor first touched (read or written) at position `touched_at` of `region`: the
  // position after which it is free there, i.e. its last use in the region (at least
  // touched_at); if the region does not read it, kNone when it is carried out (it lives on into
  // the next region or iteration), else touched_at (an output nobody reads dies at once).
  int dies_after_in_region(TensorId id, int region, int touched_at) const;

 private:
  static size_t index(TensorId id) { return static_cast<size_t>(id); }

  const Graph& graph_;
  std::vector<bool> state_;                         // by tensor id
  std::vector<bool> final_gradient_;                // by tensor id
  std::vector<bool> carry_source_;                  // by tensor id
  std::vector<bool> carry_end_;                     // by tensor id
  std::vector<int> last_reader_;                    // by tensor id: op id, or kNone
  std::vector<std::vector<const Op*>> region_ops_;  // by region, in program order
  // The regions reading each tensor with the position of their last read there, tensor by
  // tensor (those of tensor t at [reads_begin_[t], reads_begin_[t + 1]), in region order).
  struct RegionRead {
    int region = 0;
    int last_position = 0;
  };
  std::vector<size_t> reads_begin_;
  std::vector<RegionRead> reads_;
};

// The (parameter, gradient) pairs of the step as tensors of the device's program, in the step's
// order of parameters.
std::vector<std::pair<TensorId, TensorId>> local_parameter_grads(const StepProgram& program);

// The liveness of a step's per-device program (its final gradients from the step).
Liveness program_liveness(const StepProgram& program);

// The expert loads a router bias's update reads (the fifth input of its kAdamUpdate, with
// routed_bias_update_rate): like final gradients they live to the update, summed over the
// microbatches (sim/functional/executor.cpp).
std::vector<TensorId> router_bias_loads(const Graph& graph);

}  // namespace tpusim
