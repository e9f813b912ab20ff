#include "sim/explore/step_bounds.h"

#include <algorithm>
#include <map>
#include <utility>

#include "model/ir/op_kind_traits.h"
#include "sim/perf/op_cost.h"

namespace tpusim {
ComputeBounds bounds_from_regions(std::vector<std::vector<double>> region_seconds,
                                  const Graph::Regions& regions, int64_t accumulation_steps) {
  ComputeBounds result;
  for (const std::vector<double>& passes : region_seconds) {
    double microbatch = 0;
    double optimizer = 0;
    for (size_t region = 0; region < regions.size() && region < passes.size(); ++region) {
      const Region& info = regions[region];
      const double total = passes[region] * static_cast<double>(info.repeat);
      (info.phase == Phase::kOptimizer ? optimizer : microbatch) += total;
    }
    // The forward and backward regions run once per microbatch, the optimizer's once per step.
    result.step.push_back(microbatch * static_cast<double>(accumulation_steps) + optimizer);
  }
  result.region_seconds = std::move(region_seconds);
  return result;
}

ComputeBounds tensorcore_lower_bounds(const StepProgram& program,
                                      const std::vector<CostContext>& contexts,
                                      bool keep_forward_ops) {
  return tensorcore_lower_bounds(program.program.graph, program.accumulation_steps, contexts,
                                 keep_forward_ops);
}

void compute_op_seconds(const Graph& graph, const Op& op, const std::vector<CostContext>& contexts,
                        double* seconds) {
  if (op_kind_traits(op.kind).attention) {
    for (size_t context = 0; context < contexts.size(); ++context) {
      seconds[context] = cost_compute_op(graph, op, contexts[context], false).seconds;
    }
  } else {
    std::fill_n(seconds, contexts.size(),
                cost_compute_op(graph, op, contexts.front(), may_fuse(op.kind)).seconds);
  }
}

ComputeBounds tensorcore_lower_bounds(const Graph& graph, int64_t accumulation_steps,
                                      const std::vector<CostContext>& contexts,
                                      bool keep_forward_ops) {
  return tensorcore_lower_bounds(
      graph, accumulation_steps, contexts.size(), keep_forward_ops,
      [&](const Op& op, double* seconds) { compute_op_seconds(graph, op, contexts, seconds); });
}

ComputeBounds tensorcore_lower_bounds(const Graph& graph, int64_t accumulation_steps,
                                      size_t contexts, bool keep_forward_ops,
                                      const SecondsOfOp& seconds_of,
                                      const ForwardOpSeconds* forward_like) {
  const size_t regions = graph.regions().size();
  ComputeBounds result;
  std::vector<double> shared(regions, 0.0);
  std::vector<std::vector<double>> attention(contexts, std::vector<double>(regions, 0.0));
  std::vector<double> seconds(contexts);
  if (keep_forward_ops) {
    result.op_seconds.assign(graph.ops().size(), 0.0);
    result.forward_ops = forward_like != nullptr ? ForwardOpSeconds(contexts, forward_like)
                                                 : ForwardOpSeconds(contexts);
  }
  for (const Op& op : graph.ops()) {
    if (!is_compute(op.kind)) {
      continue;
    }
    const auto region = static_cast<size_t>(op.region);
    seconds_of(op, seconds.data());
    if (op_kind_traits(op.kind).attention) {
      for (size_t context = 0; context < contexts; ++context) {
        attention[context][region] += seconds[context];
      }
    } else {
      shared[region] += seconds.front();
    }
    if (keep_forward_ops) {
      result.op_seconds[static_cast<size_t>(op.id)] =
          *std::min_element(seconds.begin(), seconds.end());
    }
    if (keep_forward_ops && op.phase == Phase::kForward) {
      result.forward_ops.add(op.region, op.name, seconds.data());
    }
  }
  result.forward_ops.finish();  // a name seen twice in a region keeps its cheaper cost
  std::vector<std::vector<double>> region_seconds(contexts, std::vector<double>(regions));
  for (size_t context = 0; context < contexts; ++context) {
    for (size_t region = 0; region < regions; ++region) {
      region_seconds[context][region] = shared[region] + attention[context][region];
    }
  }
  ComputeBounds sums =
      bounds_from_regions(std::move(region_seconds), graph.regions(), accumulation_steps);
  result.step = std::move(sums.step);
  result.region_seconds = std::move(sums.region_seconds);
  return result;
}

std::vector<RecomputedOp> recomputed_beyond_none(const TrainingStep& step,
                                                 const TrainingStep& none) {
  auto recomputed = [](const TrainingStep& of) {
    std::map<std::pair<int, std::string>, std::pair<int64_t, int>> found;  // -> (repeat, count)
    for (const Op& op : of.graph.ops()) {
      if (op.phase != Phase::kRecompute || !is_compute(op.kind)) {
        continue;
      }
      const Region& region = of.graph.region(op.region);
      auto& [repeat, count] = found[{region.forward_region, op.name}];
      repeat = region.repeat;
      ++count;
    }
    return found;
  };
  const auto in_none = recomputed(none);
  std::vector<RecomputedOp> result;
  for (const auto& [key, value] : recomputed(step)) {
    const auto other = in_none.find(key);
    const int extra = value.second - (other == in_none.end() ? 0 : other->second.second);
    for (int copy = 0; copy < extra; ++copy) {
      result.push_back({key.first, key.second, value.first});
    }
  }
  return result;
}

std::vector<double> remat_bounds(const ComputeBounds& none, const std::vector<RecomputedOp>& ops,
                                 int64_t accumulation_steps) {
  std::vector<double> bounds = none.step;
  for (const RecomputedOp& op : ops) {
    const double* found = none.forward_ops.find(op.forward_region, op.name);
    if (found == nullptr) {
      continue;
    }
    for (size_t context = 0; context < bounds.size(); ++context) {
      bounds[context] +=
          found[context] * static_cast<double>(op.repeat) * static_cast<double>(accumulation_steps);
    }
  }
  return bounds;
}

}  // namespace tpusim
