#include "sharding/partitioner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "common/error.h"
#include "sharding/layout.h"

namespace tpusim {
namespace {

bool contains(const AxisList& axes, int axis) {
  return axes.contains(axis);
}

AxisList without(const AxisList& axes, const AxisList& removed) {
  return axes.without(removed);
}

// Axes of each dim in mesh order (major to minor), so equal splits compare equal.
Layout normalized(Layout layout) {
  for (AxisList& axes : layout) {
    axes.sort();
  }
  return layout;
}

Layout normalized(const std::vector<std::vector<int>>& axes_per_dim) {
  Layout layout;
  for (const std::vector<int>& axes : axes_per_dim) {
    AxisList sorted(axes);
    sorted.sort();
    layout.push_back(sorted);
  }
  return layout;
}

// Axes by dim name. A tensor has a few dims, so a linear search over names beats a std::map of
// strings; the names are views of dim names in the global graph (or of the op's attributes).
class AxesByName {
 public:
  const AxisList* find(std::string_view name) const {
    for (const auto& [key, axes] : *this) {
      if (key == name) {
        return &axes;
      }
    }
    return nullptr;
  }
  // The entry for `name`, added empty if missing (as std::map::operator[]).
  AxisList& operator[](std::string_view name) {
    for (auto& [key, axes] : *this) {
      if (key == name) {
        return axes;
      }
    }
    if (size_ == kCapacity) {
      throw std::logic_error("AxesByName: more than 16 dim names");
    }
    entries_[size_] = {name, AxisList{}};
    return entries_[size_++].second;
  }
  void erase(std::string_view name) {
    size_ = static_cast<size_t>(
        std::remove_if(begin(), end(), [name](const auto& entry) { return entry.first == name; }) -
        begin());
  }

 private:
  // Dims of the output plus contracted dims (kept inline: no heap allocation).
  static constexpr size_t kCapacity = 16;
  using Entry = std::pair<std::string_view, AxisList>;
  const Entry* begin() const { return entries_.data(); }
  const Entry* end() const { return entries_.data() + size_; }
  Entry* begin() { return entries_.data(); }
  Entry* end() { return entries_.data() + size_; }

  std::array<Entry, kCapacity> entries_;  // the first size_ are used
  size_t size_ = 0;
};

// `first` + `second` (+ `third`) in one allocation: names of the program's tensors and ops.
std::string joined(std::string_view first, std::string_view second, std::string_view third = "") {
  std::string text;
  text.reserve(first.size() + second.size() + third.size());
  text.append(first).append(second).append(third);
  return text;
}

// A dim as the partitioner plans with it: name (a view of a global tensor's dim name or of the
// op's attributes) and mesh axes.
struct PlanDim {
  std::string_view name;
  AxisList axes;
};

// Values per row a norm (or its gradient) needs when its reduced dim is split across devices.
int norm_statistics_count(const Op& op) {
  switch (op.kind) {
    case OpKind::kRmsNorm:
      return 1;
    case OpKind::kLayerNorm:
      return 2;
    default:  // kNormGrad: inputs dy, x, scale (RMS) or dy, x, scale, bias (LayerNorm)
      return op.inputs.size() == 3 ? 2 : 4;
  }
}

class Partitioner {
 public:
  Partitioner(const TrainingStep& step, const LogicalAxisRules& rules, const DeviceMesh& mesh)
      : global_(step.graph), rules_(rules), mesh_(mesh) {}

