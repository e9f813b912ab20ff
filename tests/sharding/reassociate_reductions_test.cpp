// reassociate_reductions on hand-built per-device programs: which sums of reductions become one
// reduction of a sum, and which are left as they are.
#include "sharding/reassociate_reductions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tpusim {
namespace {

constexpr int64_t kRows = 8;
constexpr int64_t kEmbed = 16;
constexpr int64_t kGroup = 4;

// Partial sums of an activation gradient over a tensor axis of 4, and their reduce-scatters.
struct Program {
  Graph graph;
  int region = 0;

  Program() { region = graph.add_region("layer/backward", 1, Phase::kBackward); }

  TensorId partial(const std::string& name) {
    return graph.add_tensor(name, {{"rows", kRows, "batch"}, {"embed", kEmbed, "embed"}},
                            DType::kBF16, TensorKind::kGradient, region);
  }
  TensorId shard(const std::string& name) {
    return graph.add_tensor(name, {{"rows", kRows, "batch"}, {"embed", kEmbed / kGroup, "embed"}},
                            DType::kBF16, TensorKind::kGradient, region);
  }
  // `input` reduce-scattered over `axis` into a new shard.
  TensorId reduce_scatter(TensorId input, const std::string& name,
                          const std::string& axis = "tensor") {
    const TensorId output = shard(name);
    OpAttrs attrs;
    attrs.mesh_axes = {axis};
    attrs.group_size = kGroup;
    graph.add_op(OpKind::kReduceScatter, name + "/reduce_scatter", {input}, {output}, attrs,
                 region);
    return output;
  }
  // A matmul-like producer of a partial sum (an op of its own, so the partial has a writer).
  TensorId produce(const std::string& name) {
    const TensorId output = partial(name);
    graph.add_op(OpKind::kEinsum, name, {}, {output}, {}, region);
    return output;
  }
  TensorId add(TensorId left, TensorId right, const std::string& name) {
    const TensorId output = shard(name);
    graph.add_op(OpKind::kElementwise, name, {left, right}, {output}, {}, region);
    return output;
  }
  void read(TensorId tensor, const std::string& name) {
    const TensorId output = shard(name);
    OpAttrs attrs;
    attrs.function = ElementwiseFn::kMul;
    graph.add_op(OpKind::kElementwise, name, {tensor, tensor}, {output}, attrs, region);
  }

  int count(OpKind kind) const {
    int found = 0;
    for (const Op& op : graph.ops()) {
      found += op.kind == kind ? 1 : 0;
    }
    return found;
  }
};

// Three projections' partial gradients, each reduce-scattered, summed in a chain: one sum of
// partials per sum, then one reduce-scatter into the last sum's tensor, before its reader.
TEST(ReassociateReductions, ChainOfThreeBecomesOneReduction) {
  Program program;
  const TensorId value = program.reduce_scatter(program.produce("value_grad"), "value");
  const TensorId key = program.reduce_scatter(program.produce("key_grad"), "key");
  const TensorId first = program.add(value, key, "grad_sum");
  const TensorId query = program.reduce_scatter(program.produce("query_grad"), "query");
  const TensorId total = program.add(first, query, "grad_sum_2");
  program.read(total, "norm_grad");

  EXPECT_EQ(reassociate_reductions(program.graph), 2);
  const Graph& graph = program.graph;
  EXPECT_EQ(program.count(OpKind::kReduceScatter), 1);
  const int writer = graph.producer(total);
  ASSERT_GE(writer, 0);
  const Op& reduction = graph.ops()[static_cast<size_t>(writer)];
  EXPECT_EQ(reduction.kind, OpKind::kReduceScatter);
  EXPECT_EQ(reduction.attrs.mesh_axes, std::vector<std::string>{"tensor"});
  EXPECT_EQ(reduction.attrs.group_size, kGroup);
  // It reduces the whole partial sum, and the sums run on partials (their full size).
  const Tensor& summed = graph.tensor(reduction.inputs[0]);
  EXPECT_EQ(summed.dims[1].size, kEmbed);
  const Op& last_sum = graph.ops()[static_cast<size_t>(graph.producer(reduction.inputs[0]))];
  EXPECT_EQ(last_sum.kind, OpKind::kElementwise);
  EXPECT_EQ(graph.tensor(last_sum.inputs[1]).name, "query_grad");
  // Order: the reduction right after the last sum, the reader after it; ids are positions.
  EXPECT_EQ(reduction.id, last_sum.id + 1);
  EXPECT_EQ(graph.ops().back().name, "norm_grad");
  for (size_t index = 0; index < graph.ops().size(); ++index) {
    EXPECT_EQ(graph.ops()[index].id, static_cast<int>(index));
    EXPECT_EQ(graph.ops()[index].phase, Phase::kBackward);
  }
  // The shards the three reduce-scatters wrote are no longer written or read.
  EXPECT_LT(graph.producer(value), 0);
  EXPECT_LT(graph.producer(key), 0);
  EXPECT_LT(graph.producer(first), 0);
  EXPECT_LT(graph.producer(query), 0);
}

// A reduced value something else reads too must exist as it is: nothing changes.
TEST(ReassociateReductions, LeavesAReductionReadElsewhere) {
  Program program;
  const TensorId value = program.reduce_scatter(program.produce("value_grad"), "value");
  const TensorId key = program.reduce_scatter(program.produce("key_grad"), "key");
  program.read(program.add(value, key, "grad_sum"), "norm_grad");
  program.read(value, "other_reader");
  EXPECT_EQ(reassociate_reductions(program.graph), 0);
  EXPECT_EQ(program.count(OpKind::kReduceScatter), 2);
}

// Reductions over different mesh axes do not combine.
TEST(ReassociateReductions, LeavesReductionsOverDifferentAxes) {
  Program program;
  const TensorId value = program.reduce_scatter(program.produce("value_grad"), "value");
  const TensorId key =
      program.reduce_scatter(program.produce("key_grad"), "key", "tensor_sequence");
  program.read(program.add(value, key, "grad_sum"), "norm_grad");
  EXPECT_EQ(reassociate_reductions(program.graph), 0);
  EXPECT_EQ(program.count(OpKind::kReduceScatter), 2);
}

// A sum of a reduced value and a plain one (a residual's gradient) keeps its reduction.
TEST(ReassociateReductions, LeavesASumWithAnUnreducedOperand) {
  Program program;
  const TensorId value = program.reduce_scatter(program.produce("value_grad"), "value");
  const TensorId residual = program.shard("residual_grad");
  program.graph.add_op(OpKind::kEinsum, "residual", {}, {residual}, {}, program.region);
  program.read(program.add(value, residual, "grad_sum"), "norm_grad");
  EXPECT_EQ(reassociate_reductions(program.graph), 0);
  EXPECT_EQ(program.count(OpKind::kReduceScatter), 1);
}

}  // namespace
}  // namespace tpusim
