#include "sim/estimate/op_details.h"

#include <cmath>
#include <map>
#include <utility>

#include "model/ir/dtype.h"
#include "sim/perf/op_cost.h"

namespace tpusim {
namespace {

std::string shape_text(const Tensor& tensor) {
  std::string text = std::string(dtype_name(tensor.dtype)) + "[";
  for (size_t index = 0; index < tensor.dims.size(); ++index) {
    text += (index > 0 ? "," : "") + std::to_string(tensor.dims[index].size);
  }
  return text + "]";
}

std::string shapes_of(const Graph& graph, const Op& op) {
  std::string text;
  for (const TensorId input : op.inputs) {
    text += (text.empty() ? "" : " x ") + shape_text(graph.tensor(input));
  }
  text += " ->";
  for (const TensorId output : op.outputs) {
    text += " " + shape_text(graph.tensor(output));
  }
  return text;
}

}  // namespace

std::vector<OpDetail> op_details(const Estimate& estimate) {
  const Graph& graph = estimate.program.program.graph;
  const CostContext& context = estimate.perf.cost;
  const ChipSpec& chip = *estimate.program.slice.chip;
  const double hbm_rate = hbm_bytes_per_second(chip);
  const double vpu_rate = vpu_flops_per_second(chip);
  std::map<std::pair<std::string, std::string>, const Op*> by_name;
  for (const Op& op : graph.ops()) {
    by_name.emplace(std::make_pair(graph.region(op.region).name,
                                   std::string(op_kind_name(op.kind)) + " " + op.name),
                    &op);
  }
  std::vector<OpDetail> details;
  for (const OpProfile& profiled : estimate.timing.profile) {
    OpDetail detail;
    detail.region = profiled.region;
    detail.op = profiled.op;
    detail.bound = profiled.bound;
    detail.calls = profiled.calls;
    detail.seconds = profiled.seconds;
    detail.seconds_per_call = profiled.calls > 0 ? profiled.seconds / profiled.calls : 0;
    const auto found = by_name.find({profiled.region, profiled.op});
    if (found != by_name.end() && context.chip != nullptr) {
      const Op& op = *found->second;
      detail.name = op.name;
      const double share = share_of_iterations(op);
      OpCost cost = cost_compute_op(graph, op, context, /*fused=*/false);
      const OpCost fused = cost_compute_op(graph, op, context, /*fused=*/true);
      if (std::abs(fused.seconds * share - detail.seconds_per_call) <
          std::abs(cost.seconds * share - detail.seconds_per_call)) {
        cost = fused;
      }
      const double efficiency = context.program_efficiency;
      detail.flops = share * (cost.matmul_flops + cost.vpu_seconds * efficiency * vpu_rate);
      detail.hbm_bytes = share * cost.hbm_seconds * efficiency * hbm_rate;
      detail.shapes = shapes_of(graph, op);
      detail.recomputed = op.phase == Phase::kRecompute;
    }
    details.push_back(detail);
  }
  return details;
}

}  // namespace tpusim