  PartitionedProgram run() {
    for (const Region& region : global_.regions()) {
      const int copy = out_.add_region(region.name, region.repeat, region.phase,
                                       region.forward_region, region.shared_parameters);
      out_.mutable_region(copy).pipeline = region.pipeline;
    }
    layouts_.resize(global_.tensors().size());
    local_.assign(global_.tensors().size(), -1);
    // A layout depends only on the dims' logical names: resolve each combination once (a step
    // has hundreds of tensors but a few dozen combinations).
    std::unordered_map<std::string, Layout> layout_of_logical_names;
    std::string logical_names;
    for (const Tensor& tensor : global_.tensors()) {
      logical_names.clear();
      for (const Dim& dim : tensor.dims) {
        logical_names += dim.logical;
        logical_names += '\0';
      }
      const auto [known, added] = layout_of_logical_names.try_emplace(logical_names);
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
    for (int region = 0; region < static_cast<int>(global_.regions().size()); ++region) {
      alternates_.clear();
      for (const Op& op : global_.ops()) {
        if (op.region == region) {
          partition_op(op);
        }
      }
    }
    for (const Graph::Carry& carry : global_.carries()) {
      out_.add_carry(pipeline_hand_over(carry), local(carry.to));
    }
    gather_pipeline_weights_once();
    PartitionedProgram program;
    program.graph = std::move(out_);
    program.mesh = mesh_;
    program.padding = std::move(padding_);
    program.local_of_global = local_;
    return program;
  }

 private:
  int axis_size(int axis) const { return mesh_.shape.size(axis); }
  int64_t shards(const AxisList& axes) const {
    int64_t product = 1;
    for (const int axis : axes) {
      product *= axis_size(axis);
    }
    return product;
  }
  TensorId local(TensorId global) const { return local_[static_cast<size_t>(global)]; }
  const Layout& layout(TensorId global) const { return layouts_[static_cast<size_t>(global)]; }

  TensorId make_local(const Tensor& global, const Layout& layout_in, int region,
                      const std::string& suffix) {
    std::vector<Dim> dims = global.dims;
    for (size_t index = 0; index < dims.size(); ++index) {
      Dim& dim = dims[index];
      if (dim.name == "expert_tokens" && dropless_expert_tokens_ > 0) {
        dim.size = dropless_expert_tokens_;
      }
      const int64_t split = shards(layout_in[index]);
      dim.global_size = dim.size;
      dim.sharded_over.clear();
      dim.sharded_over.reserve(layout_in[index].size());
      for (const int axis : layout_in[index]) {
        dim.sharded_over.push_back(mesh_axis_names()[static_cast<size_t>(axis)]);
      }
      const int64_t local_size = (dim.size + split - 1) / split;
      if (split > 1 && dim.size % split != 0 && suffix.empty()) {
        padding_.push_back({global.name, dim.name, dim.size, split, local_size * split});
      }
      dim.size = local_size;
    }
    return out_.add_tensor(joined(global.name, suffix), std::move(dims), global.dtype, global.kind,
                           region, global.remat_name);
  }

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
  TensorId pipeline_hand_over(const Graph::Carry& carry) {
    const Tensor& from = global_.tensor(carry.from);
    const Region& region = global_.region(from.region);
    const TensorId source = local(carry.from);
    if (!region.pipelined() || global_.tensor(carry.to).region != from.region) {
      return source;
    }
    const Tensor& local_from = out_.tensor(source);
    const TensorId moved =
        out_.add_tensor(local_from.name + "/stage_permute", local_from.dims, local_from.dtype,
                        local_from.kind, from.region, local_from.remat_name);
    OpAttrs attrs;
    attrs.mesh_axes = {"stage"};
    attrs.group_size = mesh_.shape.size("stage");
    attrs.every = region.pipeline.layers_per_stage;
    current_phase_ = region.phase;
    // Forward: the stage output to the next stage, the input stream toward stage 0, the last
    // stage's output to stage 0's storage; the backward loop sends their gradients back.
    const int64_t forward = region.phase == Phase::kForward ? 1 : -1;
    attrs.ring_shift = forward;
    add_op(OpKind::kCollectivePermute, local_from.name + "/stage_permute", {source}, {moved}, attrs,
           from.region);
    std::vector<std::pair<std::string, int64_t>> side = {{"/stream_permute", -forward}};
    if (region.pipeline.circular_storage) {
      side.emplace_back("/storage_permute", forward);
    }
    for (const auto& [suffix, shift] : side) {
      const TensorId buffer =
          out_.add_tensor(local_from.name + suffix, local_from.dims, local_from.dtype,
                          TensorKind::kActivation, from.region);
      attrs.ring_shift = shift;
      add_op(OpKind::kCollectivePermute, local_from.name + suffix, {source}, {buffer}, attrs,
             from.region);
    }
    return region.pipeline.delayed_forwarding ? source : moved;
  }

  // pipeline_fsdp_ag_once: a stage's weights are gathered before its loop, once per layer it
  // holds, and their gradients reduce-scattered after it (summed gathered meanwhile); in the loop
  // those collectives run in held layers / iterations of its iterations.
  void gather_pipeline_weights_once() {
    auto from_parameter = [&](TensorId id) {
      if (out_.tensor(id).kind == TensorKind::kParameter) {
        return true;
      }
      const int producer = out_.producer(id);
      return producer >= 0 &&
             out_.ops()[static_cast<size_t>(producer)].kind == OpKind::kElementwise &&
             out_.tensor(out_.ops()[static_cast<size_t>(producer)].inputs[0]).kind ==
                 TensorKind::kParameter;  // its cast to dtype
    };
    for (const Op& op : out_.ops()) {
      const Region& region = out_.region(op.region);
      if (!region.pipelined() || !region.pipeline.weights_gathered_once) {
        continue;
      }
      const bool gather = op.kind == OpKind::kAllGather && from_parameter(op.inputs[0]);
      const bool reduction = (op.kind == OpKind::kReduceScatter || op.kind == OpKind::kAllReduce) &&
                             out_.tensor(op.outputs[0]).kind == TensorKind::kParameterGrad;
      if (gather || reduction) {
        out_.mutable_op(op.id).attrs.iteration_share =
            static_cast<double>(region.parameter_sets()) / static_cast<double>(region.repeat);
      }
    }
  }

  // Emits a collective over `axes`; writes `into` when given, else a new local tensor.
  TensorId collective(OpKind kind, const std::string& name, TensorId input, const Tensor& global,
                      const Layout& result_layout, const AxisList& axes, int region,
                      ReduceOp reduce = ReduceOp::kSum, TensorId into = -1) {
    const TensorId output =
        into >= 0 ? into : make_local(global, result_layout, region, joined("/", name));
    OpAttrs attrs;
    for (const int axis : axes) {
      attrs.mesh_axes.push_back(mesh_axis_names()[static_cast<size_t>(axis)]);
    }
    attrs.group_size = shards(axes);
    attrs.reduce = reduce;
    add_op(kind, joined(global.name, "/", name), {input}, {output}, attrs, region);
    return output;
  }

  // The local tensor of `global` in layout `target`, inserting collectives or slices as needed.
  TensorId reshard(TensorId global, const Layout& target_in, int region) {
    const Layout target = normalized(target_in);
    const Layout& current = layout(global);
    if (current == target) {
      return local(global);
    }
    const std::pair<TensorId, Layout> key{global, target};
    if (const auto found = alternates_.find(key); found != alternates_.end()) {
      return found->second;
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
      value = collective(OpKind::kAllGather, "all_gather", value, tensor, step, gathered, region);
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
      value = collective(OpKind::kAllToAll, "all_to_all", value, tensor, step, moved, region);
    }
    step = normalized(step);
    if (step != target) {
      const TensorId sliced = make_local(tensor, target, region, "/slice");
      add_op(OpKind::kDynamicSlice, joined(tensor.name, "/slice"), {value}, {sliced}, {}, region);
      value = sliced;
    }
    alternates_[key] = value;
    return value;
  }

  // Layout of `global`'s dims following `reference` by dim name; dims `reference` lacks keep
  // their own axes unless listed in `must_be_whole`.
  Layout follow(TensorId global, const AxesByName& reference,
                const std::set<std::string>& must_be_whole = {}) const {
    const Tensor& tensor = global_.tensor(global);
    Layout result = layout(global);
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      const std::string& name = tensor.dims[dim].name;
      if (must_be_whole.contains(name)) {
        result[dim].clear();
      } else if (const AxisList* found = reference.find(name); found != nullptr) {
        result[dim] = *found;
      }
    }
    // An axis may shard only one dim: drop later repeats.
    uint32_t used = 0;  // bit per mesh axis
    for (AxisList& axes : result) {
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

  AxesByName by_name(TensorId global, const Layout& layout_in) const {
    AxesByName names;
    const Tensor& tensor = global_.tensor(global);
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      names[tensor.dims[dim].name] = layout_in[dim];
    }
    return names;
  }

  // Emits `op` computed with its outputs in `computed` layouts, then reduces partial sums over
  // `partial` axes into each output's own layout.
  void emit(const Op& op, std::vector<TensorId> inputs, const std::vector<Layout>& computed,
            const AxisList& partial, ReduceOp reduce = ReduceOp::kSum) {
    emit_with_partials(op, std::move(inputs), computed,
                       std::vector<AxisList>(op.outputs.size(), partial), reduce);
  }

  // As emit(), with each output's own partial-sum axes.
  void emit_with_partials(const Op& op, std::vector<TensorId> inputs,
                          const std::vector<Layout>& computed,
                          const std::vector<AxisList>& partials, ReduceOp reduce = ReduceOp::kSum) {
    // An output computed in its own layout with nothing to reduce is written directly.
    auto direct = [&](size_t index) {
      return computed[index] == layout(op.outputs[index]) && partials[index].empty();
    };
    std::vector<TensorId> outputs;
    outputs.reserve(op.outputs.size());
    for (size_t index = 0; index < op.outputs.size(); ++index) {
      const TensorId global = op.outputs[index];
      const AxisList& partial = partials[index];
      const bool same = direct(index);
      outputs.push_back(same ? local(global)
                             : make_local(global_.tensor(global), computed[index], op.region,
                                          partial.empty() ? "/computed" : "/partial"));
    }
    add_op(op.kind, op.name, std::move(inputs), outputs, op.attrs, op.region);
    for (size_t index = 0; index < op.outputs.size(); ++index) {
      if (direct(index)) {
        continue;
      }
      finish_output(op.outputs[index], outputs[index], computed[index], partials[index], op.region,
                    reduce);
    }
  }

  // Axes of `input`'s dims that `output` lacks: an output that sums over those dims (a norm
  // scale's gradient sums over batch and length) holds partial sums over these axes.
  AxisList summed_axes(TensorId input, const Layout& input_layout, TensorId output) const {
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

  // Turns a computed (possibly partial) output into the tensor's own layout.
  void finish_output(TensorId global, TensorId value, const Layout& computed,
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
      value = collective(OpKind::kAllGather, "all_gather", value, tensor, after_gather, gathered,
                         region, reduce, last ? local(global) : -1);
    }
    // Reduce-scatter before all-reduce, so the all-reduce (often over DCN) moves only the shard.
    if (!scatter.empty()) {
      const bool last = all_reduce.empty() && !sliced;
      value = collective(OpKind::kReduceScatter, "reduce_scatter", value, tensor, after_reduce,
                         scatter, region, reduce, last ? local(global) : -1);
    }
    if (!all_reduce.empty()) {
      value = collective(OpKind::kAllReduce, "all_reduce", value, tensor, after_reduce, all_reduce,
                         region, reduce, sliced ? -1 : local(global));
    }
    if (sliced) {
      // The unsliced value stays reusable in this region.
      alternates_[{global, after_reduce}] = value;
      add_op(OpKind::kDynamicSlice, joined(tensor.name, "/slice"), {value}, {local(global)}, {},
             region);
    }
  }

  // Einsum over named dims; `lhs_dims`/`rhs_dims` describe the operands (virtual one-hot operands
  // of lookups have no tensor: their id is -1).
  void partition_einsum(const Op& op, const std::vector<TensorId>& operands,
                        const std::array<std::vector<PlanDim>, 2>& operand_dims,
                        const std::vector<std::string>& contracted) {
    const TensorId output = op.outputs[0];
    const Layout& out_layout = layout(output);
    const Tensor& out_tensor = global_.tensor(output);
    AxesByName iteration;
    AxisList used;
    for (size_t dim = 0; dim < out_tensor.dims.size(); ++dim) {
      iteration[out_tensor.dims[dim].name] = out_layout[dim];
      used.append(out_layout[dim]);
    }
    AxisList partial;
    for (const std::string& name : contracted) {
      // The operand dims named `name`: both operands contract it when there are exactly two.
      std::array<const AxisList*, 2> sharding{};
      size_t found = 0;
      for (const auto& dims : operand_dims) {
        for (const PlanDim& dim : dims) {
          if (dim.name == name) {
            if (found < sharding.size()) {
              sharding[found] = &dim.axes;
            }
            ++found;
          }
        }
      }
      AxisList chosen;
      if (found == 2) {
        for (const int axis : *sharding[0]) {
          const bool both = contains(*sharding[1], axis);
          if (both && !contains(partial, axis)) {
            chosen.push_back(axis);
          }
        }
        // An axis only one operand splits, free in the output: slice the other operand and
        // reduce the output rather than gathering, when the output is the smaller of the two.
        for (size_t which = 0; which < 2; ++which) {
          for (const int axis : *sharding[which]) {
            if (contains(chosen, axis) || contains(used, axis) || contains(partial, axis)) {
              continue;
            }
            const TensorId operand = operands[which];
            const double operand_bytes =
                operand < 0 ? 0.0 : static_cast<double>(out_.tensor(local(operand)).bytes());
            const double output_bytes =
                2.0 * static_cast<double>(out_.tensor(local(output)).bytes());
            if (operand >= 0 && output_bytes < operand_bytes) {
              chosen.push_back(axis);
            }
          }
        }
      }
      iteration[name] = chosen;
      partial.append(chosen);
    }
    // Output dims lose the partial axes (they come back through reduce-scatter).
    Layout computed = out_layout;
    for (AxisList& axes : computed) {
      axes = without(axes, partial);
    }
    // An output dim an operand splits over an axis the output leaves free: keep the split and
    // gather the (smaller) result instead of gathering the operand, as XLA would.
    const double output_bytes = static_cast<double>(out_.tensor(local(output)).bytes());
    for (size_t dim = 0; dim < out_tensor.dims.size(); ++dim) {
      for (size_t which = 0; which < operands.size(); ++which) {
        if (operands[which] < 0) {
          continue;
        }
        for (const PlanDim& plan : operand_dims[which]) {
          if (plan.name != out_tensor.dims[dim].name) {
            continue;
          }
          for (const int axis : plan.axes) {
            if (contains(used, axis) || contains(partial, axis)) {
              continue;
            }
            const double operand_bytes =
                static_cast<double>(out_.tensor(local(operands[which])).bytes());
            if (output_bytes < operand_bytes) {
              computed[dim].push_back(axis);
              used.push_back(axis);
            }
          }
        }
      }
    }
    computed = normalized(computed);
    for (size_t dim = 0; dim < out_tensor.dims.size(); ++dim) {
      iteration[out_tensor.dims[dim].name] = computed[dim];
    }
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size());
    for (const TensorId operand : op.inputs) {
      inputs.push_back(reshard(operand, follow(operand, iteration), op.region));
    }
    emit(op, std::move(inputs), {computed}, partial);
  }

