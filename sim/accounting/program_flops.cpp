#include "sim/accounting/program_flops.h"

#include "model/ir/op_flops.h"

namespace tpusim {

ProgramFlops program_flops(const StepProgram& program) {
  const Graph& graph = program.program.graph;
  ProgramFlops flops;
  for (const Op& op : graph.ops()) {
    const Region& region = graph.region(op.region);
    // The optimizer runs once per step; everything else once per microbatch.
    const double times =
        static_cast<double>(region.repeat) * share_of_iterations(op) *
        (region.phase == Phase::kOptimizer ? 1.0 : static_cast<double>(program.accumulation_steps));
    const OpFlops cost = op_flops(graph, op);
    if (op.phase == Phase::kRecompute) {
      flops.recompute_matmul += times * cost.matmul;
    } else if (!counted_by_maxtext(op)) {
      flops.uncounted_matmul += times * cost.matmul;
    } else {
      flops.model_matmul += times * cost.matmul;
    }
    flops.vector += times * cost.vector;
  }
  flops.hardware_matmul = flops.model_matmul + flops.recompute_matmul + flops.uncounted_matmul;
  return flops;
}

}  // namespace tpusim
