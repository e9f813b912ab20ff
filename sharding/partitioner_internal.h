// sharding/partitioner_internal.h: the Partitioner class behind partition()
// (sharding/partitioner.h), shared by the files that implement it, one concept each:
//   partitioner.cpp          the walk over the global graph, layouts, resharding, generic ops
//   partition_einsum.cpp     einsums (and lookups as one-hot einsums): the named-axis matmul rule
//   partition_reduction.cpp  norms and cross-entropy over a split dim (partial statistics)
//   partition_attention.cpp  attention and its gradient (heads, context parallelism)
//   partition_moe.cpp        MoE dispatch/combine all-to-alls and dropless buffer sizes
//   partition_pipeline.cpp   pipeline stage hand-overs and gathered-once stage weights
// Not part of the public interface: include sharding/partitioner.h instead.
//
// Example (inside the implementation):
//   Partitioner partitioner(step, rules, mesh);
//   PartitionedProgram program = partitioner.run();
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "common/error.h"
#include "sharding/layout.h"
#include "sharding/partitioner.h"

namespace tpusim::partitioner_internal {

inline bool contains(const AxisList& axes, int axis) {
  return axes.contains(axis);
}

inline AxisList without(const AxisList& axes, const AxisList& removed) {
  return axes.without(removed);
}

// Axes of each dim in mesh order (major to minor), so equal splits compare equal.
inline Layout normalized(Layout layout) {
  for (AxisList& axes : layout) {
    axes.sort();
  }
  return layout;
}

inline Layout normalized(const std::vector<std::vector<int>>& axes_per_dim) {
  Layout layout;
  for (const std::vector<int>& axes : axes_per_dim) {
    AxisList sorted(axes);
    sorted.sort();
    layout.push_back(sorted);
  }
  return layout;
}

// Axes by dim name. A tensor has a few dims, so a linear search over names beats a std::map of
// strings. Dim names are interned (model/ir/name.h), so a key given as a Name is matched to a Name
// by pointer; a key given as text (an op attribute's contracted dim, a dim that must stay whole)
// is matched by its text.
class AxesByName {
 public:
  const AxisList* find(const Name& name) const {
    const Entry* found =
        std::find_if(begin(), end(), [&](const Entry& entry) { return entry.matches(name); });
    return found == end() ? nullptr : &found->axes;
  }
  // The entry for `name`, added empty if missing (as std::map::operator[]).
  AxisList& operator[](const Name& name) {
    Entry* found =
        std::find_if(begin(), end(), [&](const Entry& entry) { return entry.matches(name); });
    return found != end() ? found->axes : add({&name.str(), name.str(), {}});
  }
  AxisList& operator[](const std::string& name) {
    for (Entry& entry : *this) {
      if (entry.text == name) {
        return entry.axes;
      }
    }
    return add({nullptr, name, {}});
  }
  void erase(const std::string& name) {
    size_ = static_cast<size_t>(
        std::remove_if(begin(), end(), [&](const Entry& entry) { return entry.text == name; }) -
        begin());
  }

 private:
  // Dims of the output plus contracted dims (kept inline: no heap allocation).
  static constexpr size_t kCapacity = 16;
  // No default member initializers: the array of them is made for every op partitioned, and
  // only the first size_ are ever read.
  struct Entry {
    const std::string* interned;  // the Name's text, when the key is a Name
    std::string_view text;
    AxisList axes;

    bool matches(const Name& name) const {
      return interned != nullptr ? interned == &name.str() : text == name.str();
    }
  };
  AxisList& add(const Entry& entry) {
    if (size_ == kCapacity) {
      throw std::logic_error("AxesByName: more than 16 dim names");
    }
    entries_[size_] = entry;
    return entries_[size_++].axes;
  }
  const Entry* begin() const { return entries_.data(); }
  const Entry* end() const { return entries_.data() + size_; }
  Entry* begin() { return entries_.data(); }
  Entry* end() { return entries_.data() + size_; }