  std::vector<PlanDim> plan_dims(TensorId global) const {
    std::vector<PlanDim> dims;
    const Tensor& tensor = global_.tensor(global);
    dims.reserve(tensor.dims.size() + 1);  // + the vocab of a lookup's one-hot operand
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      dims.push_back({tensor.dims[dim].name, layout(global)[dim]});
    }
    return dims;
  }

  // Generic op: computed in its first output's layout; inputs follow by dim name, dims in
  // `must_be_whole` are gathered.
  void partition_following_output(const Op& op, const std::set<std::string>& must_be_whole = {}) {
    const TensorId first = op.outputs.at(0);
    AxesByName reference = by_name(first, layout(first));
    for (const std::string& name : must_be_whole) {
      reference.erase(name);
    }
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size());
    for (const TensorId input : op.inputs) {
      inputs.push_back(reshard(input, follow(input, reference, must_be_whole), op.region));
    }
    std::vector<Layout> computed;
    std::vector<AxisList> partials;
    computed.reserve(op.outputs.size());
    partials.reserve(op.outputs.size());
    for (const TensorId output : op.outputs) {
      computed.push_back(follow(output, reference, must_be_whole));
      partials.push_back(op.kind == OpKind::kNormGrad && output != first
                             ? summed_axes(op.inputs[0], follow(op.inputs[0], reference), output)
                             : AxisList{});
    }
    emit_with_partials(op, std::move(inputs), computed, partials);
  }

