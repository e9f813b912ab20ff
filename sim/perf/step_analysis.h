// sim/perf/step_analysis.h: what the step scheduler needs about a program whatever the options
// (StepSimulator::Analysis), kept between runs of one StepSimulator: each region's ops, the
// carries, which ops only prepare weights, which elementwise ops fuse into their producer (XLA
// output fusion), each compute op's cost per cost context, each class of collectives' time and
// the collective bounds' sums per placement (worked out on first use), and the storage a run
// reuses.
// Internal to sim/perf (step_simulator.cpp); include sim/perf/step_simulator.h to time a step.
//
// Example:
//   StepSimulator::Analysis analysis(program.program.graph);
//   analysis.compute_cost(graph, op, context).seconds;  // costed once per (op, context)
//   analysis.use_mesh(mesh, mechanisms);                // before timing collectives on `mesh`
#pragma once

#include <array>
#include <cstddef>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "model/ir/op_kind_traits.h"
#include "sharding/device_mesh.h"
#include "sim/perf/collective_cost.h"
#include "sim/perf/op_cost.h"
#include "sim/perf/step_simulator.h"
#include "sim/perf/timeline.h"

namespace tpusim {

// The resources ops run on besides the TensorCore.
// Offloaded gathers and reductions run on different SparseCores of the chip (recipes pin
// all-gathers to one: xla_tpu_use_single_sparse_core_for_all_gather_offload), so each kind has
// its own queue, as XLA also keeps one collective of each kind in flight.
// kCompute only records when the TensorCore (a GPU's SMs) is busy, for collectives that take
// a share of it (collective_compute_share).
enum class Resource { kIci, kDcn, kSparseCore, kSparseCoreReduce, kHost, kCompute };
constexpr size_t kResources = 6;

// Where a collective runs and for how long, before its share of the iterations.
struct LinkTime {
  Resource resource = Resource::kIci;
  double seconds = 0;
};

struct StepSimulator::Analysis {
  Analysis(const Graph& graph, bool matmul_output_fusion) {
    const size_t tensors = graph.tensors().size();
    const size_t ops = graph.ops().size();
    carry_source.assign(tensors, -1);
    entry_source.assign(tensors, -1);
    for (const Graph::Carry& carry : graph.carries()) {
      // A scanned region's input has two carries: first the value entering the loop (the
      // previous region's output), then the loop's own (the last iteration's output).
      TensorId& source = carry_source[static_cast<size_t>(carry.to)];
      if (source >= 0) {
        entry_source[static_cast<size_t>(carry.to)] = source;
      }
      source = carry.from;
    }
    weight_only.assign(ops, false);
    compute.assign(ops, false);
    region_ops.resize(graph.regions().size());
    for (const Op& op : graph.ops()) {
      region_ops[static_cast<size_t>(op.region)].push_back(&op);
      compute[static_cast<size_t>(op.id)] = is_compute(op.kind);
      if (!is_compute(op.kind)) {
        not_compute_ops.push_back(&op);
      }
      bool only_weights = !op.inputs.empty();
      for (const TensorId input : op.inputs) {
        const Tensor& tensor = graph.tensor(input);
        const int producer = graph.producer(input);
        const bool weight = (tensor.kind == TensorKind::kParameter && producer < 0) ||
                            (producer >= 0 && weight_only[static_cast<size_t>(producer)]);
        only_weights = only_weights && weight;
      }
      weight_only[static_cast<size_t>(op.id)] = only_weights && op.phase != Phase::kOptimizer;
    }
    fused.assign(ops, false);
    find_fusions(graph, matmul_output_fusion);
    find_collective_classes(graph);
  }

  // Elementwise ops that read an elementwise op's only output fuse into it (XLA loop fusion),
  // and so do those that read a matmul's only output where the matmul takes them (XLA:TPU's
  // output fusion; a cuBLAS matmul on GPU writes its result to HBM first).
  void find_fusions(const Graph& graph, bool matmul_output_fusion);

  // Collectives of the same kind, bytes and mesh axes take the same time on any mesh
  // (collective_time reads nothing else of them): each class is timed once per placement.
  void find_collective_classes(const Graph& graph);

  struct ContextCosts;
  // cost_compute_op of `op` under `context`, computed once per (op, context), and once for all
  // contexts that differ only in attention when `op` is not an attention op.
  const OpCost& compute_cost(const Graph& graph, const Op& op, const CostContext& context);
  // The same with the context's costs looked up once (context_costs) for many ops.
  const OpCost& compute_cost(const Graph& graph, const Op& op, ContextCosts& context);
  // The costs kept for `context` (added on first use; the reference stays valid).
  ContextCosts& context_costs(const Graph& graph, const CostContext& context);

