// model/ir/op_kind_traits.h: one row of facts per op kind, read wherever code asks what a kind is.
//
// The row holds what the cost model, the fusion pass, the partitioner, the memory model and the
// functional engine ask of a kind (its name, which collective it is, whether it moves a tensor to
// the host, may fuse into its producer, writes in place, has a kernel), so none of them keeps a
// list of its own. The work that differs per kind (FLOPs, cost, partition rule, VJP, kernel) is a
// switch that names every kind, with no `default:` arm, so -Wswitch points at each place a new kind
// must be handled; docs/design.md ("Adding an op kind") is the checklist.
//
// Example:
//   op_kind_traits(OpKind::kRope).fuses_into_producer    // true: XLA fuses it into its producer
//   op_kind_traits(OpKind::kAllReduce).collective         // Collective::kAllReduce
//   op_kind_from_name("all_reduce")                       // OpKind::kAllReduce
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "model/ir/op.h"

namespace tpusim {

// The number of OpKind enumerators: one past the last. A new kind moves it (a static_assert in
// op_kind_traits.cpp fails until it does, and until the kind has its row).
inline constexpr size_t kOpKindCount = static_cast<size_t>(OpKind::kBlockTopK) + 1;

// Which collective a kind is; kNone for an op that runs on each device alone.
enum class Collective {
  kNone,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kCollectivePermute
};

struct OpKindTraits {
  OpKind kind = OpKind::kEinsum;
  const char* name = "";  // as op_kind_name() prints it
  Collective collective = Collective::kNone;
  // Copies a tensor between HBM and host memory (remat policy "offload"), no TensorCore work.
  bool host_transfer = false;
  // Attention or its gradient: a cost of its own per attention kernel (flash or dot product).
  bool attention = false;
  // May run inside its producer's kernel (XLA loop or output fusion) instead of its own.
  bool fuses_into_producer = false;
  // Its output has an operand's shape, element by element: XLA may write it into that operand.
  bool writes_in_place = false;
  // The functional engine runs it through run_kernel (collectives run on the Communicator).
  bool has_kernel = false;
};

// The row of `kind`; throws std::out_of_range for a value that is not an enumerator.
const OpKindTraits& op_kind_traits(OpKind kind);

// The kind named `name` (op_kind_name's spelling), or nullopt.
std::optional<OpKind> op_kind_from_name(std::string_view name);

// Elementwise ops and RoPE: they may fuse into the op that produces their input (step_analysis
// decides whether they do; step_bounds charges them as fused for a lower bound).
bool may_fuse(OpKind kind);

// Runs on the TensorCore: neither a collective nor a host transfer.
bool is_compute(OpKind kind);

// A collective that combines values (all-reduce, reduce-scatter) rather than moving them.
bool is_reducing_collective(OpKind kind);

}  // namespace tpusim