  std::array<Entry, kCapacity> entries_;  // the first size_ are used
  size_t size_ = 0;
};

// `first` + `second` in one allocation: names of the tensors the partitioner invents.
inline std::string joined(std::string_view first, std::string_view second) {
  std::string text;
  text.reserve(first.size() + second.size());
  text.append(first).append(second);
  return text;
}

// A dim as the partitioner plans with it: name (a global tensor's dim's, which outlives the
// plan: a pointer, so that an array of them is made without constructing a Name each) and mesh
// axes.
struct PlanDim {
  const Name* name;
  AxisList axes;
};

// A tensor's dims as planned, plus a lookup's one-hot dim: kept inline (fixed capacity, as
// Layout), so planning an operand allocates nothing.
class PlanDims {
 public:
  static constexpr size_t kCapacity = Layout::kCapacity + 1;

  void push_back(const PlanDim& dim) {
    if (size_ == kCapacity) {
      throw std::logic_error("PlanDims: an operand with more than 9 dims");
    }
    dims_[size_++] = dim;
  }
  const PlanDim* begin() const { return dims_.data(); }
  const PlanDim* end() const { return dims_.data() + size_; }

 private:
  std::array<PlanDim, kCapacity> dims_;  // the first size_ are used
  size_t size_ = 0;
};

// One entry per output of an op (most have one, attention's gradient up to six), inline.
using Layouts = boost::container::small_vector<Layout, 3>;
using AxisLists = boost::container::small_vector<AxisList, 3>;

// The local tensors a region has made of a global tensor in other layouts than its own (gathered,
// exchanged or sliced copies), so that a second reader in that layout reuses them. A region makes
// a few dozen: a flat list searched by tensor id first, reused from region to region.
class Alternates {
  struct Entry {
    TensorId global = -1;
    Layout layout;
    TensorId local = -1;
  };
  // The entry of (global, layout) in `self`'s entries, or null (for the const and the mutable
  // caller alike).
  template <typename Self>
  static auto* find_entry(Self& self, TensorId global, const Layout& layout) {
    const auto found = std::find_if(
        self.entries_.begin(), self.entries_.end(),
        [&](const Entry& entry) { return entry.global == global && entry.layout == layout; });
    return found == self.entries_.end() ? nullptr : &*found;
  }
  std::vector<Entry> entries_;

 public:
  // The local tensor of `global` in `layout`, or -1.
  TensorId find(TensorId global, const Layout& layout) const {
    const Entry* entry = find_entry(*this, global, layout);
    return entry != nullptr ? entry->local : -1;
  }
  // Records (or replaces) the local tensor of `global` in `layout`.
  void set(TensorId global, const Layout& layout, TensorId local) {
    if (Entry* entry = find_entry(*this, global, layout)) {
      entry->local = local;
    } else {
      entries_.push_back({global, layout, local});
    }
  }
  // Forgets every entry, keeping the storage.
  void clear() { entries_.clear(); }
};

// Values per row a norm (or its gradient) needs when its reduced dim is split across devices.
inline int norm_statistics_count(const Op& op) {
  switch (op.kind) {
    case OpKind::kRmsNorm:
      return 1;
    case OpKind::kLayerNorm:
      return 2;
    // inputs dy, x[, scale] (RMS, scale-free without it) or dy, x, scale, bias (LayerNorm)
    case OpKind::kNormGrad:
      return op.inputs.size() >= 4 ? 4 : 2;
    case OpKind::kEinsum:
    case OpKind::kElementwise:
    case OpKind::kRope:
    case OpKind::kAttention:
    case OpKind::kEmbeddingLookup:
    case OpKind::kCrossEntropy:
    case OpKind::kMoeRouter:
    case OpKind::kMoeDispatch:
    case OpKind::kMoeCombine:
    case OpKind::kAttentionGrad:
    case OpKind::kEmbeddingGrad:
    case OpKind::kCrossEntropyGrad:
    case OpKind::kRouterGrad:
    case OpKind::kReduceSum:
    case OpKind::kNormStatistics:
    case OpKind::kCrossEntropyStatistics:
    case OpKind::kDynamicSlice:
    case OpKind::kAdamUpdate:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kAllToAll:
    case OpKind::kCollectivePermute:
    case OpKind::kHostOffload:
    case OpKind::kHostLoad:
    case OpKind::kSinkhorn:
    case OpKind::kSinkhornGrad:
    case OpKind::kBlockPool:
    case OpKind::kBlockPoolGrad:
    case OpKind::kBlockTopK:
      break;
  }
  throw std::logic_error(std::string("norm statistics of a non-norm op: ") + op_kind_name(op.kind));
}

class Partitioner {
 public:
  Partitioner(const TrainingStep& step, const LogicalAxisRules& rules, const DeviceMesh& mesh,
              const MechanismSet& mechanisms)
      : global_(step.graph), rules_(rules), mesh_(mesh), mechanisms_(mechanisms) {}

