#include "sharding/partitioner.h"

#include <numeric>

#include "common/mechanisms.h"
#include "model/ir/op_kind_traits.h"
#include "sharding/partitioner_internal.h"
#include "sharding/reassociate_reductions.h"

namespace tpusim {
namespace partitioner_internal {

namespace {

// mesh_axis_names() interned once: a local dim lists its axes without a lookup per axis.
const std::array<Name, kNumMeshAxes>& interned_mesh_axis_names() {
  static const std::array<Name, kNumMeshAxes> names = [] {
    std::array<Name, kNumMeshAxes> interned;
    for (size_t axis = 0; axis < kNumMeshAxes; ++axis) {
      interned[axis] = mesh_axis_names()[axis];
    }
    return interned;
  }();
  return names;
}

// A tensor's dims' logical names, compared and hashed by their interned copies (model/ir/name.h:
// equal texts share one), so that looking a combination up reads no text.
class LogicalNames {
 public:
  explicit LogicalNames(const Tensor& tensor) {
    if (tensor.dims.size() > names_.size()) {
      throw std::logic_error("Partitioner: a tensor with more than 8 dims: " + tensor.name);
    }
    for (const Dim& dim : tensor.dims) {
      names_[size_++] = &dim.logical.str();
    }
  }
  friend bool operator==(const LogicalNames& a, const LogicalNames& b) {
    return std::equal(a.names_.begin(), a.names_.begin() + a.size_, b.names_.begin(),
                      b.names_.begin() + b.size_);
  }
  struct Hash {
    size_t operator()(const LogicalNames& key) const {
      size_t hash = key.size_;
      for (size_t index = 0; index < key.size_; ++index) {
        hash = hash * 31 + std::hash<const std::string*>{}(key.names_[index]);
      }
      return hash;
    }
  };

