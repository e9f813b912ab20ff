// sim/explore/step_bounds.h: lower bounds on a program's step time, for the explorer's branch and
// bound. They never exceed the step time the performance engine gives, so a candidate whose best
// possible objective (computed from its bound) is below the N-th best found so far can be skipped
// without changing the top N.
//
//   - tensorcore_lower_bounds: the TensorCore runs the compute ops one at a time, so a step takes
//     at least the sum of their costs, whatever the collectives, SparseCore offload and collective
//     matmul do (elementwise ops that may fuse into a matmul are charged as fused, their cheaper
//     case). One bound per cost context (attention kernel and splash block sizes); only attention
//     ops depend on the context, so the others are costed once.
//   - StepSimulator::collective_bounds (v7x with the SparseCore offload off: the TensorCore time
//     of continuation-fused collective steps adds to the compute bound; and each link runs one
//     collective at a time),
//     per placement and perf switches; the explorer takes the larger of the two bounds.
//   - remat_bounds: a remat policy's bound from the remat_policy=none program of the same mesh and
//     batch, without partitioning the policy's step. The policy runs every compute op of "none"
//     (the same ops on the same local shapes: only where backward reads forward tensors from
//     changes) plus clones of forward ops that it recomputes, whose local shapes and costs are the
//     originals'. A clone whose original is not found adds nothing, so the bound stays a bound.
//     The policy also runs at least the collectives of "none" (recomputation adds readers of the
//     same weights and activations, not fewer collectives; an observation over random candidates
//     in step_bounds_test, not a proof), so "none"'s collective bounds, per placement and perf
//     switches, bound the policy's too: the explorer bounds a policy with both before
//     partitioning it.
//
// Example:
//   ComputeBounds none = tensorcore_lower_bounds(none_program, contexts, true);
//   std::vector<RecomputedOp> extra = recomputed_beyond_none(full_step, none_step);
//   remat_bounds(none, extra, accumulation_steps);  // <= tensorcore_lower_bounds(full program)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/ir/graph.h"
#include "sharding/step_program.h"
#include "sim/explore/forward_op_seconds.h"
#include "sim/perf/op_cost.h"

namespace tpusim {

struct ComputeBounds {
  std::vector<double> step;  // seconds per cost context
  // Per context, per region: the seconds of one pass over the region's compute ops. `step` is
  // their sum times each region's repeat, the forward and backward regions' once more per
  // microbatch of the accumulation (the optimizer's once per step). A program of the same compute
  // ops per pass with other repeats (another pipeline schedule) has the bounds bounds_from_regions
  // gives (batch_classes.h).
  std::vector<std::vector<double>> region_seconds;
  // With keep_forward_ops: each forward compute op's seconds per context, by (region, op name);
  // an op name seen twice in a region keeps its cheaper cost.
  ForwardOpSeconds forward_ops;
  // With keep_forward_ops: each compute op's least cost over the contexts, by op id (fusible ops
  // charged as fused), for StepSimulator::chain_bound.
  std::vector<double> op_seconds;
};

// The step bounds of a program whose regions (repeat and phase) are `regions` and whose region
// passes take `region_seconds` (ComputeBounds::region_seconds): what tensorcore_lower_bounds gives
// for it, bit for bit (it sums the same way). Fills step and region_seconds.
ComputeBounds bounds_from_regions(std::vector<std::vector<double>> region_seconds,
                                  const Graph::Regions& regions, int64_t accumulation_steps);

ComputeBounds tensorcore_lower_bounds(const StepProgram& program,
                                      const std::vector<CostContext>& contexts,
                                      bool keep_forward_ops = false);
// The same for a per-device program `graph` run `accumulation_steps` microbatches a step (a
// program re-sized for another mesh: sharding/program_resize.h).
ComputeBounds tensorcore_lower_bounds(const Graph& graph, int64_t accumulation_steps,
                                      const std::vector<CostContext>& contexts,
                                      bool keep_forward_ops = false);

// Fills seconds[context] with compute op `op`'s cost under each of `contexts` (fusible ops charged
// as fused; only attention ops' costs differ by context): what tensorcore_lower_bounds sums.
void compute_op_seconds(const Graph& graph, const Op& op, const std::vector<CostContext>& contexts,
                        double* seconds);
// The same bounds over `contexts` cost contexts with each compute op's seconds from `seconds_of`
// (compute_op_seconds, or a memo of it: resized_op_costs.h), summed the same way. With
// `forward_like`, the forward_ops of an earlier call on a graph of the same ops (the same program
// on another mesh), forward_ops is made like it (ForwardOpSeconds: no sort).
using SecondsOfOp = std::function<void(const Op& op, double* seconds)>;
ComputeBounds tensorcore_lower_bounds(const Graph& graph, int64_t accumulation_steps,
                                      size_t contexts, bool keep_forward_ops,
                                      const SecondsOfOp& seconds_of,
                                      const ForwardOpSeconds* forward_like = nullptr);

// A forward op that a remat policy recomputes in backward (the clone keeps the op's name), by the
// forward region it comes from, with the repeat of the backward region that runs the clone.
struct RecomputedOp {
  int forward_region = 0;
  std::string name;
  int64_t repeat = 1;
};

// The compute ops `step` recomputes beyond those its remat_policy=none step recomputes too
// (chunked cross-entropy recomputes its logits under every policy).
std::vector<RecomputedOp> recomputed_beyond_none(const TrainingStep& step,
                                                 const TrainingStep& none);

// Per context: `none`'s step bounds plus the recomputed ops' costs (each x its repeat x the
// gradient accumulation steps, as backward runs once per microbatch).
std::vector<double> remat_bounds(const ComputeBounds& none, const std::vector<RecomputedOp>& ops,
                                 int64_t accumulation_steps);

}  // namespace tpusim
