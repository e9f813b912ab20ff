#include "model/ir/graph.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace tpusim {
namespace {

// The copying entry points the partitioner uses build the same tensors and ops as add_tensor and
// add_op: every field, the producer of each output, and the listing.
TEST(Graph, CopyingAddsBuildWhatTheMovingAddsBuild) {
  const std::vector<Dim> x_dims = {{"batch", 8, "activation_batch"}, {"embed", 4096, "embed"}};
  const std::vector<Dim> w_dims = {{"embed", 4096, "embed"}, {"mlp", 14336, "mlp"}};
  OpAttrs attrs;
  attrs.contracted = {"embed"};
  attrs.mesh_axes = {"fsdp", "tensor_transpose"};  // the second longer than a short string
  attrs.group_size = 4;

  Graph moved;
  const int moved_region = moved.add_region("layer", 32, Phase::kBackward);
  moved.add_tensor("x", x_dims, DType::kBF16, TensorKind::kActivation, moved_region, "context");
  moved.add_tensor("w", w_dims, DType::kF32, TensorKind::kParameter, moved_region);
  moved.add_tensor("h", {{"batch", 8, "activation_batch"}, {"mlp", 14336, "activation_mlp"}},
                   DType::kBF16, TensorKind::kActivation, moved_region);
  moved.add_op(OpKind::kEinsum, "layer/mlp/wi_0", {0, 1}, {2}, attrs, moved_region);

  Graph copied;
  const int copied_region = copied.add_region("layer", 32, Phase::kBackward);
  copied.add_tensor_copy("x", x_dims, DType::kBF16, TensorKind::kActivation, copied_region,
                         "context");
  copied.add_tensor_copy("w", w_dims, DType::kF32, TensorKind::kParameter, copied_region);
  copied.add_tensor_copy("h", moved.tensor(2).dims, DType::kBF16, TensorKind::kActivation,
                         copied_region);
  const std::vector<TensorId> inputs = {0, 1};
  const std::vector<TensorId> outputs = {2};
  copied.add_op_copy(OpKind::kEinsum, "layer/mlp/wi_0", inputs, outputs, attrs, copied_region);

  ASSERT_EQ(copied.tensors().size(), 3U);
  for (TensorId id = 0; id < 3; ++id) {
    const Tensor& a = moved.tensor(id);
    const Tensor& b = copied.tensor(id);
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.describe(), b.describe());
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.region, b.region);
    EXPECT_EQ(a.remat_name, b.remat_name);
  }
  EXPECT_EQ(copied.tensor(0).remat_name, "context");
  ASSERT_EQ(copied.ops().size(), 1U);
  const Op& op = copied.ops()[0];
  EXPECT_EQ(op.id, 0);
  EXPECT_EQ(op.name, "layer/mlp/wi_0");
  EXPECT_EQ(op.inputs, moved.ops()[0].inputs);
  EXPECT_EQ(op.outputs, moved.ops()[0].outputs);
  EXPECT_EQ(op.attrs, attrs);
  EXPECT_EQ(op.phase, Phase::kBackward);  // the region's
  EXPECT_EQ(copied.producer(2), 0);
  EXPECT_EQ(copied.producer(0), -1);
  EXPECT_EQ(copied.to_text(), moved.to_text());
}

TEST(Graph, CopyingAddRejectsASecondWriterLikeAddOp) {
  Graph graph;
  const int region = graph.add_region("layer", 1, Phase::kForward);
  const std::vector<Dim> dims = {{"embed", 16, "embed"}};
  graph.add_tensor_copy("a", dims, DType::kF32, TensorKind::kActivation, region);
  graph.add_tensor_copy("b", dims, DType::kF32, TensorKind::kActivation, region);
  const std::vector<TensorId> inputs = {0};
  const std::vector<TensorId> outputs = {1};
  graph.add_op_copy(OpKind::kElementwise, "first", inputs, outputs, {}, region);
  EXPECT_THROW(graph.add_op_copy(OpKind::kElementwise, "second", inputs, outputs, {}, region),
               std::logic_error);
  EXPECT_THROW(graph.add_op(OpKind::kElementwise, "third", {0}, {1}, {}, region), std::logic_error);
}

}  // namespace
}  // namespace tpusim
