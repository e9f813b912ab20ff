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

// Qwen3 (Transformers' Qwen3ForCausalLM, tiny-qwen3: embed 64, 4 heads / 2 kv heads of head_dim
// 32, tied logits): q_proj.weight[h * 32 + d][e] = query[e][h][d] unscaled (both MaxText's qk-norm
// attention and Transformers' Qwen3 multiply q.k by 1/sqrt(head_dim) at run time);
// self_attn.q_norm.weight / k_norm.weight = the [head_dim] scales of tpusim's query_norm /
// key_norm; no lm_head (tie_word_embeddings).
TEST(HfNames, Qwen3LayoutsAndQkNorms) {
  const Config config = tiny("tiny-qwen3");
  EXPECT_EQ(hf_family(config), "qwen3");
  auto weights = initial_weights(config);
  // The norm scales start at ones: make them distinguishable.
  for (auto& [name, tensor] : weights) {
    if (name.find("_norm/scale") != std::string::npos) {
      for (size_t index = 0; index < tensor.values.size(); ++index) {
        tensor.values[index] = 1.0f + 0.125f * static_cast<float>(index % 8);
      }
      tensor.values[0] = name.find("key_norm") != std::string::npos ? 3.0f : 2.0f;
    }
  }
  const auto hf = to_hf(config, weights);
  const auto& query = weights.at("layer/attention/query#1").values;  // [64, 4, 32]
  const auto& q_proj = hf.at("model.layers.1.self_attn.q_proj.weight");
  ASSERT_EQ(q_proj.shape, (std::vector<int64_t>{128, 64}));
  for (const auto& [e, h, d] : {std::tuple{0, 0, 0}, std::tuple{5, 3, 31}, std::tuple{63, 2, 7}}) {
    EXPECT_EQ(q_proj.values[static_cast<size_t>((h * 32 + d) * 64 + e)],
              query[static_cast<size_t>((e * 4 + h) * 32 + d)]);
  }
  EXPECT_EQ(hf.at("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(hf.at("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{64, 128}));
  const auto& q_norm = hf.at("model.layers.1.self_attn.q_norm.weight");
  ASSERT_EQ(q_norm.shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(q_norm.values, weights.at("layer/attention/query_norm/scale#1").values);
  EXPECT_EQ(q_norm.values[0], 2.0f);
  EXPECT_EQ(hf.at("model.layers.0.self_attn.k_norm.weight").values[0], 3.0f);
  EXPECT_FALSE(hf.contains("lm_head.weight"));
  // 2 layers x 11 tensors + embedding + final norm.
  EXPECT_EQ(hf.size(), 24u);
  const auto back = from_hf(config, hf);
  EXPECT_EQ(back.at("layer/attention/key_norm/scale#0").values,
            weights.at("layer/attention/key_norm/scale#0").values);
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
  for (const std::string model : {"tiny-llama", "tiny-gpt3", "tiny-qwen3"}) {
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
  // Mixtral's names need every layer MoE, dropless; a dense family with experts has none. The
  // top-k weights are renormalized as Transformers does whatever norm_topk_prob says (MaxText's
  // mixtral router is a softmax over the chosen logits).
  EXPECT_EQ(hf_family(tiny("tiny-moe")), "mixtral");
  EXPECT_EQ(hf_family(tiny("tiny-moe", {"override_model_config=true", "norm_topk_prob=true"})),
            "mixtral");
  expect_user_error(
      [&] {
        hf_family(tiny("tiny-moe", {"override_model_config=true", "norm_topk_prob=true",
                                    "capacity_factor=1.25"}));
      },
      "capacity_factor");
  expect_user_error([&] { hf_family(tiny("tiny-llama", {"num_experts=4"})); },
                    "decoder_block 'llama2' with experts");
  expect_user_error([&] { hf_family(tiny("tiny-mla")); }, "decoder_block 'deepseek'");
  // Only Qwen3's names have q_norm / k_norm, and Qwen3 always has them.
  expect_user_error([&] { hf_family(tiny("tiny-llama", {"use_qk_norm=true"})); }, "only Qwen3");
  expect_user_error(
      [&] {
        hf_family(tiny("tiny-qwen3", {"override_model_config=true", "use_qk_norm=false"}));
      },
      "need use_qk_norm true");
  const Config qwen3 = tiny("tiny-qwen3");
  auto without_norm = to_hf(qwen3, initial_weights(qwen3));
  without_norm.erase("model.layers.0.self_attn.k_norm.weight");
  expect_user_error([&] { from_hf(qwen3, without_norm); },
                    "'model.layers.0.self_attn.k_norm.weight'");
}

TEST(HfNames, ConfigJsonHasTransformersFields) {
  const nlohmann::json llama = hf_config_json(tiny("tiny-llama"));
  EXPECT_EQ(llama.at("architectures"), nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(llama.at("hidden_size"), 64);
  EXPECT_EQ(llama.at("num_key_value_heads"), 2);
  EXPECT_EQ(llama.at("head_dim"), 16);
  EXPECT_EQ(llama.at("rope_theta"), 10000.0);
  EXPECT_EQ(llama.at("tie_word_embeddings"), false);
  // Qwen3Config: tiny-qwen3's head_dim 32 (not hidden_size / heads = 16), epsilon 1e-6, theta 1e6,
  // tied logits.
  const nlohmann::json qwen3 = hf_config_json(tiny("tiny-qwen3"));
  EXPECT_EQ(qwen3.at("architectures"), nlohmann::json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(qwen3.at("model_type"), "qwen3");
  EXPECT_EQ(qwen3.at("head_dim"), 32);
  EXPECT_EQ(qwen3.at("num_attention_heads"), 4);
  EXPECT_EQ(qwen3.at("num_key_value_heads"), 2);
  EXPECT_EQ(qwen3.at("intermediate_size"), 128);
  EXPECT_EQ(qwen3.at("rms_norm_eps"), 1e-6);
  EXPECT_EQ(qwen3.at("rope_theta"), 1e6);
  EXPECT_EQ(qwen3.at("tie_word_embeddings"), true);
  EXPECT_EQ(qwen3.at("attention_bias"), false);
  EXPECT_EQ(qwen3.at("use_sliding_window"), false);
  const nlohmann::json gpt2 = hf_config_json(tiny("tiny-gpt3"));
  EXPECT_EQ(gpt2.at("model_type"), "gpt2");
  EXPECT_EQ(gpt2.at("n_inner"), 256);
  EXPECT_EQ(gpt2.at("n_positions"), 512);
}

}  // namespace
}  // namespace tpusim
