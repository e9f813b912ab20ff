#include "sharding/reassociate_reductions.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "model/ir/op_kind_traits.h"

namespace tpusim {
namespace {

bool is_sum(const Op& op) {
  return op.kind == OpKind::kElementwise && op.attrs.function == ElementwiseFn::kAdd &&
         op.inputs.size() == 2 && op.outputs.size() == 1 && op.inputs[0] != op.inputs[1];
}

bool is_summing_reduction(const Op& op) {
  return is_reducing_collective(op.kind) && op.attrs.reduce == ReduceOp::kSum &&
         op.inputs.size() == 1 && op.outputs.size() == 1;
}

bool same_reduction(const Op& a, const Op& b) {
  return a.kind == b.kind && a.attrs.mesh_axes == b.attrs.mesh_axes &&
         a.attrs.group_size == b.attrs.group_size && a.attrs.every == b.attrs.every &&
         a.attrs.iteration_share == b.attrs.iteration_share;
}

}  // namespace

bool same_local_shape(const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype || a.dims.size() != b.dims.size()) {
    return false;
  }
  for (size_t dim = 0; dim < a.dims.size(); ++dim) {
    if (a.dims[dim].name != b.dims[dim].name || a.dims[dim].size != b.dims[dim].size) {
      return false;
    }
  }
  return true;
}

int reassociate_reductions(Graph& graph, SizeDecisions* decisions) {
  const Graph::Ops& ops = graph.ops();
  const size_t tensors = graph.tensors().size();
  // Who reads each tensor; a carry's source is read after its region (never a sole reader).
  std::vector<int> readers(tensors, 0);
  std::vector<int> reader(tensors, -1);
  for (const Op& op : ops) {
    for (const TensorId input : op.inputs) {
      ++readers[static_cast<size_t>(input)];
      reader[static_cast<size_t>(input)] = op.id;
    }
  }
  for (const Graph::Carry& carry : graph.carries()) {
    readers[static_cast<size_t>(carry.from)] += 2;
  }
  // True when `tensor`, an activation gradient, is read by one sum of the same region alone.
  auto read_by_one_sum = [&](TensorId tensor, int region) {
    const auto index = static_cast<size_t>(tensor);
    if (readers[index] != 1 || graph.tensor(tensor).kind != TensorKind::kGradient) {
      return false;
    }
    const Op& op = ops[static_cast<size_t>(reader[index])];
    return is_sum(op) && op.region == region;
  };
  // Analysis, in program order: a value is "reduced" when it is a summing reduction's result (or a
  // rewritten sum's) that only a sum reads; reduction_of gives the reduction it stands for. A sum
  // of two reduced values of the same reduction and shapes is rewritten.
  // Local sizes decide whether two partial sums add up (a choice kept in `decisions`).
  auto same_shape = [&](TensorId a, TensorId b) {
    const bool same = same_local_shape(graph.tensor(a), graph.tensor(b));
    if (decisions != nullptr) {
      decisions->shapes_equal(a, b, same);
    }
    return same;
  };
  std::vector<int> reduction_of(tensors, -1);
  std::vector<bool> rewritten_sum(ops.size(), false);
  for (const Op& op : ops) {
    if (is_summing_reduction(op)) {
      if (readers[static_cast<size_t>(op.inputs[0])] == 1 &&
          read_by_one_sum(op.outputs[0], op.region)) {
        reduction_of[static_cast<size_t>(op.outputs[0])] = op.id;
      }
      continue;
    }
    if (!is_sum(op)) {
      continue;
    }
    const int left = reduction_of[static_cast<size_t>(op.inputs[0])];
    const int right = reduction_of[static_cast<size_t>(op.inputs[1])];
    if (left < 0 || right < 0) {
      continue;
    }
    const Op& left_reduction = ops[static_cast<size_t>(left)];
    const Op& right_reduction = ops[static_cast<size_t>(right)];
    const TensorId sum = op.outputs[0];
    if (!same_reduction(left_reduction, right_reduction) ||
        !same_shape(left_reduction.inputs[0], right_reduction.inputs[0]) ||
        !same_shape(op.inputs[0], sum) || !same_shape(op.inputs[1], sum)) {
      continue;
    }
    rewritten_sum[static_cast<size_t>(op.id)] = true;
    if (read_by_one_sum(op.outputs[0], op.region)) {
      reduction_of[static_cast<size_t>(op.outputs[0])] = left;
    }
  }
  // Nothing to rewrite: the graph stays as it is, and no op is copied.
  if (std::find(rewritten_sum.begin(), rewritten_sum.end(), true) == rewritten_sum.end()) {
    return 0;
  }
  // The value each reduced tensor sums before its reduction; held reductions are dropped.
  auto held = [&](TensorId tensor) {
    const auto index = static_cast<size_t>(tensor);
    return reduction_of[index] >= 0 && rewritten_sum[static_cast<size_t>(reader[index])];
  };
  std::vector<TensorId> partial_of(tensors, -1);
  Graph::Ops program;
  int removed = 0;
  for (const Op& op : ops) {
    if (is_summing_reduction(op) && held(op.outputs[0])) {
      partial_of[static_cast<size_t>(op.outputs[0])] = op.inputs[0];
      ++removed;
      continue;
    }
    if (!rewritten_sum[static_cast<size_t>(op.id)]) {
      // Moved: the program replaces the graph's ops below (a rewritten sum removes at least the
      // two reductions it sums and adds back at most one), and nothing reads a kept op again.
      program.push_back(std::move(graph.mutable_op(op.id)));
      continue;
    }
    const TensorId left = partial_of[static_cast<size_t>(op.inputs[0])];
    const TensorId right = partial_of[static_cast<size_t>(op.inputs[1])];
    const Tensor& like = graph.tensor(left);
    const Tensor& result = graph.tensor(op.outputs[0]);
    const TensorId partial_sum =
        graph.add_tensor(result.name + "/partial", like.dims, like.dtype, result.kind, op.region);
    Op sum = op;
    sum.inputs = {left, right};
    sum.outputs = {partial_sum};
    program.push_back(sum);
    if (held(op.outputs[0])) {
      partial_of[static_cast<size_t>(op.outputs[0])] = partial_sum;
      continue;
    }
    Op reduction = ops[static_cast<size_t>(reduction_of[static_cast<size_t>(op.inputs[0])])];
    reduction.name = result.name +
                     (reduction.kind == OpKind::kReduceScatter ? "/reduce_scatter" : "/all_reduce");
    reduction.inputs = {partial_sum};
    reduction.outputs = {op.outputs[0]};
    reduction.region = op.region;
    reduction.phase = op.phase;
    program.push_back(reduction);
    --removed;
  }
  graph.replace_ops(std::move(program));
  return removed;
}

}  // namespace tpusim
