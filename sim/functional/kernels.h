// sim/functional/kernels.h: the numerics of every compute op of the IR, on one device's shards.
//
// run_kernel() executes one non-collective op of a per-device program: it reads the local input
// tensors and writes the local outputs (already allocated with the right shapes). Semantics of
// each op kind are documented in its family's file under sim/functional/kernels/, next to its
// implementation; they match what the partitioner assumes (partial sums over split contracted dims,
// statistics inputs for norms and cross-entropy over split dims, global positions for RoPE and
// causal masks).
//
// Example:
//   run_kernel(graph, op, {&x, &w}, {&y}, device);
#pragma once

#include <vector>

#include "model/ir/graph.h"
#include "sim/functional/device_context.h"
#include "sim/functional/tensor_data.h"

namespace tpusim {

// Throws std::logic_error for an op kind that is not a compute op (collectives are the
// Communicator's) or for shapes that do not match the op's tensors.
void run_kernel(const Graph& graph, const Op& op, const std::vector<const TensorData*>& inputs,
                const std::vector<TensorData*>& outputs, const DeviceContext& device);

}  // namespace tpusim