  // Norms and cross-entropy reduce over a dim; when it is split, partial statistics are
  // all-reduced first (small: one or a few floats per row).
  void partition_reduction(const Op& op, const std::string& reduced_dim, OpKind statistics_kind,
                           int statistics_values, ReduceOp reduce) {
    const TensorId input = op.inputs[0];
    const Tensor& tensor = global_.tensor(input);
    const int dim_index = tensor.dim_index(reduced_dim);
    const AxisList split =
        dim_index < 0 ? AxisList{} : layout(input)[static_cast<size_t>(dim_index)];
    if (split.empty()) {
      partition_following_output(op);
      return;
    }
    const AxesByName reference = by_name(input, layout(input));
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size() + 1);
    for (const TensorId operand : op.inputs) {
      inputs.push_back(reshard(operand, follow(operand, reference), op.region));
    }
    // Statistics tensor: the input's dims without the reduced one, plus the values per row.
    std::vector<Dim> stat_dims;
    for (const Dim& dim : tensor.dims) {
      if (dim.name != reduced_dim) {
        stat_dims.push_back(dim);
      }
    }
    stat_dims.emplace_back("statistics", statistics_values, "");
    const TensorId global_stats = extra_.add_tensor(
        joined(op.name, "/statistics"), stat_dims, DType::kF32, TensorKind::kActivation, op.region);
    Layout stat_layout;
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      if (static_cast<int>(dim) != dim_index) {
        stat_layout.push_back(layout(input)[dim]);
      }
    }
    stat_layout.push_back({});
    const Tensor& stats_info = extra_.tensor(global_stats);
    const TensorId partial = make_local(stats_info, stat_layout, op.region, "/partial");
    OpAttrs stat_attrs;
    stat_attrs.contracted = {reduced_dim};
    // Cross-entropy statistics read the logits through the loss's transform (soft cap).
    stat_attrs.logit_soft_cap = op.attrs.logit_soft_cap;
    stat_attrs.logit_multiplier = op.attrs.logit_multiplier;
    add_op(statistics_kind, joined(op.name, "/statistics"), inputs, {partial}, stat_attrs,
           op.region);
    const TensorId full = collective(OpKind::kAllReduce, "all_reduce", partial, stats_info,
                                     stat_layout, split, op.region, reduce);
    inputs.push_back(full);
    std::vector<Layout> computed;
    std::vector<AxisList> partials;
    for (const TensorId output : op.outputs) {
      computed.push_back(follow(output, reference));
      partials.push_back(op.kind == OpKind::kNormGrad && output != op.outputs[0]
                             ? summed_axes(input, layout(input), output)
                             : AxisList{});
    }
    emit_with_partials(op, std::move(inputs), computed, partials);
  }

  void partition_attention(const Op& op, bool gradient) {
    // Forward inputs: q, k, v, [k_rope]; gradient inputs: dout, q, k, v, [k_rope], out.
    const size_t first_forward = gradient ? 1 : 0;
    const TensorId query = op.inputs[first_forward];
    const AxesByName reference = by_name(query, layout(query));
    // Keys and values cover the whole sequence. Their kv heads stay split only when the split
    // divides them evenly (each device's query heads then find their kv heads locally); with
    // fewer kv heads than shards (GQA under wide tensor parallelism) they are gathered whole,
    // as each device needs the kv head its query heads share.
    std::set<std::string> whole_length = {"length"};
    const TensorId key = op.inputs[first_forward + 1];
    const int kv_dim = global_.tensor(key).dim_index("kv_heads");
    bool kv_gathered = false;
    if (kv_dim >= 0) {
      const AxisList& kv_axes = layout(key)[static_cast<size_t>(kv_dim)];
      const int64_t kv_heads = global_.tensor(key).dims[static_cast<size_t>(kv_dim)].size;
      if (!kv_axes.empty() && kv_heads % shards(kv_axes) != 0) {
        whole_length.insert("kv_heads");
        kv_gathered = true;
      }
    }
    const size_t key_begin = first_forward + 1;
    const size_t key_end = gradient ? op.inputs.size() - 1 : op.inputs.size();
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size());
    for (size_t index = 0; index < op.inputs.size(); ++index) {
      const TensorId input = op.inputs[index];
      const bool key_side = index >= key_begin && index < key_end;
      inputs.push_back(reshard(
          input, key_side ? follow(input, {}, whole_length) : follow(input, reference), op.region));
    }
    if (!gradient) {
      emit(op, std::move(inputs), {follow(op.outputs[0], reference)}, {});
      return;
    }
    // dq follows q; dk, dv (and dk_rope) are partial sums over the axes splitting q's length,
    // and MLA's shared rotary key (no heads dim) also over the axes splitting the heads.
    const Tensor& query_tensor = global_.tensor(query);
    const int length_dim = query_tensor.dim_index("length");
    const int heads_dim = query_tensor.dim_index("heads");
    const AxisList context =
        length_dim < 0 ? AxisList{} : layout(query)[static_cast<size_t>(length_dim)];
    const AxisList heads =
        heads_dim < 0 ? AxisList{} : layout(query)[static_cast<size_t>(heads_dim)];
    std::vector<TensorId> outputs;
    std::vector<std::pair<size_t, AxisList>> pending;
    std::vector<Layout> computed_layouts;
    for (size_t index = 0; index < op.outputs.size(); ++index) {
      const TensorId global = op.outputs[index];
      const Tensor& output = global_.tensor(global);
      AxisList partial;
      if (index > 0) {
        partial = context;
        const bool shared_across_heads =
            output.dim_index("heads") < 0 && (output.dim_index("kv_heads") < 0 || kv_gathered);
        if (shared_across_heads) {
          partial.append(heads);
        }
      }
      const Layout computed =
          index == 0 ? follow(global, reference) : follow(global, {}, whole_length);
      computed_layouts.push_back(computed);
      if (computed == layout(global) && partial.empty()) {
        outputs.push_back(local(global));
        continue;
      }
      outputs.push_back(
          make_local(output, computed, op.region, partial.empty() ? "/computed" : "/partial"));
      pending.emplace_back(index, partial);
    }
    add_op(op.kind, op.name, inputs, outputs, op.attrs, op.region);
    for (const auto& [index, partial] : pending) {
      finish_output(op.outputs[index], outputs[index], computed_layouts[index], partial, op.region,
                    ReduceOp::kSum);
    }
  }

  // Dropless MoE (a dispatch with row_experts): the rows of the grouped buffers. Each device's
  // dispatch sends one block of rows to each expert-parallel shard; however unbalanced the
  // routing, a block must hold every local token choosing min(E/ep, k) of that shard's experts
  // (MaxText sizes its ragged_all_to_all buffer the same way: ep x B_l x S x min(E_l, k) rows),
  // unless ragged_buffer_factor > 0 bounds it at that multiple of the balanced rows. Without
  // expert parallelism that is the builder's E x B*S*k/E (up to rounding). The grouped matmuls
  // and ragged all-to-alls then count the fraction of the rows balanced routing fills.
  void size_dropless_buffers() {
    for (const Op& op : global_.ops()) {
      if (op.kind != OpKind::kMoeDispatch || op.outputs.size() != 2) {
        continue;
      }
      const Tensor& grouped = global_.tensor(op.outputs[0]);
      const Tensor& routing = global_.tensor(op.inputs[1]);
      const Layout& grouped_layout = layout(op.outputs[0]);
      const auto experts_dim = static_cast<size_t>(grouped.dim_index("experts"));
      const auto token_dim = static_cast<size_t>(grouped.dim_index("expert_tokens"));
      const int64_t experts = grouped.dims[experts_dim].size;
      const int64_t expert_shards = shards(grouped_layout[experts_dim]);
      if (experts % expert_shards != 0) {
        throw UserError("num_experts: " + std::to_string(experts) +
                        " experts do not split evenly over " + std::to_string(expert_shards) +
                        " expert-parallel shards (dropless MoE needs whole experts per shard)");
      }
      const int64_t local_experts = experts / expert_shards;
      int64_t local_tokens = 1;
      int64_t top_k = 1;
      double routed = 1;  // token choices of the whole batch
      for (size_t dim = 0; dim < routing.dims.size(); ++dim) {
        const Dim& info = routing.dims[dim];
        if (info.name == "route") {
          continue;
        }
        routed *= static_cast<double>(info.size);
        if (info.name == "top_k") {
          top_k = info.size;
          continue;
        }
        const int64_t split = shards(layout(op.inputs[1])[dim]);
        local_tokens *= (info.size + split - 1) / split;
      }
      int64_t per_block = local_tokens * std::min(local_experts, top_k);
      const double factor = op.attrs.ragged_buffer_factor;
      const bool bounded = factor > 0 && expert_shards > 1;
      if (bounded) {
        // ragged_buffer_factor: a multiple of the balanced share, dropping what exceeds it.
        const double balanced =
            static_cast<double>(local_tokens * top_k) / static_cast<double>(expert_shards);
        per_block = std::min(per_block, static_cast<int64_t>(std::ceil(factor * balanced)));
      }
      const int64_t local_rows = (per_block + local_experts - 1) / local_experts;
      const int64_t token_shards = shards(grouped_layout[token_dim]) * expert_shards;
      const int64_t built = grouped.dims[token_dim].size;
      const int64_t needed = local_rows * token_shards;
      dropless_expert_tokens_ = bounded ? needed : std::max(built, needed);
      // A bounded buffer smaller than the balanced rows is full (the rest is dropped).
      dropless_fraction_ = std::min(1.0, routed / static_cast<double>(experts) /
                                             static_cast<double>(dropless_expert_tokens_));
    }
  }

  // `tensor`'s layout with the expert axes moved from its experts dim onto its expert_tokens dim:
  // how a device holds the rows of its own tokens for every expert, before (dispatch) or after
  // (combine) the all-to-all.
  Layout tokens_local_layout(TensorId tensor, const AxisList& expert_axes) const {
    const Tensor& info = global_.tensor(tensor);
    Layout result = layout(tensor);
    const int experts_dim = info.dim_index("experts");
    const int token_dim = info.dim_index("expert_tokens");
    if (experts_dim >= 0 && token_dim >= 0) {
      result[static_cast<size_t>(experts_dim)].clear();
      for (const int axis : expert_axes) {
        result[static_cast<size_t>(token_dim)].push_back(axis);
      }
    }
    return normalized(result);
  }

  // An all-to-all of a MoE buffer; a ragged (dropless) one counts the rows it really moves.
  TensorId exchange(TensorId value, const Tensor& global, const Layout& result,
                    const AxisList& expert_axes, int region, bool ragged, TensorId into = -1) {
    const TensorId output = collective(OpKind::kAllToAll, "all_to_all", value, global, result,
                                       expert_axes, region, ReduceOp::kSum, into);
    if (ragged) {
      out_.mutable_op(out_.producer(output)).attrs.routed_fraction = dropless_fraction_;
    }
    return output;
  }

  // MoE dispatch/combine: expert-parallel axes move between the token dims and the experts dim.
  // `grouped_input`: which input is the expert-grouped tensor for ops that read one (combine: 0,
  // the routing-weight gradient: 1); dispatch writes it (and, dropless, row_experts) instead.
  void partition_moe_exchange(const Op& global_op, size_t grouped_input = 0) {
    Op op = global_op;
    const bool dispatch = op.kind == OpKind::kMoeDispatch;
    const bool ragged = op.attrs.capacity_factor <= 0;
    const TensorId grouped_out = op.outputs[0];
    // Dispatch: tokens -> grouped; combine: grouped -> tokens. Let the grouped side be G.
    const TensorId grouped = dispatch ? grouped_out : op.inputs[grouped_input];
    const Tensor& grouped_tensor = global_.tensor(grouped);
    const int experts_dim = grouped_tensor.dim_index("experts");
    const AxisList expert_axes =
        experts_dim < 0 ? AxisList{} : layout(grouped)[static_cast<size_t>(experts_dim)];
    op.attrs.expert_shards = shards(expert_axes);
    // Compute with the expert axes on the token dim of the grouped tensor (tokens stay where they
    // are), then all-to-all them onto the experts dim.
    const Layout local_grouped = tokens_local_layout(grouped, expert_axes);
    if (dispatch) {
      std::vector<TensorId> inputs;
      inputs.reserve(op.inputs.size());
      for (const TensorId input : op.inputs) {
        inputs.push_back(reshard(input, layout(input), op.region));
      }
      std::vector<TensorId> computed;
      for (const TensorId output : op.outputs) {
        computed.push_back(make_local(
            global_.tensor(output), tokens_local_layout(output, expert_axes), op.region, "/local"));
      }
      add_op(op.kind, op.name, inputs, computed, op.attrs, op.region);
      for (size_t index = 0; index < op.outputs.size(); ++index) {
        const TensorId output = op.outputs[index];
        const Tensor& output_tensor = global_.tensor(output);
        if (!expert_axes.empty()) {
          exchange(computed[index], output_tensor, layout(output), expert_axes, op.region, ragged,
                   local(output));
        } else {
          add_op(OpKind::kDynamicSlice, output_tensor.name + "/slice", {computed[index]},
                 {local(output)}, {}, op.region);
        }
      }
      return;
    }
    TensorId value = local(grouped);
    if (!expert_axes.empty()) {
      value = exchange(value, grouped_tensor, local_grouped, expert_axes, op.region, ragged);
    }
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size());
    for (size_t index = 0; index < op.inputs.size(); ++index) {
      inputs.push_back(index == grouped_input
                           ? value
                           : reshard(op.inputs[index], layout(op.inputs[index]), op.region));
    }
    // The routing-weight gradient sums d_combined x expert_out over embed: partial over the axes
    // that split it.
    const AxisList partial = op.kind == OpKind::kRouterGrad
                                 ? summed_axes(op.inputs[0], layout(op.inputs[0]), op.outputs[0])
                                 : AxisList{};
    emit(op, std::move(inputs), {layout(op.outputs[0])}, partial);
  }

  // Adds an op to the program in the phase of the op being partitioned (a recompute clone's
  // collectives are recompute work too).
  int add_op(OpKind kind, std::string name, std::vector<TensorId> inputs,
             std::vector<TensorId> outputs, OpAttrs attrs, int region) {
    const int id = out_.add_op(kind, std::move(name), std::move(inputs), std::move(outputs),
                               std::move(attrs), region);
    out_.mutable_op(id).phase = current_phase_;
    return id;
  }

  void partition_op(const Op& op) {
    current_phase_ = op.phase;
    switch (op.kind) {
      case OpKind::kEinsum: {
        // A grouped matmul's third input (row_experts) follows its rows by dim name.
        Op einsum = op;
        if (op.inputs.size() == 3 && dropless_expert_tokens_ > 0) {
          einsum.attrs.routed_fraction = dropless_fraction_;
        }
        partition_einsum(einsum, {op.inputs[0], op.inputs[1]},
                         {plan_dims(op.inputs[0]), plan_dims(op.inputs[1])}, op.attrs.contracted);
        return;
      }
      case OpKind::kEmbeddingLookup: {
        // = einsum(one_hot(tokens)[batch, length, vocab], table[vocab, embed]) over vocab.
        std::vector<PlanDim> one_hot = plan_dims(op.inputs[0]);
        const Tensor& table = global_.tensor(op.inputs[1]);
        one_hot.push_back({table.dims[0].name, {}});
        partition_einsum(op, {-1, op.inputs[1]}, {std::move(one_hot), plan_dims(op.inputs[1])},
                         {table.dims[0].name});
        return;
      }
      case OpKind::kEmbeddingGrad: {
        // dtable = einsum(one_hot(tokens)[batch, length, vocab], dx[batch, length, embed]).
        std::vector<PlanDim> one_hot = plan_dims(op.inputs[1]);
        one_hot.push_back({global_.tensor(op.outputs[0]).dims[0].name, {}});
        partition_einsum(op, {-1, op.inputs[0]}, {std::move(one_hot), plan_dims(op.inputs[0])},
                         {"batch", "length"});
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
            collective(OpKind::kAllReduce, "all_reduce", local(op.outputs[0]), loss, {}, token_axes,
                       op.region);
          }
        }
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
        if (op.inputs.size() == 3) {  // d routing weights from (d combined, expert out, routing)
          partition_moe_exchange(op, 1);
          return;
        }
        partition_following_output(op);
        return;
      default:
        partition_following_output(op);
        return;
    }
  }

  const Graph& global_;
  const LogicalAxisRules& rules_;
  const DeviceMesh& mesh_;
  Graph out_;
  Graph extra_;  // global descriptions of tensors the partitioner invents (statistics)
  std::vector<Layout> layouts_;
  std::vector<TensorId> local_;
  std::map<std::pair<TensorId, Layout>, TensorId> alternates_;  // (global, layout) -> local,
                                                                // per region
  std::vector<PaddingNote> padding_;
  Phase current_phase_ = Phase::kForward;
  // Dropless MoE (size_dropless_buffers): the global expert_tokens size the rows need (0: no
  // dropless MoE), and the fraction of the rows balanced routing fills.
  int64_t dropless_expert_tokens_ = 0;
  double dropless_fraction_ = 1;
};

}  // namespace

PartitionedProgram partition(const TrainingStep& step, const LogicalAxisRules& rules,
                             const DeviceMesh& mesh) {
  return Partitioner(step, rules, mesh).run();
}

int64_t collective_bytes(const Graph& graph, const Op& op) {
  switch (op.kind) {
    case OpKind::kAllGather:
      return graph.tensor(op.outputs[0]).bytes();
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kCollectivePermute:
      return graph.tensor(op.inputs[0]).bytes();
    case OpKind::kAllToAll:
      // A ragged (dropless MoE) exchange moves the routed rows of its buffer.
      return static_cast<int64_t>(std::llround(
          static_cast<double>(graph.tensor(op.inputs[0]).bytes()) * op.attrs.routed_fraction));
    default:
      return 0;
  }
}

}  // namespace tpusim
