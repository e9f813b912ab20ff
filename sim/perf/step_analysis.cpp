#include "sim/perf/step_analysis.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "model/ir/op_kind_traits.h"
#include "sharding/partitioner.h"

namespace tpusim {

void StepSimulator::Analysis::find_fusions(const Graph& graph, bool matmul_output_fusion) {
  std::vector<int> consumers(graph.tensors().size(), 0);
  for (const Op& op : graph.ops()) {
    for (const TensorId input : op.inputs) {
      ++consumers[static_cast<size_t>(input)];
    }
  }
  for (const Op& op : graph.ops()) {
    if (!may_fuse(op.kind)) {
      continue;
    }
    for (const TensorId input : op.inputs) {
      const int producer = graph.producer(input);
      if (producer < 0) {
        continue;
      }
      const Op& source = graph.ops()[static_cast<size_t>(producer)];
      // RoPE also fuses into a norm it reads: qk-norm's per-head RMSNorm of the query and key
      // and their rotation are one XLA fusion between the projection and the attention.
      const bool fusible_source = (source.kind == OpKind::kEinsum && matmul_output_fusion) ||
                                  may_fuse(source.kind) ||
                                  (op.kind == OpKind::kRope && source.kind == OpKind::kRmsNorm);
      if (fusible_source && source.region == op.region &&
          consumers[static_cast<size_t>(input)] == 1) {
        fused[static_cast<size_t>(op.id)] = true;
      }
    }
  }
}

void StepSimulator::Analysis::find_collective_classes(const Graph& graph) {
  struct Key {
    OpKind kind;
    int64_t bytes;
    const std::vector<std::string>* axes;
  };
  auto before = [](const Key& a, const Key& b) {
    return std::tie(a.kind, a.bytes, *a.axes) < std::tie(b.kind, b.bytes, *b.axes);
  };
  std::map<Key, int, decltype(before)> classes(before);
  collective_class.assign(graph.ops().size(), -1);
  for (const Op& op : graph.ops()) {
    if (!is_collective(op.kind)) {
      continue;
    }
    const int64_t bytes = collective_bytes(graph, op);
    const auto [found, added] = classes.try_emplace(Key{op.kind, bytes, &op.attrs.mesh_axes},
                                                    static_cast<int>(class_op.size()));
    if (added) {
      class_op.push_back(&op);
      class_bytes.push_back(static_cast<double>(bytes));
    }
    collective_class[static_cast<size_t>(op.id)] = found->second;
  }
}

void StepSimulator::Analysis::find_chain_links(const Graph& graph) {
  if (!chain_producer_begin.empty()) {
    return;
  }
  chain_producer_begin.reserve(graph.ops().size() + 1);
  for (const Op& op : graph.ops()) {
    chain_producer_begin.push_back(static_cast<int>(chain_producers.size()));
    for (const TensorId input : op.inputs) {
      const int producer = graph.producer(input);
      if (producer >= 0 && graph.ops()[static_cast<size_t>(producer)].region == op.region) {
        chain_producers.push_back(producer);
      }
    }
  }
  chain_producer_begin.push_back(static_cast<int>(chain_producers.size()));
}

StepSimulator::Analysis::ContextCosts& StepSimulator::Analysis::context_costs(
    const Graph& graph, const CostContext& context) {
  auto found = std::find_if(costs.begin(), costs.end(),
                            [&](const ContextCosts& entry) { return entry.context == context; });
  if (found == costs.end()) {
    // Found before the new entry is added: a deque keeps references to its entries valid.
    const auto shared = std::find_if(costs.begin(), costs.end(), [&](const ContextCosts& entry) {
      return same_outside_attention(entry.context, context);
    });
    ContextCosts* outside_attention = shared == costs.end() ? nullptr : &*shared;
    costs.push_back({context, std::vector<OpCost>(graph.ops().size()),
                     std::vector<bool>(graph.ops().size(), false), outside_attention});
    found = costs.end() - 1;
    if (found->outside_attention == nullptr) {
      found->outside_attention = &*found;
    }
  }
  return *found;
}

const OpCost& StepSimulator::Analysis::compute_cost(const Graph& graph, const Op& op,
                                                    ContextCosts& context) {
  const auto id = static_cast<size_t>(op.id);
  ContextCosts& kept = op_kind_traits(op.kind).attention ? context : *context.outside_attention;
  if (!kept.known[id]) {
    kept.cost[id] = cost_compute_op(graph, op, kept.context, fused[id]);
    kept.known[id] = true;
  }
  return kept.cost[id];
}

const OpCost& StepSimulator::Analysis::compute_cost(const Graph& graph, const Op& op,
                                                    const CostContext& context) {
  return compute_cost(graph, op, context_costs(graph, context));
}

void StepSimulator::Analysis::use_mesh(const DeviceMesh& mesh, const MechanismSet& mechanisms) {
  if (!collective_mesh.has_value() || !same_layout(*collective_mesh, mesh) ||
      collective_mechanisms != mechanisms) {
    collective_mesh = mesh;
    collective_mechanisms = mechanisms;
    collective_times.assign(class_op.size(), CollectiveTime{});
    collective_known.assign(class_op.size(), false);
    collective_sums.clear();
    continuation_fusion = {};
  }
}

const StepSimulator::Analysis::CollectiveSums* StepSimulator::Analysis::collective_sums_for(
    const CostContext& cost, bool sparse_core_offload) const {
  for (const CollectiveSums& sums : collective_sums) {
    if (sums.sparse_core_offload == sparse_core_offload && sums.cost == cost) {
      return &sums;
    }
  }
  return nullptr;
}

const CollectiveTime& StepSimulator::Analysis::collective(const Op& op, const DeviceMesh& mesh,
                                                          const Slice& slice) {
  const auto id = static_cast<size_t>(collective_class[static_cast<size_t>(op.id)]);
  if (!collective_known[id]) {
    const Op& first = *class_op[id];
    collective_times[id] = collective_time(first.kind, class_bytes[id], first.attrs.mesh_axes, mesh,
                                           slice, collective_mechanisms);
    collective_known[id] = true;
  }
  return collective_times[id];
}

}  // namespace tpusim