 private:
  std::array<const std::string*, Layout::kCapacity> names_{};
  size_t size_ = 0;
};

}  // namespace

PartitionedProgram Partitioner::run() {
  for (const Region& region : global_.regions()) {
    const int copy = out_.add_region(region.name, region.repeat, region.phase,
                                     region.forward_region, region.shared_parameters);
    out_.mutable_region(copy).pipeline = region.pipeline;
  }
  layouts_.resize(global_.tensors().size());
  local_.assign(global_.tensors().size(), -1);
  // A layout depends only on the dims' logical names: resolve each combination once (a step
  // has hundreds of tensors but a few dozen combinations).
  std::unordered_map<LogicalNames, Layout, LogicalNames::Hash> layout_of_logical_names;
  for (const Tensor& tensor : global_.tensors()) {
    const auto [known, added] = layout_of_logical_names.try_emplace(LogicalNames(tensor));
    if (added) {
      known->second = normalized(rules_.shard_dims(tensor.dims, mesh_.shape));
    }
    layouts_[static_cast<size_t>(tensor.id)] = known->second;
  }
  size_dropless_buffers();
  for (const Tensor& tensor : global_.tensors()) {
    local_[static_cast<size_t>(tensor.id)] =
        make_local(tensor, layouts_[static_cast<size_t>(tensor.id)], tensor.region, "");
  }
  // Region by region, each in program order: the ops sorted by region once (a counting sort),
  // rather than a pass over all of them per region.
  std::vector<size_t> region_start(global_.regions().size() + 1, 0);
  for (const Op& op : global_.ops()) {
    ++region_start[static_cast<size_t>(op.region) + 1];
  }
  std::partial_sum(region_start.begin(), region_start.end(), region_start.begin());
  std::vector<const Op*> by_region(global_.ops().size());
  std::vector<size_t> next(region_start.begin(), region_start.end() - 1);
  for (const Op& op : global_.ops()) {
    by_region[next[static_cast<size_t>(op.region)]++] = &op;
  }
  for (size_t region = 0; region < global_.regions().size(); ++region) {
    alternates_.clear();
    for (size_t at = region_start[region]; at < region_start[region + 1]; ++at) {
      partition_op(*by_region[at]);
    }
  }
  for (const Graph::Carry& carry : global_.carries()) {
    out_.add_carry(pipeline_hand_over(carry), local(carry.to));
  }
  gather_pipeline_weights_once();
  if (mechanisms_.enabled(Mechanism::kReductionReassociation)) {
    reassociate_reductions(out_, &decisions_);
  }
  PartitionedProgram program;
  program.graph = std::move(out_);
  program.mesh = mesh_;
  program.padding = std::move(padding_);
  program.local_of_global = std::move(local_);
  program.size_decisions = std::move(decisions_);
  return program;
}

TensorId Partitioner::make_local(const Tensor& global, const Layout& layout_in, int region,
                                 std::string_view suffix) {
  static const Name kExpertTokens("expert_tokens");
  tensor_name_.assign(global.name).append(suffix);
  const TensorId id = out_.add_tensor_copy(tensor_name_, global.dims, global.dtype, global.kind,
                                           region, global.remat_name);
  std::vector<Dim>& dims = out_.mutable_tensor(id).dims;
  const std::array<Name, kNumMeshAxes>& axis_names = interned_mesh_axis_names();
  for (size_t index = 0; index < dims.size(); ++index) {
    Dim& dim = dims[index];
    if (dim.name == kExpertTokens && dropless_expert_tokens_ > 0) {
      dim.size = dropless_expert_tokens_;
    }
    const int64_t split = shards(layout_in[index]);
    dim.global_size = dim.size;
    dim.sharded_over.clear();
    for (const int axis : layout_in[index]) {
      dim.sharded_over.push_back(axis_names[static_cast<size_t>(axis)]);
    }
    const int64_t local_size = split == 1 ? dim.size : (dim.size + split - 1) / split;
    if (split > 1 && dim.size % split != 0 && suffix.empty()) {
      padding_.push_back({global.name, dim.name, dim.size, split, local_size * split});
    }
    dim.size = local_size;
  }
  return id;
}

TensorId Partitioner::collective(OpKind kind, std::string_view suffix, TensorId input,
                                 const Tensor& global, const Layout& result_layout,
                                 const AxisList& axes, int region, ReduceOp reduce, TensorId into) {
  const TensorId output = into >= 0 ? into : make_local(global, result_layout, region, suffix);
  // Default attributes but the axes, group and reduction; the axes' strings are kept.
  std::vector<std::string> mesh_axes = std::move(collective_attrs_.mesh_axes);
  collective_attrs_ = OpAttrs();
  mesh_axes.resize(axes.size());
  for (size_t index = 0; index < axes.size(); ++index) {
    mesh_axes[index] = mesh_axis_names()[static_cast<size_t>(axes.begin()[index])];
  }
  collective_attrs_.mesh_axes = std::move(mesh_axes);
  collective_attrs_.group_size = shards(axes);
  collective_attrs_.reduce = reduce;
  add_op(kind, global.name, suffix, {input}, {output}, collective_attrs_, region);
  return output;
}

TensorId Partitioner::reshard(TensorId global, const Layout& target_in, int region) {
  const Layout target = normalized(target_in);
  const Layout& current = layout(global);
  if (current == target) {
    return local(global);
  }
  if (const TensorId known = alternates_.find(global, target); known >= 0) {
    return known;
  }
  const Tensor& tensor = global_.tensor(global);
  // Axes that leave one dim and shard another: all-to-all.
  AxisList moved;
  AxisList gathered;
  for (size_t dim = 0; dim < current.size(); ++dim) {
    for (const int axis : current[dim]) {
      if (contains(target[dim], axis)) {
        continue;
      }
      bool reappears = false;
      for (size_t other = 0; other < target.size(); ++other) {
        reappears = reappears || (other != dim && contains(target[other], axis));
      }
      (reappears ? moved : gathered).push_back(axis);
    }
  }
  TensorId value = local(global);
  Layout step = current;
  if (!gathered.empty()) {
    for (AxisList& axes : step) {
      axes = without(axes, gathered);
    }
    value = collective(OpKind::kAllGather, "/all_gather", value, tensor, step, gathered, region);
  }
  if (!moved.empty()) {
    for (size_t dim = 0; dim < step.size(); ++dim) {
      step[dim] = without(step[dim], moved);
      for (const int axis : target[dim]) {
        if (contains(moved, axis)) {
          step[dim].push_back(axis);
        }
      }
    }
    value = collective(OpKind::kAllToAll, "/all_to_all", value, tensor, step, moved, region);
  }
  step = normalized(step);
  if (step != target) {
    const TensorId sliced = make_local(tensor, target, region, "/slice");
    add_op(OpKind::kDynamicSlice, tensor.name, "/slice", {value}, {sliced}, {}, region);
    value = sliced;
  }
  alternates_.set(global, target, value);
  return value;
}

Layout Partitioner::follow(TensorId global, const AxesByName& reference,
                           const std::set<std::string>& must_be_whole) const {
  const Tensor& tensor = global_.tensor(global);
  Layout result = layout(global);
  for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
    const Name& name = tensor.dims[dim].name;
    if (!must_be_whole.empty() && must_be_whole.contains(name.str())) {
      result[dim].clear();
    } else if (const AxisList* found = reference.find(name); found != nullptr) {
      result[dim] = *found;
    }
  }
  // An axis may shard only one dim: drop later repeats. A dim's axes are then sorted (mesh order),
  // rebuilt only when an axis repeats or is out of order (rarely: most already are).
  uint32_t used = 0;  // bit per mesh axis
  for (AxisList& axes : result) {
    uint32_t own = 0;
    bool rebuild = false;
    int previous = -1;
    for (const int axis : axes) {
      const uint32_t bit = 1U << static_cast<unsigned>(axis);
      rebuild = rebuild || ((used | own) & bit) != 0 || axis < previous;
      own |= bit;
      previous = axis;
    }
    if (!rebuild) {
      used |= own;
      continue;
    }
    AxisList kept;
    for (const int axis : axes) {
      const uint32_t bit = 1U << static_cast<unsigned>(axis);
      if ((used & bit) == 0) {
        used |= bit;
        kept.push_back(axis);
      }
    }
    kept.sort();
    axes = kept;
  }
  return result;
}

AxesByName Partitioner::by_name(TensorId global, const Layout& layout_in) const {
  AxesByName names;
  const Tensor& tensor = global_.tensor(global);
  for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
    names[tensor.dims[dim].name] = layout_in[dim];
  }
  return names;
}

