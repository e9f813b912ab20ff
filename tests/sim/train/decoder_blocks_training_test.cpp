// tests/sim/train/decoder_blocks_training_test.cpp: deepseek4 and qwen3_custom_moe as `tpusim
// train` computes them (docs/reference/deepseek4.md, section 6), sharded against one device: one
// step's loss, every gradient and the updated weights and Adam moments within 1e-5 (relative L2 per
// tensor, docs/reference/numerics.md; a tensor zero by construction against its kind's global
// norm, compare_steps), on the reference numerics. Slow (a minute on a loaded
// machine): labeled "slow".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "sim/functional/tensor_data.h"
#include "sim/train/checkpoint.h"
#include "sim/train/sharded_model.h"
#include "tests/support/one_step.h"

namespace tpusim {
namespace {

constexpr double kTolerance = 1e-5;
// A tensor whose one-device gradient is below this fraction of the global gradient norm gets no
// gradient in exact arithmetic (with mHC, the first hyper-connection's pre and res maps: its
// streams are copies of the embedding), so both steps hold fp32 rounding noise there (measured
// 6e-9 of the global norm; the smallest true mHC gradient seen, 1.5e-5 of it: see
// tests/reference/torch_reference.py's ZERO_BY_CONSTRUCTION, which judges by the fp64 side).
constexpr double kZeroByConstruction = 1e-7;

double norm_of(const std::vector<float>& values) {
  double sum = 0;
  for (const float value : values) {
    sum += static_cast<double>(value) * value;
  }
  return std::sqrt(sum);
}

// The global L2 norm of the arrays whose names contain `part` (all of them for "").
double global_norm(const testing::GlobalArrays& arrays, const std::string& part) {
  double sum = 0;
  for (const auto& [name, values] : arrays) {
    if (name.find(part) != std::string::npos) {
      sum += std::pow(norm_of(values), 2);
    }
  }
  return std::sqrt(sum);
}

// "region/tensor#layer" -> "region/tensor/<moment>#layer".
std::string moment_name(const std::string& name, const std::string& moment) {
  const size_t hash = name.rfind('#');
  return name.substr(0, hash) + "/" + moment + name.substr(hash);
}

struct Worst {
  double error = 0;
  std::string name;
  void take(double candidate, const std::string& where) {
    if (candidate >= error) {
      error = candidate;
      name = where;
    }
  }
};

// The worst per-tensor relative L2 differences of the gradients and the state of `split` from
// `whole`. A tensor zero by construction (kZeroByConstruction) has its gradient and moments
// measured against the global norm of their kind instead of their own, and its updated value not
// at all: AdamW's g / (|g| + eps) turns rounding noise into a step of up to the learning rate.
std::pair<Worst, Worst> compare_steps(const testing::OneStep& split,
                                      const testing::OneStep& whole) {
  const double gradient_norm = global_norm(whole.gradients, "");
  std::map<std::string, double> zero_scale;  // state name -> the norm it is measured against
  for (const auto& [name, values] : whole.gradients) {
    if (norm_of(values) < kZeroByConstruction * gradient_norm) {
      zero_scale[name] = -1;  // skipped
      zero_scale[moment_name(name, "mu")] = global_norm(whole.state, "/mu#");
      zero_scale[moment_name(name, "nu")] = global_norm(whole.state, "/nu#");
    }
  }
  auto difference = [](const std::vector<float>& a, const std::vector<float>& b, double scale) {
    std::vector<float> delta(a.size());
    for (size_t at = 0; at < a.size(); ++at) {
      delta[at] = a[at] - b[at];
    }
    return norm_of(delta) / scale;
  };
  Worst gradients;
  Worst state;
  for (const auto& [name, values] : whole.gradients) {
    const std::vector<float>& other = split.gradients.at(name);
    gradients.take(zero_scale.contains(name) ? difference(other, values, gradient_norm)
                                             : relative_l2(other, values),
                   name);
  }
  for (const auto& [name, values] : whole.state) {
    const auto zero = zero_scale.find(name);
    if (zero != zero_scale.end() && zero->second < 0) {
      continue;
    }
    const std::vector<float>& other = split.state.at(name);
    state.take(zero != zero_scale.end() ? difference(other, values, zero->second)
                                        : relative_l2(other, values),
               name);
  }
  return {gradients, state};
}

// deepseek4-tiny with every layer's compress_ratios entry 0 (sliding-window attention, a window of
// 8 in 32 tokens, with sinks, the unweighted q_up_norm and the output's rotation undone), mHC off
// (on in Deepseek4HyperConnections* below),
// no hash layers, no activation clip, the router on raw logits with its top-k weights
// renormalized as MaxText's deepseek4 router does (its sqrtsoftplus scores, selection bias with
// its update and load-balance loss are tested below); 3 of its 43
// layers and a 256-token vocabulary instead of its 129280 (the head is not what is tested).
std::vector<std::string> deepseek4_tiny() {
  return {"model_name=deepseek4-tiny", "override_model_config=true",
          "base_num_decoder_layers=3", "compress_ratios=[0,0,0]",
          "mhc_expansion_rate=1",      "first_num_hash_layers=0",
          "routed_score_func=''",      "norm_topk_prob=true",
          "routed_bias=false",         "load_balance_loss_weight=0",
          "routed_bias_update_rate=0", "mlp_activations_limit=-1",
          "sliding_window_size=8",     "vocab_size=256"};
}

// `model` with each of `overrides` ("key=value") in place of the item that sets the same key, e.g.
// with_overrides(deepseek4_tiny(), {"routed_bias=true"}) turns the preset's bias back on.
std::vector<std::string> with_overrides(std::vector<std::string> model,
                                        const std::vector<std::string>& overrides) {
  for (const std::string& setting : overrides) {
    const std::string key = setting.substr(0, setting.find('=') + 1);
    const auto item = std::find_if(model.begin(), model.end(), [&](const std::string& entry) {
      return entry.rfind(key, 0) == 0;
    });
    EXPECT_NE(item, model.end()) << key << " is not in the model";
    if (item != model.end()) {
      *item = setting;
    }
  }
  return model;
}

// qwen3-custom-30b-a3b's layer at tiny size: 4 heads of 16 (2 kv heads) out to an
// attention_output_dim of 32, 4 experts (top 2) at that width, up to emb_dim 64.
std::vector<std::string> qwen3_custom_tiny() {
  return {"model_name=qwen3-custom-30b-a3b",
          "override_model_config=true",
          "base_emb_dim=64",
          "base_num_query_heads=4",
          "base_num_kv_heads=2",
          "head_dim=16",
          "base_num_decoder_layers=2",
          "attention_output_dim=32",
          "moe_expert_input_dim=32",
          "num_experts=4",
          "num_experts_per_tok=2",
          "base_moe_mlp_dim=32",
          "base_mlp_dim=32",
          "vocab_size=256"};
}

// One step of `model` on 4 devices with `mesh` against the same global batch (4 sequences of 32)
// on one device, both from `initial_checkpoint` when given.
void expect_sharded_matches_one_device(std::vector<std::string> model,
                                       const std::vector<std::string>& mesh,
                                       const std::string& initial_checkpoint = "") {
  std::string described;
  for (const std::string& item : mesh) {
    described += " " + item;
  }
  SCOPED_TRACE(model.front() + described);
  for (const char* common :
       {"max_target_length=32", "dataset_type=synthetic", "functional_precision=reference"}) {
    model.emplace_back(common);
  }
  std::vector<std::string> sharded = model;
  sharded.insert(sharded.end(), {"compile_topology=v5e-4", "per_device_batch_size=1"});
  sharded.insert(sharded.end(), mesh.begin(), mesh.end());
  std::vector<std::string> single = model;
  single.insert(single.end(), {"compile_topology=v5e-1", "per_device_batch_size=4"});
  const testing::OneStep split =
      testing::run_one_step(Config::load("", sharded), initial_checkpoint);
  const testing::OneStep whole =
      testing::run_one_step(Config::load("", single), initial_checkpoint);
  const double loss = std::abs(split.loss - whole.loss) / std::abs(whole.loss);
  ASSERT_EQ(split.gradients.size(), whole.gradients.size());
  ASSERT_EQ(split.state.size(), whole.state.size());
  const auto [gradients, state] = compare_steps(split, whole);
  std::cout << "  rel-L2 loss " << loss << " gradients " << gradients.error << " ("
            << gradients.name << ") state " << state.error << " (" << state.name << ")  "
            << model.front() << described << "\n";
  EXPECT_LE(loss, kTolerance);
  EXPECT_LE(gradients.error, kTolerance);
  EXPECT_LE(state.error, kTolerance);
}

TEST(DecoderBlocksTraining, Deepseek4ShardedMatchesOneDevice) {
  expect_sharded_matches_one_device(deepseek4_tiny(),
                                    {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
  expect_sharded_matches_one_device(deepseek4_tiny(),
                                    {"ici_fsdp_parallelism=2", "ici_context_parallelism=2"});
  // Its single kv head does not split over tensor parallelism (refused, as JAX would); with 2 kv
  // heads the query heads, the sinks and the out projection's groups split over tensor=2.
  std::vector<std::string> two_kv_heads = deepseek4_tiny();
  two_kv_heads.emplace_back("base_num_kv_heads=2");
  expect_sharded_matches_one_device(two_kv_heads,
                                    {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"});
}

// Heavily compressed attention (compress_ratios entries above 4; MaxText's
// DeepseekV4HCACompressor): layers 1 and 2 pool blocks of 8 tokens (4 blocks of 32) that join a
// window of 4 keys and the sinks in one softmax. Under context=2 each device pools its own 2
// blocks and the attention gathers all 4, as it gathers the keys. Tensor parallelism needs 2 kv
// heads here (above), which MaxText's concatenation of the one-head blocks to the keys does not
// allow: base_num_kv_heads 2 with a ratio above 4 is refused (exit 2). The window is 4, not the
// 8 of the other tests: at 8 one position-bias gradient element is 7.2e-9, terms of ~1e-3
// cancelling (a feature's bias gradients sum to 0 over the block), below AdamW's eps of 1e-8;
// the devices' fp32 partial sums (ulp ~1e-10 there) then move its update by 9e-9 and that
// tensor's updated state by 1.9e-5 (fsdp+context) and 2.2e-5 (fsdp+expert) relative L2, with
// every gradient within 1e-7. At 4 its smallest gradient element is 4.3e-6.
TEST(DecoderBlocksTraining, Deepseek4HeavilyCompressedShardedMatchesOneDevice) {
  const std::vector<std::string> model =
      with_overrides(deepseek4_tiny(), {"compress_ratios=[0,8,8]", "sliding_window_size=4"});
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_context_parallelism=2"});
}

// Compressed sparse attention (compress_ratios entry 4; MaxText's DeepseekV4CSACompressor and
// DeepseekV4Indexer) in layer 1 beside an HCA layer of 8: overlapping windows pool 8 blocks of 4
// tokens, and each query keeps the indexer's top 3 of its complete blocks (indexer_topk 3, so
// from query 15 on the indexer's choice matters), with a window of 4 and the sinks. The sequence
// is whole on every device under fsdp+expert; context parallelism is refused for CSA by key
// (train's check, tests/sim/train/train_keys_test.cpp), and tensor parallelism needs 2 kv heads,
// which a layer with blocks refuses (above).
TEST(DecoderBlocksTraining, Deepseek4CompressedSparseShardedMatchesOneDevice) {
  std::vector<std::string> model =
      with_overrides(deepseek4_tiny(), {"compress_ratios=[0,4,8]", "sliding_window_size=4"});
  model.emplace_back("indexer_topk=3");
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=4"});
}

// The preset's alternation of kinds (after the window layer CSA, HCA, CSA, HCA, as its
// compress_ratios [0, 0, 4, 128, 4, 128, ...]) in MaxText's order: train runs each run of layers
// as a region of its own (model/builder/layer_plan.h, LayerOrder::kMaxText), csa_moe_layer_0,
// hca16_moe_layer_0, csa_moe_layer_1, hca16_moe_layer_1, each with its own parameters; HCA pools
// 2 blocks of 16, CSA 8 overlapping blocks of 4 (top 3 kept).
TEST(DecoderBlocksTraining, Deepseek4AlternatingKindsShardedMatchesOneDevice) {
  std::vector<std::string> model = with_overrides(
      deepseek4_tiny(),
      {"base_num_decoder_layers=5", "compress_ratios=[0,4,16,4,16]", "sliding_window_size=4"});
  model.emplace_back("indexer_topk=3");
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=4"});
}

// With the preset's SwiGLU clip (mlp_activations_limit at 0.3, which cuts about 12% of the routed
// experts' gate entries and 23% of their up entries, as tests/reference/run_torch_reference.sh
// prints) and its first layer hash-routed (MaxText's tid2eid, zeros from initialization: every
// choice to expert 0, so under expert=2 one shard's experts get every token).
TEST(DecoderBlocksTraining, Deepseek4ClipAndHashRoutingShardedMatchesOneDevice) {
  std::vector<std::string> model =
      with_overrides(deepseek4_tiny(), {"first_num_hash_layers=1", "mlp_activations_limit=0.3"});
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
  model.emplace_back("base_num_kv_heads=2");
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"});
}

// With the preset's router score (routed_score_func sqrtsoftplus: the top-k of
// sqrt(softplus(logit)) weighted by a softmax over the chosen scores), the clip and a hash-routed
// first layer as above.
TEST(DecoderBlocksTraining, Deepseek4SqrtSoftplusRouterShardedMatchesOneDevice) {
  std::vector<std::string> model = with_overrides(
      deepseek4_tiny(),
      {"first_num_hash_layers=1", "mlp_activations_limit=0.3", "routed_score_func=sqrtsoftplus"});
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
  model.emplace_back("base_num_kv_heads=2");
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"});
}

// `model`'s initial parameters with every router bias (moe/gate_bias, zeros at initialization) set
// to 0.05 x (e mod 5 - 2) for expert e, as tests/reference/bias_router.py sets them (there it
// changes the experts of about half the tokens), written to `directory`.
std::string write_biased_router_checkpoint(std::vector<std::string> model,
                                           const std::string& directory) {
  model.insert(model.end(),
               {"max_target_length=32", "compile_topology=v5e-1", "per_device_batch_size=1"});
  ShardedModel sharded_model(Config::load("", model));
  Checkpoint checkpoint = sharded_model.to_checkpoint(0);
  int biases = 0;
  for (auto& [name, tensor] : checkpoint.weights) {
    if (name.find("/moe/gate_bias#") == std::string::npos) {
      continue;
    }
    ++biases;
    for (size_t expert = 0; expert < tensor.values.size(); ++expert) {
      tensor.values[expert] = 0.05f * (static_cast<float>(expert % 5) - 2.0f);
    }
  }
  EXPECT_GT(biases, 0) << "no moe/gate_bias in the model";
  save_checkpoint(directory, checkpoint);
  return directory;
}

// A deepseek4 `model` from the checkpoint `write_checkpoint` makes of its initial parameters
// (into TempDir()/`name`): fsdp+expert and fsdp+context, then fsdp+tensor with two kv heads (its
// one kv head cannot split over tensor), each against one device.
void expect_deepseek4_meshes_match(
    std::vector<std::string> model, const std::string& name,
    const std::function<std::string(std::vector<std::string>, const std::string&)>&
        write_checkpoint) {
  const std::string checkpoint = write_checkpoint(model, ::testing::TempDir() + name);
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"},
                                    checkpoint);
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_context_parallelism=2"},
                                    checkpoint);
  model.emplace_back("base_num_kv_heads=2");
  const std::string two_kv_heads = write_checkpoint(model, ::testing::TempDir() + name + "_kv2");
  expect_sharded_matches_one_device(model, {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"},
                                    two_kv_heads);
}

// With the preset's routed_bias (the top-k of score + bias, weighted by the scores alone; the
// bias's gradient, 0, summed over the tokens' shards), from a non-zero bias, with the scores,
// clip and hash-routed first layer (no bias there) of the preset as above.
TEST(DecoderBlocksTraining, Deepseek4RoutedBiasShardedMatchesOneDevice) {
  const std::vector<std::string> model =
      with_overrides(deepseek4_tiny(), {"first_num_hash_layers=1", "mlp_activations_limit=0.3",
                                        "routed_score_func=sqrtsoftplus", "routed_bias=true"});
  expect_deepseek4_meshes_match(model, "deepseek4_biased_router", write_biased_router_checkpoint);
}

// `model`'s initial parameters with every mHC alpha scale set to 1 (0.01 at initialization), each
// res_beta[i, j] to 2 where j = (i + 1) mod k (else 0) and each pre_beta[i], post_beta[i] to
// 0.5 x (i mod 3 - 1), as tests/reference/mhc_checkpoint.py sets them: residual matrices far from
// uniform, so that the Sinkhorn iterations matter, written to `directory`.
std::string write_mhc_checkpoint(std::vector<std::string> model, const std::string& directory) {
  model.insert(model.end(),
               {"max_target_length=32", "compile_topology=v5e-1", "per_device_batch_size=1"});
  ShardedModel sharded_model(Config::load("", model));
  Checkpoint checkpoint = sharded_model.to_checkpoint(0);
  auto has = [](const std::string& name, const std::string& part) {
    return name.find(part + "#") != std::string::npos;
  };
  int edited = 0;
  for (auto& [name, tensor] : checkpoint.weights) {
    std::vector<float>& values = tensor.values;
    if (has(name, "_alpha_scale")) {
      std::fill(values.begin(), values.end(), 1.0f);
    } else if (has(name, "/res_beta")) {
      const auto k = static_cast<size_t>(std::lround(std::sqrt(values.size())));
      for (size_t at = 0; at < values.size(); ++at) {
        values[at] = (at % k) == (at / k + 1) % k ? 2.0f : 0.0f;
      }
    } else if (has(name, "/pre_beta") || has(name, "/post_beta")) {
      for (size_t at = 0; at < values.size(); ++at) {
        values[at] = 0.5f * (static_cast<float>(at % 3) - 1.0f);
      }
    } else {
      continue;
    }
    ++edited;
  }
  EXPECT_GT(edited, 0) << "no mHC scalars or biases in the model";
  save_checkpoint(directory, checkpoint);
  return directory;
}

// With mHC (the preset's 4 residual streams, 20 Sinkhorn iterations) from the moved scalars and
// biases above, with the preset's clip, hash-routed first layer and sqrtsoftplus scores.
TEST(DecoderBlocksTraining, Deepseek4HyperConnectionsShardedMatchesOneDevice) {
  const std::vector<std::string> model = with_overrides(
      deepseek4_tiny(), {"mhc_expansion_rate=4", "first_num_hash_layers=1",
                         "mlp_activations_limit=0.3", "routed_score_func=sqrtsoftplus"});
  expect_deepseek4_meshes_match(model, "deepseek4_mhc", write_mhc_checkpoint);
}

// With MaxText's load-balance loss on the biased router above (weight 0.01, 100 x the preset's,
// so that its share of the gradients is well above the tolerance): the per-sequence counts and
// softmax sums end in all-reduces over the axes that split the sequences (context) and the
// loss's sum over the batch in one over the batch's axes, so every mesh computes the unsharded
// step's loss, the bias's gradient (now non-zero) and every other.
TEST(DecoderBlocksTraining, Deepseek4LoadBalanceLossShardedMatchesOneDevice) {
  const std::vector<std::string> model =
      with_overrides(deepseek4_tiny(), {"first_num_hash_layers=1", "mlp_activations_limit=0.3",
                                        "routed_score_func=sqrtsoftplus", "routed_bias=true",
                                        "load_balance_loss_weight=0.01"});
  expect_deepseek4_meshes_match(model, "deepseek4_balance_loss", write_biased_router_checkpoint);
}

// The biased router with the load-balance loss above and the preset's routed_bias_update_rate
// (0.001: after AdamW each bias moves by 0.001 x sign(T k / E - the expert's choices over the
// step), a step of 1-2% of the biases here): the router's VJP counts each device's choices, which
// end in an all-reduce over the axes that split the tokens, so every mesh moves the biases as one
// device does.
TEST(DecoderBlocksTraining, Deepseek4BiasUpdateShardedMatchesOneDevice) {
  const std::vector<std::string> model = with_overrides(
      deepseek4_tiny(),
      {"first_num_hash_layers=1", "mlp_activations_limit=0.3", "routed_score_func=sqrtsoftplus",
       "routed_bias=true", "load_balance_loss_weight=0.01", "routed_bias_update_rate=0.001"});
  expect_deepseek4_meshes_match(model, "deepseek4_bias_update", write_biased_router_checkpoint);
}

// The biased router with its update (one device): `rate`'s step from the biased checkpoint, on
// 4 sequences in `accumulation` microbatches (MaxText: a microbatch is per_device_batch_size x
// devices sequences).
testing::OneStep biased_router_step(const std::string& rate, int accumulation) {
  std::vector<std::string> model =
      with_overrides(deepseek4_tiny(), {"first_num_hash_layers=1", "routed_score_func=sqrtsoftplus",
                                        "routed_bias=true", "load_balance_loss_weight=0.01",
                                        "routed_bias_update_rate=" + rate});
  const std::string checkpoint =
      write_biased_router_checkpoint(model, ::testing::TempDir() + "deepseek4_bias_steps");
  model.insert(model.end(), {"max_target_length=32", "dataset_type=synthetic",
                             "functional_precision=reference", "compile_topology=v5e-1",
                             "per_device_batch_size=" + std::to_string(4 / accumulation),
                             "gradient_accumulation_steps=" + std::to_string(accumulation)});
  return testing::run_one_step(Config::load("", model), checkpoint);
}

// MaxText's update adds exactly rate x sign(...) to each bias after AdamW and changes nothing
// else: against the same step with rate 0 every gradient and every other state tensor is the same
// bit for bit, and each bias entry differs by -0.001, 0 or +0.001 (to the fp32 rounding of a
// bias near 0.1, 2e-8), some up and some down.
TEST(DecoderBlocksTraining, Deepseek4BiasUpdateIsOneRateStepPerExpert) {
  const testing::OneStep with = biased_router_step("0.001", 1);
  const testing::OneStep without = biased_router_step("0", 1);
  EXPECT_EQ(with.loss, without.loss);
  EXPECT_EQ(with.gradients, without.gradients);
  ASSERT_EQ(with.state.size(), without.state.size());
  int up = 0;
  int down = 0;
  int biases = 0;
  for (const auto& [name, values] : with.state) {
    const std::vector<float>& other = without.state.at(name);
    if (name.find("/moe/gate_bias#") == std::string::npos) {
      EXPECT_EQ(values, other) << name;
      continue;
    }
    ++biases;
    for (size_t e = 0; e < values.size(); ++e) {
      const double step = static_cast<double>(values[e]) - other[e];
      const double nearest = 0.001 * std::round(step / 0.001);
      EXPECT_NEAR(step, nearest, 2e-8) << name << " expert " << e;
      EXPECT_LE(std::abs(nearest), 0.001 + 1e-12) << name << " expert " << e;
      up += nearest > 0 ? 1 : 0;
      down += nearest < 0 ? 1 : 0;
    }
  }
  EXPECT_EQ(biases, 2);  // the two routed layers (the first is hash-routed: no bias)
  EXPECT_GT(up, 0);
  EXPECT_GT(down, 0);
}

// Gradient accumulation counts the choices of every microbatch before the one update (tpusim's
// global reading: the sign of the step's summed loads, not a sum of per-microbatch signs): two
// microbatches of 2 sequences give the step of one of 4 (gradients and state within 1e-5, the
// microbatches' gradients averaged in another order; the biases' update steps identical).
TEST(DecoderBlocksTraining, Deepseek4BiasUpdateWithGradientAccumulationMatchesOneMicrobatch) {
  const testing::OneStep accumulated = biased_router_step("0.001", 2);
  const testing::OneStep whole = biased_router_step("0.001", 1);
  const auto [gradients, state] = compare_steps(accumulated, whole);
  std::cout << "  rel-L2 gradients " << gradients.error << " (" << gradients.name << ") state "
            << state.error << " (" << state.name << ")\n";
  EXPECT_LE(std::abs(accumulated.loss - whole.loss) / std::abs(whole.loss), kTolerance);
  EXPECT_LE(gradients.error, kTolerance);
  EXPECT_LE(state.error, kTolerance);
  // Each bias's update step, apart from AdamW's (equal within rounding in both runs): the same.
  const testing::OneStep plain = biased_router_step("0", 1);
  for (const auto& [name, values] : whole.state) {
    if (name.find("/moe/gate_bias#") == std::string::npos) {
      continue;
    }
    for (size_t e = 0; e < values.size(); ++e) {
      const double base = plain.state.at(name)[e];
      EXPECT_NEAR(accumulated.state.at(name)[e] - base, values[e] - base, 1e-7)
          << name << " expert " << e;
    }
  }
}

TEST(DecoderBlocksTraining, Qwen3CustomShardedMatchesOneDevice) {
  expect_sharded_matches_one_device(qwen3_custom_tiny(),
                                    {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"});
  expect_sharded_matches_one_device(qwen3_custom_tiny(),
                                    {"ici_fsdp_parallelism=2", "ici_expert_parallelism=2"});
}

}  // namespace
}  // namespace tpusim