  // StepSimulator::chain_bound's links, found on first need: each op's producers in its own
  // region (what a chain walk waits for), by op id.
  void find_chain_links(const Graph& graph);

  // Before a run on `mesh` under `mechanisms`: the cached collective times stay valid only on the
  // same placement and mechanisms.
  void use_mesh(const DeviceMesh& mesh, const MechanismSet& mechanisms);

  // collective_time of `op` on the mesh of use_mesh, computed once per (class, placement).
  const CollectiveTime& collective(const Op& op, const DeviceMesh& mesh, const Slice& slice);

  // What StepSimulator::collective_bounds sums over the ops on the mesh of use_mesh, under the
  // options it reads: the cost context (compute ops carrying collective steps) and the SparseCore
  // offload (which queue a collective takes). collective_matmul changes no op's time or link, so
  // its two values share one entry.
  struct CollectiveSums {
    CostContext cost;
    bool sparse_core_offload = false;
    double driven_microbatch = 0;  // continuation-fused collective steps, one microbatch
    double driven_optimizer = 0;   // the same in the optimizer update
    double busiest_link = 0;
  };
  // Of those sums, the continuation-fused steps the compute ops carry: the same on every mesh
  // where some collective is TensorCore-driven, by cost context (use_mesh keeps them).
  struct DrivenSums {
    CostContext cost;
    double microbatch = 0;
    double optimizer = 0;
  };
  // The sums kept for those options on this mesh, or nullptr.
  const CollectiveSums* collective_sums_for(const CostContext& cost,
                                            bool sparse_core_offload) const;

  struct ContextCosts {
    CostContext context;
    std::vector<OpCost> cost;  // by op id
    std::vector<bool> known;   // by op id
    // The first kept context that differs from this one only in attention
    // (same_outside_attention): its entries serve every other op (this one's if none).
    ContextCosts* outside_attention = nullptr;
  };
  std::vector<std::vector<const Op*>> region_ops;  // by region, in program order
  std::vector<TensorId> carry_source;              // by tensor id: the last carry into it
  std::vector<TensorId> entry_source;              // by tensor id: the carry before, if two
  std::vector<const Op*> not_compute_ops;          // collectives, transfers: in program order
  std::vector<bool> weight_only;                   // by op id
  std::vector<bool> compute;                       // by op id: is_compute(kind), asked per walk
  std::vector<bool> fused;                         // by op id
  std::deque<ContextCosts> costs;
  std::optional<DeviceMesh> collective_mesh;         // the mesh collective_times are for
  MechanismSet collective_mechanisms;                // and the mechanisms
  std::vector<int> collective_class;                 // by op id: its class, -1 if not a collective
  std::vector<const Op*> class_op;                   // by class: its first op
  std::vector<double> class_bytes;                   // by class: collective_bytes
  std::vector<CollectiveTime> collective_times;      // by class
  std::vector<bool> collective_known;                // by class
  std::vector<CollectiveSums> collective_sums;       // on that mesh, by options
  std::vector<DrivenSums> driven_sums;               // on any mesh, by cost context
  std::vector<std::optional<LinkTime>> class_links;  // by class: a collective_sums call's own
  // Whether some collective the TensorCore drives crosses ICI on that mesh (continuation fusion),
  // by SparseCore offload off/on: unknown until a Simulator asks.
  std::array<std::optional<bool>, 2> continuation_fusion;
  // StepSimulator::chain_bound over several contexts: each compute op's least cost over them.
  std::vector<CostContext> cheapest_of;
  std::vector<double> cheapest;  // by op id
  // find_chain_links: op id's producers in its region are chain_producers[begin[id], begin[id+1]).
  std::vector<int> chain_producer_begin;
  std::vector<int> chain_producers;
  // A chain walk's state, by op id: when its outputs are ready, and an overlapped all-gather's
  // last chunk (-inf for every other op).
  std::vector<double> chain_output_ready;
  std::vector<double> chain_finish_not_before;
  // A run's working state, kept between runs so that its storage is reused.
  std::vector<double> ready;                       // by tensor id
  std::vector<double> finish_not_before;           // by tensor id
  std::vector<std::pair<double, double>> op_span;  // by op id
  std::array<Timeline, kResources> timelines;
};

}  // namespace tpusim