  PartitionedProgram run();

 private:
  int64_t shards(const AxisList& axes) const { return mesh_.shape.product_of(axes); }
  TensorId local(TensorId global) const { return local_[static_cast<size_t>(global)]; }
  const Layout& layout(TensorId global) const { return layouts_[static_cast<size_t>(global)]; }

  // The local tensor of `global` in `layout_in`, named global's name + `suffix` (a padded dim
  // is noted for the tensor's own local copy, the one without a suffix).
  TensorId make_local(const Tensor& global, const Layout& layout_in, int region,
                      std::string_view suffix);

  // The source of a carry on this device. In a pipeline stage's loop (forward or backward) the
  // residual stream (or its gradient) goes to the next stage (back to the previous one) after
  // every layers_per_stage layers: a collective permute over `stage` (MaxText's shift of the
  // stage outputs), which the carry then reads. With delayed forwarding the stage reads it an
  // iteration later: the next iteration does not wait for it (the carry reads the stage's own
  // output, and the permute runs beside the next iteration's layers).
  // MaxText's loop moves two more microbatch-sized buffers a stage each iteration, which no
  // layer of the iteration waits for: the input stream (state_io: the next microbatches make
  // their way to stage 0, the finished ones away from the last) and, with circular storage, the
  // previous iteration's last-stage output on its way into storage (circ_storage_mover). They
  // run beside the layers on the same links.
  TensorId pipeline_hand_over(const Graph::Carry& carry);

  // pipeline_fsdp_ag_once: a stage's weights are gathered before its loop, once per layer it
  // holds, and their gradients reduce-scattered after it (summed gathered meanwhile); in the loop
  // those collectives run in held layers / iterations of its iterations.
  void gather_pipeline_weights_once();

  // Emits a collective over `axes`, named global's name + `suffix` ("/all_gather"); writes `into`
  // when given, else a new local tensor of that name.
  TensorId collective(OpKind kind, std::string_view suffix, TensorId input, const Tensor& global,
                      const Layout& result_layout, const AxisList& axes, int region,
                      ReduceOp reduce = ReduceOp::kSum, TensorId into = -1);

  // The local tensor of `global` in layout `target`, inserting collectives or slices as needed.
  TensorId reshard(TensorId global, const Layout& target_in, int region);

  // Layout of `global`'s dims following `reference` by dim name; dims `reference` lacks keep
  // their own axes unless listed in `must_be_whole`.
  Layout follow(TensorId global, const AxesByName& reference,
                const std::set<std::string>& must_be_whole = {}) const;

  AxesByName by_name(TensorId global, const Layout& layout_in) const;

  // Emits `op` computed with its outputs in `computed` layouts, then reduces partial sums over
  // `partial` axes into each output's own layout.
  void emit(const Op& op, const TensorIds& inputs, const Layouts& computed, const AxisList& partial,
            ReduceOp reduce = ReduceOp::kSum);

  // As emit(), with each output's own partial-sum axes.
  void emit_with_partials(const Op& op, const TensorIds& inputs, const Layouts& computed,
                          const AxisLists& partials, ReduceOp reduce = ReduceOp::kSum);

  // Axes of `input`'s dims that `output` lacks: an output that sums over those dims (a norm
  // scale's gradient sums over batch and length) holds partial sums over these axes.
  AxisList summed_axes(TensorId input, const Layout& input_layout, TensorId output) const;