void Partitioner::emit(const Op& op, const TensorIds& inputs, const Layouts& computed,
                       const AxisList& partial, ReduceOp reduce) {
  emit_with_partials(op, inputs, computed, AxisLists(op.outputs.size(), partial), reduce);
}

void Partitioner::emit_with_partials(const Op& op, const TensorIds& inputs, const Layouts& computed,
                                     const AxisLists& partials, ReduceOp reduce) {
  // An output computed in its own layout with nothing to reduce is written directly.
  auto direct = [&](size_t index) {
    return computed[index] == layout(op.outputs[index]) && partials[index].empty();
  };
  TensorIds outputs;
  for (size_t index = 0; index < op.outputs.size(); ++index) {
    const TensorId global = op.outputs[index];
    const AxisList& partial = partials[index];
    const bool same = direct(index);
    outputs.push_back(same ? local(global)
                           : make_local(global_.tensor(global), computed[index], op.region,
                                        partial.empty() ? "/computed" : "/partial"));
  }
  add_op(op.kind, op.name, "", inputs, outputs, op.attrs, op.region);
  for (size_t index = 0; index < op.outputs.size(); ++index) {
    if (direct(index)) {
      continue;
    }
    finish_output(op.outputs[index], outputs[index], computed[index], partials[index], op.region,
                  reduce);
  }
}

AxisList Partitioner::summed_axes(TensorId input, const Layout& input_layout,
                                  TensorId output) const {
  const Tensor& in = global_.tensor(input);
  const Tensor& out = global_.tensor(output);
  AxisList axes;
  for (size_t dim = 0; dim < in.dims.size(); ++dim) {
    if (out.dim_index(in.dims[dim].name) < 0) {
      axes.append(input_layout[dim]);
    }
  }
  return axes;
}

void Partitioner::finish_output(TensorId global, TensorId value, const Layout& computed,
                                const AxisList& partial, int region, ReduceOp reduce) {
  const Tensor& tensor = global_.tensor(global);
  const Layout& target = layout(global);
  Layout current = computed;
  AxisList scatter;
  AxisList all_reduce;
  for (const int axis : partial) {
    bool in_target = false;
    for (size_t dim = 0; dim < target.size(); ++dim) {
      in_target = in_target || (contains(target[dim], axis) && !contains(current[dim], axis));
    }
    (in_target ? scatter : all_reduce).push_back(axis);
  }
  // Axes the computation split an output dim over that the tensor's layout does not: gathered
  // first (gathering partial sums is plain concatenation), so that a reduce-scatter onto the
  // same dim splits whole blocks in the tensor's own axis order.
  AxisList gathered;
  for (size_t dim = 0; dim < current.size(); ++dim) {
    for (const int axis : current[dim]) {
      if (!contains(target[dim], axis)) {
        gathered.push_back(axis);
      }
    }
  }
  Layout after_gather = current;
  for (AxisList& axes : after_gather) {
    axes = without(axes, gathered);
  }
  Layout after_reduce = after_gather;
  for (size_t dim = 0; dim < after_reduce.size(); ++dim) {
    for (const int axis : target[dim]) {
      if (contains(scatter, axis)) {
        after_reduce[dim].push_back(axis);
      }
    }
  }
  after_reduce = normalized(after_reduce);
  const bool sliced = after_reduce != target;
  if (!gathered.empty()) {
    const bool last = scatter.empty() && all_reduce.empty() && !sliced;
    value = collective(OpKind::kAllGather, "/all_gather", value, tensor, after_gather, gathered,
                       region, reduce, last ? local(global) : -1);
  }
  // Reduce-scatter before all-reduce, so the all-reduce (often over DCN) moves only the shard.
  if (!scatter.empty()) {
    const bool last = all_reduce.empty() && !sliced;
    value = collective(OpKind::kReduceScatter, "/reduce_scatter", value, tensor, after_reduce,
                       scatter, region, reduce, last ? local(global) : -1);
  }
  if (!all_reduce.empty()) {
    value = collective(OpKind::kAllReduce, "/all_reduce", value, tensor, after_reduce, all_reduce,
                       region, reduce, sliced ? -1 : local(global));
  }
  if (sliced) {
    // The unsliced value stays reusable in this region.
    alternates_.set(global, after_reduce, value);
    add_op(OpKind::kDynamicSlice, tensor.name, "/slice", {value}, {local(global)}, {}, region);
  }
}

