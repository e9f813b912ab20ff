// The Hugging Face mapping (sim/train/hf_names.h): layouts and the query scale checked element by
// element against Transformers' definitions, export -> import round trips, and bad input named.
#include "sim/train/hf_names.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "model/config.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

Config tiny(const std::string& model, const std::vector<std::string>& more = {}) {
  std::vector<std::string> overrides = {"model_name=" + model, "compile_topology=v5e-1",
                                        "per_device_batch_size=1", "max_target_length=16"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return Config::load("", overrides);
}

std::map<std::string, CheckpointTensor> initial_weights(const Config& config) {
  ShardedModel model(config);
  return model.to_checkpoint(0).weights;
}

// Llama: q_proj.weight[h * head_dim + d][e] = query[e][h][d] x sqrt(head_dim) (tpusim's query
// carries 1/sqrt(16) = 1/4, Transformers applies it at run time); o_proj.weight[e][h * 16 + d] =
// out[h][d][e]; gate_proj.weight[m][e] = wi_0[e][m].
TEST(HfNames, LlamaLayoutsAndQueryScale) {
  const Config config = tiny("tiny-llama");
  const auto weights = initial_weights(config);
  const auto hf = to_hf(config, weights);
  const auto& query = weights.at("layer/attention/query#1").values;  // [64, 4, 16]
  const auto& q_proj = hf.at("model.layers.1.self_attn.q_proj.weight");
  ASSERT_EQ(q_proj.shape, (std::vector<int64_t>{64, 64}));
  for (const auto& [e, h, d] : {std::tuple{0, 0, 0}, std::tuple{5, 3, 15}, std::tuple{63, 2, 7}}) {
    EXPECT_EQ(q_proj.values[static_cast<size_t>((h * 16 + d) * 64 + e)],
              query[static_cast<size_t>((e * 4 + h) * 16 + d)] * 4.0f);
  }
  const auto& out = weights.at("layer/attention/out#0").values;  // [4, 16, 64]
  const auto& o_proj = hf.at("model.layers.0.self_attn.o_proj.weight");
  ASSERT_EQ(o_proj.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(o_proj.values[static_cast<size_t>(7 * 64 + (2 * 16 + 5))],
            out[static_cast<size_t>((2 * 16 + 5) * 64 + 7)]);
  const auto& wi_0 = weights.at("layer/mlp/wi_0#0").values;  // [64, 128]
  const auto& gate = hf.at("model.layers.0.mlp.gate_proj.weight");
  ASSERT_EQ(gate.shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(gate.values[static_cast<size_t>(100 * 64 + 9)],
            wi_0[static_cast<size_t>(9 * 128 + 100)]);
  EXPECT_EQ(hf.at("lm_head.weight").shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(hf.at("model.embed_tokens.weight").values,
            weights.at("embed/token_embedding#0").values);
  // 2 layers x 9 tensors + embedding + final norm + lm_head.
  EXPECT_EQ(hf.size(), 21u);
}

// GPT-2: c_attn.weight [64, 192] holds query | key | value side by side, [in, out] (Conv1D); the
// query is not rescaled (GPT-3 and GPT-2 both divide by sqrt(head_dim) at run time); the biases
// tpusim does not have are zeros.
TEST(HfNames, Gpt2FusedAttentionAndZeroBiases) {
  const Config config = tiny("tiny-gpt3");
  const auto weights = initial_weights(config);
  const auto hf = to_hf(config, weights);
  const auto& c_attn = hf.at("transformer.h.0.attn.c_attn.weight");
  ASSERT_EQ(c_attn.shape, (std::vector<int64_t>{64, 192}));
  const auto& key = weights.at("layer/attention/key#0").values;  // [64, 4, 16]
  EXPECT_EQ(c_attn.values[static_cast<size_t>(11 * 192 + 64 + (3 * 16 + 2))],
            key[static_cast<size_t>((11 * 4 + 3) * 16 + 2)]);
  const auto& query = weights.at("layer/attention/query#0").values;
  EXPECT_EQ(c_attn.values[static_cast<size_t>(11 * 192 + 5)],
            query[static_cast<size_t>(11 * 64 + 5)]);
  for (const float bias : hf.at("transformer.h.1.attn.c_attn.bias").values) {
    EXPECT_EQ(bias, 0.0f);
  }
  EXPECT_EQ(hf.at("transformer.wpe.weight").shape, (std::vector<int64_t>{512, 64}));
}

TEST(HfNames, ExportThenImportGivesTheSameWeights) {
  for (const std::string model : {"tiny-llama", "tiny-gpt3"}) {
    SCOPED_TRACE(model);
    const Config config = tiny(model);
    const auto weights = initial_weights(config);
    const auto back = from_hf(config, to_hf(config, weights));
    ASSERT_EQ(back.size(), weights.size());
    for (const auto& [name, tensor] : weights) {
      ASSERT_TRUE(back.contains(name)) << name;
      EXPECT_EQ(back.at(name).shape, tensor.shape) << name;
      EXPECT_EQ(back.at(name).values, tensor.values) << name;  // scales are powers of two
    }
  }
}

void expect_user_error(const std::function<void()>& action, const std::string& fragment) {
  try {
    action();
    ADD_FAILURE() << "no UserError (expected one naming '" << fragment << "')";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(HfNames, BadInputNamesTheTensorOrKey) {
  const Config config = tiny("tiny-llama");
  auto hf = to_hf(config, initial_weights(config));
  auto missing = hf;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_user_error([&] { from_hf(config, missing); }, "'model.layers.1.mlp.up_proj.weight'");
  auto reshaped = hf;
  reshaped.at("model.norm.weight").shape = {32, 2};
  expect_user_error([&] { from_hf(config, reshaped); }, "'model.norm.weight' has shape [32,2]");
  const Config gpt3 = tiny("tiny-gpt3");
  auto biased = to_hf(gpt3, initial_weights(gpt3));
  biased.at("transformer.h.0.mlp.c_fc.bias").values[3] = 0.5f;
  expect_user_error([&] { from_hf(gpt3, biased); }, "'transformer.h.0.mlp.c_fc.bias' is not zero");
  expect_user_error([&] { hf_family(tiny("tiny-moe")); }, "decoder_block 'mixtral'");
  expect_user_error([&] { hf_family(tiny("tiny-llama", {"num_experts=4"})); },
                    "mixture of experts");
  expect_user_error([&] { hf_family(tiny("tiny-mla")); }, "decoder_block 'deepseek'");
}

TEST(HfNames, ConfigJsonHasTransformersFields) {
  const nlohmann::json llama = hf_config_json(tiny("tiny-llama"));
  EXPECT_EQ(llama.at("architectures"), nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(llama.at("hidden_size"), 64);
  EXPECT_EQ(llama.at("num_key_value_heads"), 2);
  EXPECT_EQ(llama.at("head_dim"), 16);
  EXPECT_EQ(llama.at("rope_theta"), 10000.0);
  EXPECT_EQ(llama.at("tie_word_embeddings"), false);
  const nlohmann::json gpt2 = hf_config_json(tiny("tiny-gpt3"));
  EXPECT_EQ(gpt2.at("model_type"), "gpt2");
  EXPECT_EQ(gpt2.at("n_inner"), 256);
  EXPECT_EQ(gpt2.at("n_positions"), 512);
}

}  // namespace
}  // namespace tpusim