  // Turns a computed (possibly partial) output into the tensor's own layout.
  void finish_output(TensorId global, TensorId value, const Layout& computed,
                     const AxisList& partial, int region, ReduceOp reduce);

  // Einsum over named dims; `lhs_dims`/`rhs_dims` describe the operands (virtual one-hot operands
  // of lookups have no tensor: their id is -1).
  void partition_einsum(const Op& op, const std::array<TensorId, 2>& operands,
                        const std::array<PlanDims, 2>& operand_dims,
                        std::span<const std::string> contracted);

  PlanDims plan_dims(TensorId global) const;

  // Generic op: computed in its first output's layout; inputs follow by dim name, dims in
  // `must_be_whole` are gathered.
  void partition_following_output(const Op& op, const std::set<std::string>& must_be_whole = {});

  // Norms and cross-entropy reduce over a dim; when it is split, partial statistics are
  // all-reduced first (small: one or a few floats per row).
  void partition_reduction(const Op& op, const std::string& reduced_dim, OpKind statistics_kind,
                           int statistics_values, ReduceOp reduce);

  void partition_attention(const Op& op, bool gradient);

  // Dropless MoE (a dispatch with row_experts): the rows of the grouped buffers. Each device's
  // dispatch sends one block of rows to each expert-parallel shard; however unbalanced the
  // routing, a block must hold every local token choosing min(E/ep, k) of that shard's experts
  // (MaxText sizes its ragged_all_to_all buffer the same way: ep x B_l x S x min(E_l, k) rows),
  // unless ragged_buffer_factor > 0 bounds it at that multiple of the balanced rows. Without
  // expert parallelism that is the builder's E x B*S*k/E (up to rounding). The grouped matmuls
  // and ragged all-to-alls then count the fraction of the rows balanced routing fills.
  void size_dropless_buffers();

  // `tensor`'s layout with the expert axes moved from its experts dim onto its expert_tokens dim:
  // how a device holds the rows of its own tokens for every expert, before (dispatch) or after
  // (combine) the all-to-all.
  Layout tokens_local_layout(TensorId tensor, const AxisList& expert_axes) const;

  // An all-to-all of a MoE buffer; a ragged (dropless) one counts the rows it really moves.
  TensorId exchange(TensorId value, const Tensor& global, const Layout& result,
                    const AxisList& expert_axes, int region, bool ragged, TensorId into = -1);

  // MoE dispatch/combine: expert-parallel axes move between the token dims and the experts dim.
  // `grouped_input`: which input is the expert-grouped tensor for ops that read one (combine: 0,
  // the routing-weight gradient: 1); dispatch writes it (and, dropless, row_experts) instead.
  void partition_moe_exchange(const Op& global_op, size_t grouped_input = 0);

  // Adds an op named `name` + `suffix` to the program in the phase of the op being partitioned (a
  // recompute clone's collectives are recompute work too).
  int add_op(OpKind kind, std::string_view name, std::string_view suffix, const TensorIds& inputs,
             const TensorIds& outputs, const OpAttrs& attrs, int region);

  void partition_op(const Op& op);

  const Graph& global_;
  const LogicalAxisRules& rules_;
  const DeviceMesh& mesh_;
  MechanismSet mechanisms_;
  Graph out_;
  Graph extra_;  // global descriptions of tensors the partitioner invents (statistics)
  std::vector<Layout> layouts_;
  std::vector<TensorId> local_;
  Alternates alternates_;  // per region
  std::vector<PaddingNote> padding_;
  SizeDecisions decisions_;  // the choices that compare sizes (size_decisions.h)
  Phase current_phase_ = Phase::kForward;
  // Reused from op to op, so that naming a tensor or an op and listing a collective's mesh axes
  // allocate nothing once they are large enough (the graph copies them into kept buffers).
  std::string tensor_name_;
  std::string op_name_;
  OpAttrs collective_attrs_;
  // Dropless MoE (size_dropless_buffers): the global expert_tokens size the rows need (0: no
  // dropless MoE), and the fraction of the rows balanced routing fills.
  int64_t dropless_expert_tokens_ = 0;
  double dropless_fraction_ = 1;
};

}  // namespace tpusim::partitioner_internal