PlanDims Partitioner::plan_dims(TensorId global) const {
  PlanDims dims;
  const Tensor& tensor = global_.tensor(global);
  for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
    dims.push_back({&tensor.dims[dim].name, layout(global)[dim]});
  }
  return dims;
}

void Partitioner::partition_following_output(const Op& op,
                                             const std::set<std::string>& must_be_whole) {
  const TensorId first = op.outputs.at(0);
  AxesByName reference = by_name(first, layout(first));
  for (const std::string& name : must_be_whole) {
    reference.erase(name);
  }
  TensorIds inputs;
  for (const TensorId input : op.inputs) {
    inputs.push_back(reshard(input, follow(input, reference, must_be_whole), op.region));
  }
  Layouts computed;
  AxisLists partials;
  for (const TensorId output : op.outputs) {
    computed.push_back(follow(output, reference, must_be_whole));
    // A norm's scale gradient, a router's bias gradient and a compressor's position-bias gradient
    // sum over the tokens input 0 splits.
    const bool token_sum = op.kind == OpKind::kNormGrad || op.kind == OpKind::kRouterGrad ||
                           (op.kind == OpKind::kBlockPoolGrad && output == op.outputs.back());
    partials.push_back(token_sum && output != first
                           ? summed_axes(op.inputs[0], follow(op.inputs[0], reference), output)
                           : AxisList{});
  }
  emit_with_partials(op, inputs, computed, partials);
}

int Partitioner::add_op(OpKind kind, std::string_view name, std::string_view suffix,
                        const TensorIds& inputs, const TensorIds& outputs, const OpAttrs& attrs,
                        int region) {
  op_name_.assign(name).append(suffix);
  const int id = out_.add_op_copy(kind, op_name_, {inputs.data(), inputs.size()},
                                  {outputs.data(), outputs.size()}, attrs, region);
  out_.mutable_op(id).phase = current_phase_;
  return id;
}

