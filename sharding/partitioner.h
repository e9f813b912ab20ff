// sharding/partitioner.h: rewrites the global training step into ONE per-device SPMD program.
//
// Every tensor gets a layout from logical_axis_rules (which mesh axes split each dim); each tensor
// of the per-device program holds one device's shard (local sizes, padded up when an axis does
// not divide, as XLA does). Each op is computed in a layout derived from its output's, and the
// partitioner inserts the collectives that make that possible, tagged with their mesh axes:
//   - all_gather of an input split on an axis the op needs whole (FSDP weight gathers, sequence-
//     parallel activations, K/V over context);
//   - reduce_scatter / all_reduce of partial sums when a contracted dim is split (tensor-parallel
//     out projections, gradient reductions over data/fsdp);
//   - all_to_all when an axis moves from tokens to experts (expert-parallel dispatch/combine);
//   - small all_reduces of statistics for norms and cross-entropy over split dims;
//   - dynamic_slice (no communication) where an op needs less than a device holds.
// Dropless MoE (model/ir/op.h: ragged rows, grouped matmuls) under expert parallelism: each
// device sends every expert shard one block of rows, sized for the worst case (every local token
// choosing min(E/ep, k) of that shard's experts: MaxText's ragged_all_to_all buffer of
// ep x B_l x S x min(E_l, k) rows), so no routing can overflow it; the grouped matmuls and the
// ragged all-to-alls count the rows balanced routing fills (routed_fraction), i.e. MaxText's
// B*S*k FLOPs and the rows a ragged all-to-all really moves, while the memory model sees the
// whole buffers, as XLA allocates them.
// The same program is read by the performance model and the functional engine.
//
// Example (sharding/step_program.h builds the step and the mesh from a config this way):
//   const Config config = Config::load("", {"model_name=llama2-7b", "compile_topology=v5p-128"});
//   const StepProgram built = build_step_program(config);
//   PartitionedProgram program =
//       partition(*built.step, LogicalAxisRules::from_config(config), built.mesh);
//   program.graph.to_text();  // ... all_gather layer/mlp/wi_0/gathered[embed:4096,mlp:14336] over
//   {fsdp}
#pragma once

#include <string>
#include <vector>

#include "common/mechanisms.h"
#include "hw/slice.h"
#include "model/autodiff/training_step.h"
#include "sharding/device_mesh.h"
#include "sharding/logical_rules.h"
#include "sharding/size_decisions.h"

namespace tpusim {

class Config;

struct PaddingNote {
  std::string tensor;
  std::string dim;
  int64_t global_size = 0;
  int64_t shards = 1;
  int64_t padded_size = 0;  // global size after padding: shards x local

  friend bool operator==(const PaddingNote&, const PaddingNote&) = default;
};

struct PartitionedProgram {
  Graph graph;  // per-device program
  DeviceMesh mesh;
  std::vector<PaddingNote> padding;
  std::vector<TensorId> local_of_global;  // global tensor id -> its local tensor
  // The choices that compared sizes, with their outcomes (sharding/program_resize.h re-sizes the
  // program for another mesh where they come out the same).
  SizeDecisions size_decisions;
};

// `mechanisms`: reduction_reassociation rewrites the program unless switched off.
PartitionedProgram partition(const TrainingStep& step, const LogicalAxisRules& rules,
                             const DeviceMesh& mesh,
                             const MechanismSet& mechanisms = MechanismSet());

// Bytes a collective op is charged for: the per-device array it gathers into, reduces, or
// exchanges (V in docs/reference/hardware.md §2). 0 for non-collectives.
int64_t collective_bytes(const Graph& graph, const Op& op);

}  // namespace tpusim
