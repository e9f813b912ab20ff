#include "sharding/logical_rules.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "hw/slice.h"
#include "model/config.h"
#include "sharding/device_mesh.h"

namespace tpusim {
namespace {

MeshShape mesh_of(const std::vector<std::string>& overrides, const std::string& slice) {
  return resolve_mesh(Config::load("", overrides), parse_slice(slice));
}

std::vector<std::string> names(const std::vector<int>& axes) {
  std::vector<std::string> result;
  for (const int axis : axes) {
    result.push_back(mesh_axis_names()[static_cast<size_t>(axis)]);
  }
  return result;
}

using Names = std::vector<std::string>;

// flax semantics: rules apply in list order; 'mlp' (listed first) takes fsdp_transpose and tensor,
// so 'embed' falls back to its rule without fsdp_transpose.
TEST(LogicalRules, RuleOrderAndFallbacks) {
  const Config config = Config::load("", {});
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  const MeshShape mesh = mesh_of(
      {"ici_fsdp_parallelism=2", "ici_fsdp_transpose_parallelism=2", "ici_tensor_parallelism=2"},
      "v5p-16");
  const auto wi = rules.shard_dims({Dim{"embed", 4096, "embed"}, Dim{"mlp", 14336, "mlp"}}, mesh);
  EXPECT_EQ(names(wi[0]), (Names{"fsdp"}));
  EXPECT_EQ(names(wi[1]), (Names{"fsdp_transpose", "tensor"}));
  // Activations: batch over data/fsdp/fsdp_transpose/expert; embed over tensor.
  const auto x = rules.shard_dims(
      {Dim{"batch", 8, "activation_batch"}, Dim{"length", 2048, "activation_length"},
       Dim{"embed", 4096, "activation_embed"}},
      mesh);
  EXPECT_EQ(names(x[0]), (Names{"fsdp", "fsdp_transpose"}));
  EXPECT_TRUE(x[1].empty());
  EXPECT_EQ(names(x[2]), (Names{"tensor"}));
}

TEST(LogicalRules, MergedDimsTakeTheUnion) {
  const LogicalAxisRules rules = LogicalAxisRules::from_config(Config::load("", {}));
  const MeshShape mesh = mesh_of({"ici_fsdp_parallelism=4", "ici_context_parallelism=2"}, "v5p-16");
  const auto tokens = rules.shard_dims(
      {Dim{"expert_tokens", 1024, "activation_batch_no_exp+activation_length"}}, mesh);
  EXPECT_EQ(names(tokens[0]), (Names{"fsdp", "context"}));
}

TEST(LogicalRules, UnknownMeshAxisIsUserError) {
  try {
    LogicalAxisRules::from_rules({{"embed", {"fsdp", "tensr"}}});
    FAIL();
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("tensr"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("did you mean 'tensor'"), std::string::npos);
  }
}

TEST(DeviceMesh, InnermostAxesTakeWholeTorusAxes) {
  const Slice slice = parse_slice("v5p-128");  // 4x4x4, wraps
  const DeviceMesh mesh = place_mesh(mesh_of({"ici_tensor_parallelism=4"}, "v5p-128"), slice);
  const MeshAxisPlacement& tensor = mesh.axis("tensor");
  ASSERT_EQ(tensor.portions.size(), 1u);
  EXPECT_EQ(tensor.portions[0].size, 4);
  EXPECT_TRUE(tensor.wraps(slice));
  const MeshAxisPlacement& fsdp = mesh.axis("fsdp");
  EXPECT_EQ(fsdp.portions.size(), 2u);
  EXPECT_TRUE(fsdp.wraps(slice));
  EXPECT_FALSE(fsdp.split);
}

TEST(DeviceMesh, V7xSizeTwoAxisUsesTheChipletPair) {
  const Slice slice = parse_slice("tpu7x-128");
  const DeviceMesh mesh = place_mesh(mesh_of({"ici_tensor_parallelism=2"}, "tpu7x-128"), slice);
  EXPECT_TRUE(mesh.axis("tensor").uses_chiplets());
  EXPECT_FALSE(mesh.axis("fsdp").uses_chiplets());
  EXPECT_EQ(mesh.axis("fsdp").portions.size(), 3u);
  EXPECT_NE(mesh.axis("tensor").describe(slice).find("D2D"), std::string::npos);
}

TEST(DeviceMesh, AxisSmallerThanAnyPhysicalAxisIsSplit) {
  const Slice slice = parse_slice("v6e-256");  // 16x16
  const DeviceMesh mesh = place_mesh(mesh_of({"ici_tensor_parallelism=4"}, "v6e-256"), slice);
  EXPECT_TRUE(mesh.axis("tensor").split);
  EXPECT_FALSE(mesh.axis("tensor").wraps(slice));
}

TEST(DeviceMesh, DcnAxesSpanSlices) {
  const Slice slice = parse_slice("v5e-256", 4);
  const DeviceMesh mesh = place_mesh(resolve_mesh(Config::load("", {}), slice), slice);
  EXPECT_EQ(mesh.axis("data").dcn_size, 4);
  EXPECT_NE(mesh.axis("data").describe(slice).find("DCN"), std::string::npos);
}

}  // namespace
}  // namespace tpusim