void Partitioner::partition_op(const Op& op) {
  current_phase_ = op.phase;
  switch (op.kind) {
    case OpKind::kEinsum: {
      // A grouped matmul's third input (row_experts) follows its rows by dim name; its rows are
      // the dropless buffer's (a copy of the op carries their routed fraction).
      const bool grouped = op.inputs.size() == 3 && dropless_expert_tokens_ > 0;
      Op grouped_einsum;
      if (grouped) {
        grouped_einsum = op;
        grouped_einsum.attrs.routed_fraction = dropless_fraction_;
      }
      partition_einsum(grouped ? grouped_einsum : op, {op.inputs[0], op.inputs[1]},
                       {plan_dims(op.inputs[0]), plan_dims(op.inputs[1])}, op.attrs.contracted);
      return;
    }
    case OpKind::kEmbeddingLookup: {
      // = einsum(one_hot(tokens)[batch, length, vocab], table[vocab, embed]) over vocab.
      PlanDims one_hot = plan_dims(op.inputs[0]);
      const Tensor& table = global_.tensor(op.inputs[1]);
      one_hot.push_back({&table.dims[0].name, {}});
      const std::array<std::string, 1> vocab = {table.dims[0].name};
      partition_einsum(op, {-1, op.inputs[1]}, {one_hot, plan_dims(op.inputs[1])}, vocab);
      return;
    }
    case OpKind::kEmbeddingGrad: {
      // dtable = einsum(one_hot(tokens)[batch, length, vocab], dx[batch, length, embed]).
      PlanDims one_hot = plan_dims(op.inputs[1]);
      one_hot.push_back({&global_.tensor(op.outputs[0]).dims[0].name, {}});
      const std::array<std::string, 2> tokens = {"batch", "length"};
      partition_einsum(op, {-1, op.inputs[0]}, {one_hot, plan_dims(op.inputs[0])}, tokens);
      return;
    }
    case OpKind::kReduceSum: {
      // Each device sums its part; the shards of the summed dims leave partial sums.
      const TensorId input = op.inputs[0];
      const AxesByName reference = by_name(input, layout(input));
      emit_with_partials(op, {local(input)}, {follow(op.outputs[0], reference)},
                         {summed_axes(input, layout(input), op.outputs[0])});
      return;
    }
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kNormGrad:
      // Statistics per row: RMSNorm sum(x^2); LayerNorm sum(x), sum(x^2); their gradients
      // also need sum(dy.scale.x) (RMS) or sum(dy.scale), sum(dy.scale.x) (Layer).
      partition_reduction(op, op.attrs.contracted.empty() ? "" : op.attrs.contracted[0],
                          OpKind::kNormStatistics, norm_statistics_count(op), ReduceOp::kSum);
      return;
    case OpKind::kCrossEntropy:
    case OpKind::kCrossEntropyGrad: {
      partition_reduction(op, "vocab", OpKind::kCrossEntropyStatistics, 3, ReduceOp::kLogSumExp);
      if (op.kind == OpKind::kCrossEntropy) {
        // The mean loss over tokens split across devices.
        const Tensor& logits = global_.tensor(op.inputs[0]);
        AxisList token_axes;
        for (size_t dim = 0; dim < logits.dims.size(); ++dim) {
          if (logits.dims[dim].name != "vocab") {
            token_axes.append(layout(op.inputs[0])[dim]);
          }
        }
        if (!token_axes.empty()) {
          const Tensor& loss = global_.tensor(op.outputs[0]);
          collective(OpKind::kAllReduce, "/all_reduce", local(op.outputs[0]), loss, {}, token_axes,
                     op.region);
        }
      }
      return;
    }
    case OpKind::kSinkhorn:
    case OpKind::kSinkhornGrad: {
      // Per token: the matrix (the last two dims) stays whole on each device.
      const Tensor& matrix = global_.tensor(op.outputs[0]);
      const size_t rank = matrix.dims.size();
      partition_following_output(op,
                                 {matrix.dims.at(rank - 2).name, matrix.dims.at(rank - 1).name});
      return;
    }
    case OpKind::kAttention:
      partition_attention(op, false);
      return;
    case OpKind::kAttentionGrad:
      partition_attention(op, true);
      return;
    case OpKind::kMoeDispatch:
    case OpKind::kMoeCombine:
      partition_moe_exchange(op);
      return;
    case OpKind::kRouterGrad:
      // d routing weights from (d combined, expert out, routing); d_routing has a "route" dim.
      if (global_.tensor(op.inputs[0]).dim_index("route") < 0) {
        partition_moe_exchange(op, 1);
        return;
      }
      partition_following_output(op);
      return;
    // Computed where their output lives, each input resharded to follow it (the partitioner's
    // input holds no collectives or host transfers yet: they are listed to follow too).
    case OpKind::kElementwise:
    case OpKind::kRope:
    case OpKind::kMoeRouter:
    case OpKind::kBlockPool:
    case OpKind::kBlockPoolGrad:
    case OpKind::kBlockTopK:
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
      partition_following_output(op);
      return;
  }
}

}  // namespace partitioner_internal

PartitionedProgram partition(const TrainingStep& step, const LogicalAxisRules& rules,
                             const DeviceMesh& mesh, const MechanismSet& mechanisms) {
  return partitioner_internal::Partitioner(step, rules, mesh, mechanisms).run();
}

int64_t collective_bytes(const Graph& graph, const Op& op) {
  switch (op_kind_traits(op.kind).collective) {
    case Collective::kAllGather:
      return graph.tensor(op.outputs[0]).bytes();
    case Collective::kReduceScatter:
    case Collective::kAllReduce:
    case Collective::kCollectivePermute:
      return graph.tensor(op.inputs[0]).bytes();
    case Collective::kAllToAll:
      // A ragged (dropless MoE) exchange moves the routed rows of its buffer.
      return static_cast<int64_t>(std::llround(
          static_cast<double>(graph.tensor(op.inputs[0]).bytes()) * op.attrs.routed_fraction));
    case Collective::kNone:
      return 0;
  }
  return 0;
}

}  // namespace tpusim
