// sim/explore/resized_op_costs.h: the TensorCore bound (step_bounds.h) of a kept program re-sized
// for another mesh (sharding/program_resize.h), without re-sizing the whole program.
//
// A compute op's cost reads the shapes of a few tensors (op_cost.h: tensors_cost_reads), and each
// of their local dims is ceil(global size / the product of the mesh axes it is split over); on two
// meshes where those products are the same, the op costs the same. Ops are grouped by the sets of
// axes their tensors are split over, and each group keeps the costs of its ops for the last
// kKeptPerGroup products it met: the explorer re-sizes one kept program for mesh after mesh, and
// a group's products often repeat (74% of the op costs were found kept in `tpusim plan
// model_name=llama3.1-70b --tokens 1e12 --deadline 3.128d --hardware tpu7x --max-chips 1024`,
// 75% with no limit). A group met with new products has its ops' tensors re-sized and costed.
// The bounds are those of the program re-sized, bit for bit: the same costs, summed in the same
// order.
//
// Example:
//   ResizedOpCosts costs(kept);  // kept: a ResizableProgram
//   std::optional<ComputeBounds> bounds = costs.bounds(kept, mesh_b, accumulation_steps, contexts);
//   // == tensorcore_lower_bounds(kept.graph(), accumulation_steps, contexts, true) after
//   //    kept.resize(mesh_b), when that is true (nullopt when it is false)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "sharding/program_resize.h"
#include "sim/explore/step_bounds.h"
#include "sim/perf/op_cost.h"

namespace tpusim {

class ResizedOpCosts {
 public:
  // Products kept per group of ops (the least recently met is dropped).
  static constexpr size_t kKeptPerGroup = 32;

  explicit ResizedOpCosts(const ResizableProgram& program, size_t kept_per_group = kKeptPerGroup);

  // The bounds of `program` (the one this was made from) re-sized for `mesh`, with
  // keep_forward_ops; nullopt when it does not re-size there (ResizableProgram::resize is false).
  // Afterwards `program` is of no mesh until its next resize().
  std::optional<ComputeBounds> bounds(ResizableProgram& program, const MeshShape& mesh,
                                      int64_t accumulation_steps,
                                      const std::vector<CostContext>& contexts);

  // Ops costed and ops whose costs were found kept, over every bounds() so far.
  int64_t costed() const { return costed_; }
  int64_t found() const { return found_; }

 private:
  // One product per split set of the group, and its ops' seconds in op order: one per context for
  // an attention op, one for the others (the same under every context).
  struct Kept {
    std::vector<int64_t> products;
    std::vector<double> seconds;
    uint64_t last_met = 0;
    bool complete = false;  // every op's seconds are in
  };
  // Compute ops whose tensors are split over the same sets of axes.
  struct Group {
    std::vector<uint32_t> sets;  // indices into ResizableProgram::split_axes
    size_t ops = 0;
    size_t attention_ops = 0;
    std::vector<Kept> kept;
    size_t current = 0;  // the kept entry of the mesh of this bounds() call
  };
  // Where a compute op is: its group, its place in the group (its offset into Kept::seconds is
  // that of the ops before it: one each, the attention ops' one per context), and the tensors its
  // cost reads, tensors_[tensors_begin, tensors_end).
  struct OpPlace {
    int op = -1;
    uint32_t group = 0;
    uint32_t index = 0;
    uint32_t attention_before = 0;
    uint32_t tensors_begin = 0;
    uint32_t tensors_end = 0;
    bool attention = false;
  };

  void meet(Group& group);  // points group.current at the entry of products_ (new if none)
  void seconds_of(ResizableProgram& program, const Op& op, double* seconds);

  size_t kept_per_group_ = kKeptPerGroup;
  std::vector<Group> groups_;
  std::optional<ForwardOpSeconds> forward_like_;  // the first bounds' forward ops
  std::vector<OpPlace> places_;                   // the compute ops', in program order
  std::vector<TensorId> tensors_;                 // OpPlace's tensors
  std::vector<CostContext> contexts_;
  std::vector<int64_t> splits_;    // ResizableProgram::splits_on the mesh
  std::vector<int64_t> products_;  // scratch: a group's products on the mesh
  size_t next_place_ = 0;          // the place of the next op seconds_of is asked for
  uint64_t calls_ = 0;
  int64_t costed_ = 0;
  int64_t found_ = 0;
};

}  // namespace tpusim
