// sharding/reassociate_reductions.h: one reduction of a sum of partial sums instead of a sum of
// reductions, as XLA's ReduceScatterReassociate and AllReduceReassociate passes rewrite
// add(reduce_scatter(a), reduce_scatter(b)) into reduce_scatter(add(a, b)).
//
// Where it matters: under tensor parallelism the backward pass of a layer's input projections
// (q, k, v; or an MLP's wi_0 and wi_1) gives each a partial sum of the input's gradient over the
// tensor axis. The partitioner reduces each where it is computed and the autodiff sums the
// results (`.../grad_sum`); XLA moves the sum before the reduction, so one reduce-scatter runs
// where the program had three (attention) or two (a gated MLP).
//
// The rewrite takes a sum of two reductions of the same kind (reduce-scatter or all-reduce, a
// sum) over the same mesh axes, of activation gradients read by nothing but that sum, whose
// partial inputs nothing else reads; a chain of such sums (x + y + z) becomes one sum of the
// partials and one reduction, placed where the last sum was. Everything else keeps its order.
// The bytes each device reduces are those of one operand, not of all of them; the sums run on
// the partials (larger by the reduction's group) where they ran on shards.
//
// Example (E128-1, tensor=16): pre_attention_norm's gradient from the value, key and query
// projections: 3 reduce-scatters of 640 MiB and 2 adds of shards -> 2 adds of partials and 1
// reduce-scatter.
//   Graph& graph = program.graph;
//   int removed = reassociate_reductions(graph);  // 2: reductions that no longer run
#pragma once

#include "model/ir/graph.h"
#include "sharding/size_decisions.h"

namespace tpusim {

// Rewrites `graph` in place; returns how many reductions it removed (0: the graph is unchanged).
// Each comparison of two partial sums' local shapes goes to `decisions` when given.
int reassociate_reductions(Graph& graph, SizeDecisions* decisions = nullptr);

// Same dtype, dim names and local sizes: two partial sums that can be added before one reduction.
bool same_local_shape(const Tensor& a, const Tensor& b);

}  // namespace tpusim
