#include "model/autodiff/training_step.h"

#include <gtest/gtest.h>

#include <pthread.h>

#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/config.h"
#include "model/decoder_family.h"
#include "model/flops_maxtext.h"
#include "model/ir/op_flops.h"

namespace tpusim {
namespace {

struct PhaseFlops {
  double forward = 0;
  double backward = 0;
  double recompute = 0;
  double optimizer_vector = 0;
};

PhaseFlops matmul_flops_by_phase(const TrainingStep& step) {
  PhaseFlops flops;
  for (const Op& op : step.graph.ops()) {
    const double repeat = static_cast<double>(step.graph.region(op.region).repeat);
    if (!counted_by_maxtext(op)) {
      continue;  // use_iota_embed's one-hot lookup and its gradient (the gpt3 presets set it)
    }
    const OpFlops op_cost = op_flops(step.graph, op);
    switch (op.phase) {
      case Phase::kForward:
        flops.forward += repeat * op_cost.matmul;
        break;
      case Phase::kBackward:
        flops.backward += repeat * op_cost.matmul;
        break;
      case Phase::kRecompute:
        flops.recompute += repeat * op_cost.matmul;
        break;
      case Phase::kOptimizer:
        flops.optimizer_vector += repeat * op_cost.vector;
        break;
    }
  }
  return flops;
}

Config config_for(const std::string& model, const std::string& remat, int batch = 2) {
  return Config::load("", {"model_name=" + model, "remat_policy=" + remat,
                           "per_device_batch_size=" + std::to_string(batch) + ".0",
                           "max_target_length=512", "override_model_config=true"});
}

// Autodiff is independent of the FLOP formula: forward + backward matmuls of the built step
// (without remat recompute) must equal MaxText's count for every preset.
TEST(TrainingStep, ModelFlopsWithoutRecomputeEqualMaxTextForEveryPreset) {
  for (const std::string& name : available_model_presets("")) {
    SCOPED_TRACE(name);
    const Config config = config_for(name, "full");
    if (decoder_family(parse_decoder_block(config.get_string("decoder_block")))
            .has_compressed_attention()) {
      continue;  // deepseek4: MaxText counts its generic path (Deepseek4IndexerHasNoBackward)
    }
    const TrainingStep step = build_training_step(config, 2);
    const PhaseFlops flops = matmul_flops_by_phase(step);
    // gemma4_small's kv-shared layers project keys and values that MaxText reuses.
    const MaxTextFlops maxtext = maxtext_training_flops_per_device(config);
    const double expected = (maxtext.total_tflops() + maxtext.kv_shared_projection_tflops()) * 1e12;
    EXPECT_NEAR((flops.forward + flops.backward) / expected, 1.0, 1e-9);
    EXPECT_NEAR(flops.backward / flops.forward, 2.0, 1e-9);
  }
}

// deepseek4: the indexer's scores only pick blocks (top-k indices), so no gradient flows through
// its ops: the backward is twice the forward without them. Its ops are the forward matmuls named
// indexer/ (MaxText keeps no gradient path through them either). Nor has the load-balance loss's
// product of per-sequence sums (moe/load_balance_loss, 2 B E FLOPs per routed layer) a backward:
// its gradient is added inside the router's VJP.
TEST(TrainingStep, Deepseek4IndexerHasNoBackward) {
  const TrainingStep step = build_training_step(config_for("deepseek4-tiny", "full"), 2);
  const PhaseFlops flops = matmul_flops_by_phase(step);
  double indexer = 0;
  double balance = 0;
  for (const Op& op : step.graph.ops()) {
    const double op_matmul =
        static_cast<double>(step.graph.region(op.region).repeat) * op_flops(step.graph, op).matmul;
    if (op.phase == Phase::kForward && op.name.starts_with("indexer/")) {
      indexer += op_matmul;
    }
    if (op.phase == Phase::kForward && op.name == "moe/load_balance_loss") {
      balance += op_matmul;
    }
    EXPECT_FALSE(op.phase == Phase::kBackward && op.name.starts_with("indexer/")) << op.name;
  }
  EXPECT_GT(indexer, 0.0);
  EXPECT_GT(balance, 0.0);  // the preset's load_balance_loss_weight 1e-4
  EXPECT_NEAR(flops.backward / (flops.forward - indexer - balance), 2.0, 1e-9);
}

TEST(TrainingStep, RematPolicyChangesRecompute) {
  const auto recompute = [](const std::string& remat) {
    return matmul_flops_by_phase(build_training_step(config_for("llama2-7b", remat), 2)).recompute;
  };
  const Config config = config_for("llama2-7b", "full");
  const PhaseFlops full = matmul_flops_by_phase(build_training_step(config, 2));
  // Full remat re-runs each decoder layer's forward matmuls that backward needs: everything but the
  // MLP output matmul, whose result only feeds the layer's final residual add (its VJP needs no
  // values; XLA drops it too). The out projection is needed: the pre-MLP norm's VJP reads the
  // attention residual it produces.
  const MaxTextForwardFlops layer = maxtext_training_flops_per_device(config).forward;
  const double mlp_out = 2.0 * 2 * 512 * 4096 * 11008;
  const double expected =
      static_cast<double>(layer.num_layers) *
      (layer.qkv + layer.global_attention + layer.out_proj + layer.dense_ffn - mlp_out);
  EXPECT_NEAR(full.recompute / expected, 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(recompute("none"), 0.0);
  EXPECT_DOUBLE_EQ(recompute("minimal_with_context"), 0.0);
  // minimal saves every projection but not the attention context: attention is recomputed.
  EXPECT_GT(recompute("minimal"), 0.0);
  EXPECT_LT(recompute("minimal"), recompute("save_qkv_proj"));
  EXPECT_LT(recompute("save_qkv_proj"), recompute("full"));
  EXPECT_LT(recompute("save_dot_except_mlp"), recompute("save_qkv_proj"));
}

TEST(TrainingStep, RematPolicySavesWhatItNames) {
  const auto saved_names = [](const std::string& remat, RematDecision decision) {
    const TrainingStep step = build_training_step(config_for("tiny-llama", remat), 2);
    std::set<std::string> names;
    for (const auto& [tensor, kept] : step.saved) {
      const Tensor& info = step.graph.tensor(tensor);
      if (kept == decision && !info.remat_name.empty()) {
        names.insert(info.remat_name);
      }
    }
    return names;
  };
  EXPECT_EQ(saved_names("full", RematDecision::kDevice),
            std::set<std::string>{"decoder_layer_input"});
  EXPECT_EQ(saved_names("save_qkv_proj", RematDecision::kDevice),
            (std::set<std::string>{"decoder_layer_input", "query_proj", "key_proj", "value_proj"}));
  EXPECT_EQ(saved_names("qkv_proj_offloaded", RematDecision::kOffload),
            (std::set<std::string>{"query_proj", "key_proj", "value_proj"}));
  const TrainingStep custom = build_training_step(
      Config::load(
          "", {"model_name=tiny-llama", "remat_policy=custom", "mlpwi_0=offload", "context=device",
               "decoder_layer_input=offload", "per_device_batch_size=2.0", "max_target_length=64"}),
      2);
  int host_loads = 0;
  for (const Op& op : custom.graph.ops()) {
    host_loads += op.kind == OpKind::kHostLoad ? 1 : 0;
  }
  EXPECT_EQ(host_loads, 2);  // mlpwi_0 and the layer input
}

TEST(TrainingStep, CustomRematValuesAreCheckedAndTheLayerInputIsAlwaysKept) {
  const auto step_text = [](const std::string& value) {
    return build_training_step(Config::load("", {"model_name=tiny-llama", "remat_policy=custom",
                                                 "decoder_layer_input=" + value}),
                               2)
        .graph.to_text();
  };
  // The layer input is the checkpointed layer's argument: "remat" of it keeps it, as "device".
  EXPECT_EQ(step_text("remat"), step_text("device"));
  EXPECT_NE(step_text("offload"), step_text("device"));
  EXPECT_THROW(
      build_training_step(
          Config::load("", {"model_name=tiny-llama", "remat_policy=custom", "mlpwo=devcie"}), 2),
      UserError);
}

TEST(TrainingStep, EveryParameterHasGradientAndAdamUpdate) {
  for (const char* name : {"tiny-llama", "tiny-gpt3", "tiny-moe", "tiny-mla", "gemma-2b"}) {
    SCOPED_TRACE(name);
    const TrainingStep step = build_training_step(config_for(name, "full"), 2);
    int parameters = 0;
    int updates = 0;
    for (const Tensor& tensor : step.graph.tensors()) {
      if (tensor.kind == TensorKind::kParameter && step.graph.producer(tensor.id) < 0) {
        ++parameters;
        EXPECT_TRUE(step.parameter_grads.contains(tensor.id)) << tensor.name;
      }
    }
    for (const Op& op : step.graph.ops()) {
      updates += op.kind == OpKind::kAdamUpdate ? 1 : 0;
    }
    EXPECT_EQ(parameters, updates);
  }
}

// routed_bias_update_rate (the deepseek4 presets' 0.001): each biased router's VJP has a third
// output, its choices per expert (moe/gate_bias/load, [experts]), which the bias's AdamW update
// reads as a fifth input; no other update reads one. With the rate 0, or for another family with
// a router bias (deepseek3), the program has neither.
TEST(TrainingStep, RouterBiasUpdateReadsTheRoutersLoads) {
  const auto loads_read = [](const std::vector<std::string>& overrides) {
    std::vector<std::string> keys = {"per_device_batch_size=2.0", "max_target_length=512",
                                     "override_model_config=true"};
    keys.insert(keys.end(), overrides.begin(), overrides.end());
    const TrainingStep step = build_training_step(Config::load("", keys), 2);
    std::vector<std::string> read;
    for (const Op& op : step.graph.ops()) {
      if (op.kind == OpKind::kRouterGrad && op.outputs.size() == 3) {
        const Tensor& load = step.graph.tensor(op.outputs[2]);
        EXPECT_EQ(load.name, "moe/gate_bias/load");
        EXPECT_EQ(step.graph.tensor(op.inputs[2]).name, "moe/gate_bias");
      }
      if (op.kind == OpKind::kAdamUpdate && op.inputs.size() == 5) {
        EXPECT_EQ(step.graph.tensor(op.inputs[0]).name, "moe/gate_bias");
        const int producer = step.graph.producer(op.inputs[4]);
        EXPECT_GE(producer, 0);
        EXPECT_EQ(step.graph.ops()[static_cast<size_t>(producer)].kind, OpKind::kRouterGrad);
        read.push_back(step.graph.region(op.region).name);
      }
    }
    return read;
  };
  // deepseek4-tiny: its MoE layers that are not hash-routed, in the regions of their kinds.
  EXPECT_FALSE(loads_read({"model_name=deepseek4-tiny"}).empty());
  EXPECT_TRUE(loads_read({"model_name=deepseek4-tiny", "routed_bias_update_rate=0"}).empty());
  EXPECT_TRUE(loads_read({"model_name=deepseek4-tiny", "routed_bias=false"}).empty());
  EXPECT_TRUE(
      loads_read({"model_name=deepseek3-tiny", "routed_bias=true", "routed_bias_update_rate=0.001"})
          .empty());
}

// Red-team item 13: the backward pass found a rematerialized tensor by recursion, one call deep per
// recomputed op: 20,000 mlp_activations (a chain of 20,000 gated products) overflowed the stack.
// Config loading now refuses such a list (model/config_test.cpp), so the long chain is set after
// loading and built on a thread with a 256 KiB stack, which 2,000 branches overflowed as recursion.
TEST(RedTeam, Item13_RematWalkIsIterative) {
  Config config = Config::load("", {"model_name=tiny-llama", "remat_policy=full"});
  constexpr int kBranches = 2000;
  std::string list = "[silu";
  for (int branch = 1; branch < kBranches; ++branch) {
    list += ", linear";
  }
  config.set("mlp_activations", list + "]", "test");
  struct Job {
    const Config* config;
    size_t recomputed = 0;
    std::string error;
  } job{&config, 0, ""};
  auto run = [](void* argument) -> void* {
    Job& work = *static_cast<Job*>(argument);
    try {
      const TrainingStep step = build_training_step(*work.config, 1);
      for (const Op& op : step.graph.ops()) {
        work.recomputed += op.phase == Phase::kRecompute ? 1 : 0;
      }
    } catch (const std::exception& error) {
      work.error = error.what();
    }
    return nullptr;
  };
  pthread_attr_t attributes;
  ASSERT_EQ(pthread_attr_init(&attributes), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attributes, size_t{256} << 10), 0);
  pthread_t thread;
  ASSERT_EQ(pthread_create(&thread, &attributes, run, &job), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attributes);
  EXPECT_EQ(job.error, "");
  // Every branch's matmul and activation is recomputed for the backward pass of every product.
  EXPECT_GE(job.recomputed, static_cast<size_t>(kBranches));
}

}  // namespace
}  // namespace tpusim
