#include "model/model_dims.h"

#include <gtest/gtest.h>

#include "model/config.h"

namespace tpusim {
namespace {

// docs/reference/maxtext.md §0: the global_parameter_scale models of the 2023 tables.
TEST(ModelDims, GlobalParameterScaleFollowsGetIndividualScales) {
  const std::vector<std::string> base = {"base_emb_dim=2560",          "base_num_query_heads=8",
                                         "base_num_kv_heads=8",        "base_mlp_dim=8192",
                                         "base_num_decoder_layers=16", "head_dim=256"};
  struct Case {
    int scale;
    int64_t emb, heads, mlp, layers;
  };
  for (const Case& expected : {Case{16, 5120, 32, 32768, 32}, Case{32, 10240, 32, 32768, 32},
                               Case{64, 10240, 32, 32768, 64}, Case{128, 10240, 64, 65536, 64},
                               Case{1024, 20480, 128, 131072, 128}}) {
    std::vector<std::string> overrides = base;
    overrides.push_back("global_parameter_scale=" + std::to_string(expected.scale));
    const ModelDims dims = ModelDims::from_config(Config::load("", overrides));
    EXPECT_EQ(dims.emb_dim, expected.emb) << expected.scale;
    EXPECT_EQ(dims.num_query_heads, expected.heads) << expected.scale;
    EXPECT_EQ(dims.mlp_dim, expected.mlp) << expected.scale;
    EXPECT_EQ(dims.num_layers, expected.layers) << expected.scale;
    EXPECT_EQ(dims.head_dim, 256);
  }
}

TEST(ModelDims, PresetDims) {
  const ModelDims dims = ModelDims::from_config(Config::load("", {"model_name=llama3.1-405b"}));
  EXPECT_EQ(dims.emb_dim, 16384);
  EXPECT_EQ(dims.num_query_heads, 128);
  EXPECT_EQ(dims.num_kv_heads, 8);
  EXPECT_EQ(dims.mlp_dim, 53248);
  EXPECT_EQ(dims.num_layers, 126);
  EXPECT_EQ(dims.vocab_size, 128256);
  const ModelDims moe = ModelDims::from_config(Config::load("", {"model_name=mixtral-8x7b"}));
  EXPECT_TRUE(moe.is_moe());
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.num_experts_per_tok, 2);
}

}  // namespace
}  // namespace tpusim
