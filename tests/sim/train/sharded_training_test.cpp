// Sharded training equals the unsharded reference over a matrix of meshes and tiny presets: the
// loss, every gradient and every weight and Adam moment after the update within relative 1e-5
// (fp32; only the summation order differs). "Relative" is the per-tensor relative L2 error of
// docs/reference/numerics.md; with a max-element measure instead, AdamW's
// per-element normalization g / (sqrt(v) + eps) turns summation-order noise on the tiniest
// gradients into visible update differences (measured 5.8e-5 on tiny-llama fsdp=4 x tensor=2).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "model/config.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

// Per-tensor relative L2 of sharded vs unsharded, for each of loss, gradients and weights.
constexpr double kTolerance = 1e-5;

struct Case {
  std::string model;
  std::vector<std::string> mesh;
};

std::string describe(const Case& test_case) {
  std::string text = test_case.model;
  for (const std::string& item : test_case.mesh) {
    text += " " + item;
  }
  return text;
}

struct Differences {
  double loss = 0;
  double gradients = 0;
  double weights = 0;
};

Differences worst_difference(const Case& test_case, int steps = 2) {
  // The reference numerics on both sides (verify keeps the run's own, which would add fast
  // fp32's rounding to the comparison): only the sharding differs.
  std::vector<std::string> overrides = {
      "model_name=" + test_case.model,  "max_target_length=32",
      "steps=" + std::to_string(steps), "learning_rate=1e-3",
      "dataset_type=synthetic",         "functional_precision=reference"};
  overrides.insert(overrides.end(), test_case.mesh.begin(), test_case.mesh.end());
  const Config config = Config::load("", overrides);
  Trainer trainer(config);
  std::ostringstream quiet;
  const std::vector<StepMetrics> curve =
      trainer.run({.verify = true, .progress = false, .dump_directory = ""}, quiet);
  Differences worst;
  for (const StepMetrics& metrics : curve) {
    worst.loss = std::max(worst.loss, metrics.verify_loss_rel_diff.value());
    worst.gradients = std::max(worst.gradients, metrics.verify_gradient_rel_diff.value());
    worst.weights = std::max(worst.weights, metrics.verify_weight_rel_diff.value());
  }
  return worst;
}

// Each case's loss, gradients and updated weights within kTolerance of the unsharded step.
void expect_each_matches_unsharded(const std::vector<Case>& cases) {
  for (const Case& test_case : cases) {
    SCOPED_TRACE(describe(test_case));
    const Differences worst = worst_difference(test_case);
    std::cout << "  rel-L2 loss " << worst.loss << " gradients " << worst.gradients << " weights "
              << worst.weights << "  " << describe(test_case) << "\n";
    EXPECT_LE(worst.loss, kTolerance);
    EXPECT_LE(worst.gradients, kTolerance);
    EXPECT_LE(worst.weights, kTolerance);
  }
}

// tiny-llama and tiny-gpt3 over each ICI mesh axis alone and combined, and over two slices.
std::vector<Case> mesh_cases() {
  return {
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
        "ici_data_parallelism=4"}},
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=4"}},
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
        "ici_fsdp_transpose_parallelism=4"}},
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
      // (Tensor parallelism wider than the kv heads, tensor=4 over 2 kv heads, is refused as
      // explore prunes it: tests/sim/cli/divisibility_command_test.cpp.)
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_sequence_parallelism=2"}},
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_context_parallelism=2"}},
      {"tiny-llama",
       {"compile_topology=v5e-8", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2", "ici_data_parallelism=2"}},
      {"tiny-llama",
       {"compile_topology=v5e-4", "compile_topology_num_slices=2", "per_device_batch_size=1",
        "ici_fsdp_parallelism=4"}},
      {"tiny-gpt3",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
  };
}

// Model switches on the dense models (gemma2's soft-capped, tied logits; qwen3's qk-norm), then
// gradient accumulation.
std::vector<Case> model_switch_cases() {
  return {
      // gemma2's switches: attention logits soft-capped, tied logits (split over vocab by tensor
      // parallelism) divided by sqrt(emb_dim) and soft-capped.
      {"tiny-llama",
       {"override_model_config=true", "logits_via_embedding=true",
        "normalize_embedding_logits=true", "attn_logits_soft_cap=0.5", "final_logits_soft_cap=1.0",
        "compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
      {"tiny-llama",
       {"override_model_config=true", "logits_via_embedding=true",
        "normalize_embedding_logits=true", "attn_logits_soft_cap=0.5", "final_logits_soft_cap=1.0",
        "compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_context_parallelism=2"}},
      // qk-norm (qwen3): the query and key norms' [head_dim] scales get gradients summed over
      // every token and head, which fsdp, tensor (heads) and context parallelism split.
      {"tiny-qwen3",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
      {"tiny-qwen3",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
        "ici_tensor_parallelism=2", "ici_context_parallelism=2"}},
      {"tiny-qwen3",
       {"compile_topology=v5e-8", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_context_parallelism=2", "ici_tensor_sequence_parallelism=2"}},
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=2", "ici_fsdp_parallelism=4",
        "gradient_accumulation_steps=2"}},
  };
}

// MoE (dropless and with a capacity) and MLA over expert, tensor and context parallelism.
std::vector<Case> moe_and_mla_cases() {
  return {
      // Dropless MoE (the default, sparse_matmul): every token choice kept, however the routing
      // falls; expert parallelism exchanges worst-case buffers with all-to-all.
      {"tiny-moe",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
        "ici_expert_parallelism=4"}},
      {"tiny-moe",
       {"compile_topology=v5e-8", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_expert_parallelism=2", "ici_tensor_parallelism=2"}},
      {"tiny-mla",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_expert_parallelism=2"}},
      // MoE and MLA with a capacity that never drops (a drop depends on how tokens are grouped,
      // which differs between shardings): expert parallelism exchanges tokens with all-to-all.
      {"tiny-moe",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
        "ici_expert_parallelism=4", "sparse_matmul=false", "capacity_factor=4.0"}},
      {"tiny-moe",
       {"compile_topology=v5e-8", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_expert_parallelism=2", "ici_tensor_parallelism=2", "sparse_matmul=false",
        "capacity_factor=4.0"}},
      // Seed 1: under MaxText's initializers, seed 0 gives layer/attention/out#0 one gradient
      // element of 7e-9, at Adam's eps (1e-8); the sharded sum's 5e-9 difference there (fp32
      // order of summation, the gradient itself agrees to 4e-7) becomes 0.1 x lr in that
      // element's update through g / (|g| + eps), 1.3e-5 of the whole tensor: Adam's
      // conditioning, not the sharding.
      {"tiny-mla",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2", "sparse_matmul=false", "capacity_factor=4.0",
        "init_weights_seed=1"}},
      {"tiny-mla",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_context_parallelism=2", "sparse_matmul=false", "capacity_factor=4.0"}},
  };
}

// Whole decoder blocks at tiny size: gemma4, qwen2's attention biases, gemma4_small, llama4.
std::vector<Case> decoder_block_cases() {
  return {
      // gemma4's pieces at tiny size: 5 sliding-window layers then a global one with its own head
      // width and kv heads (2: tensor=2 must split them evenly) and a shared K/V projection (the
      // key projection feeds both), MoE with a shared expert as wide as the dense MLP.
      {"tiny-llama",
       {"override_model_config=true", "decoder_block=gemma4", "base_num_decoder_layers=6",
        "sliding_window_size=8", "global_head_dim=32", "global_num_kv_heads=2",
        "share_kv_projections=true", "num_experts=4", "num_experts_per_tok=2", "shared_experts=1",
        "base_moe_mlp_dim=32", "compile_topology=v5e-4", "per_device_batch_size=1",
        "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"}},
      // qwen2's attention biases (query, key, value, out): their gradients sum over the tokens,
      // which fsdp and context parallelism split. adam_eps 1e-3: the biases start at zero
      // (MaxText's bias_init), and the key bias's lowest-frequency RoPE dims then get gradients of
      // 2e-7, where Adam's g / (|g| + eps) with eps 1e-8 (or 1e-6) turns the fp32 summation
      // difference (3e-10, 2.5e-7 of the tensor's gradient) into 1.3e-5 (3e-5) of the updated
      // bias. With eps above every gradient the update is linear in g, so the weights compare the
      // gradients' sharding; the gradients themselves are compared as they are.
      {"tiny-llama",
       {"override_model_config=true", "decoder_block=qwen2", "attention_bias=true",
        "compile_topology=v5e-8", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2", "ici_context_parallelism=2", "adam_eps=1e-3"}},
      // gemma4_small's: 5 layers (every 5th global, with its own head width), per-layer inputs
      // of width 16 from a 256-row table, the last 2 layers kv-shared with a double-wide MLP.
      {"tiny-llama",
       {"override_model_config=true", "decoder_block=gemma4_small", "base_num_decoder_layers=5",
        "sliding_window_size=8", "global_head_dim=32", "hidden_size_per_layer_input=16",
        "vocab_size_per_layer_input=256", "num_kv_shared_layers=2", "use_double_wide_mlp=true",
        "compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2"}},
      // llama4's: chunked attention (chunks of 8 in 32 tokens), a global no-RoPE layer every
      // 2nd (dense: train refuses llama4's router, whose sigmoid scales the expert inputs).
      {"tiny-llama",
       {"override_model_config=true", "decoder_block=llama4", "base_num_decoder_layers=4",
        "chunk_attn_window_size=8", "nope_layer_interval=2", "compile_topology=v5e-4",
        "per_device_batch_size=1", "ici_fsdp_parallelism=2", "ici_context_parallelism=2"}},
      // envy's (the envy-test preset as MaxText ships it: 4 layers, every 2nd a top-1 MoE of 8
      // experts, qk-norm, a norm after every feed-forward block, tied logits), with the expert
      // dim sharded too.
      // qwen3's and deepseek's router options: the top-k weights renormalized, then scaled.
      {"tiny-moe",
       {"norm_topk_prob=true", "routed_scaling_factor=2.5", "compile_topology=v5e-4",
        "per_device_batch_size=1", "ici_fsdp_parallelism=2", "ici_expert_parallelism=2"}},
      {"envy-test",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=2",
        "ici_expert_parallelism=2"}},
  };
}

TEST(ShardedTraining, MatchesUnshardedAcrossMeshes) {
  std::vector<Case> cases = mesh_cases();
  for (const std::vector<Case>& more :
       {model_switch_cases(), moe_and_mla_cases(), decoder_block_cases()}) {
    cases.insert(cases.end(), more.begin(), more.end());
  }
  expect_each_matches_unsharded(cases);
}

// Pipeline stages (MaxText's SPMD loop, sim/functional/pipeline_loop.cpp) equal the unsharded
// step: 2 layers on 2 stages (one pass), 4 layers in a circular pipeline (2 repeats) with its
// storage (M > S) or around the ring (M = S), 2 layers per stage, 4 stages, each beside data,
// fsdp, tensor or expert parallelism, full remat, gradient accumulation and weights gathered once.
TEST(ShardedTraining, PipelineStagesMatchUnsharded) {
  const std::vector<std::string> four_layers = {"override_model_config=true",
                                                "base_num_decoder_layers=4"};
  const auto with = [](std::vector<std::string> items, const std::vector<std::string>& more) {
    items.insert(items.end(), more.begin(), more.end());
    return items;
  };
  const std::vector<Case> cases = {
      {"tiny-llama",
       {"compile_topology=v5e-4", "per_device_batch_size=1", "ici_fsdp_parallelism=1",
        "ici_data_parallelism=2", "ici_pipeline_parallelism=2", "num_pipeline_microbatches=2"}},
      {"tiny-llama",
       with(four_layers, {"compile_topology=v5e-4", "per_device_batch_size=2",
                          "ici_fsdp_parallelism=2", "ici_pipeline_parallelism=2",
                          "num_pipeline_microbatches=4", "num_layers_per_pipeline_stage=1"})},
      {"tiny-llama", with(four_layers, {"compile_topology=v5e-4", "per_device_batch_size=2",
                                        "ici_fsdp_parallelism=1", "ici_tensor_parallelism=2",
                                        "ici_pipeline_parallelism=2", "num_pipeline_microbatches=2",
                                        "num_layers_per_pipeline_stage=1", "remat_policy=full"})},
      {"tiny-llama",
       with(four_layers, {"compile_topology=v5e-4", "per_device_batch_size=2",
                          "ici_fsdp_parallelism=2", "ici_pipeline_parallelism=2",
                          "num_pipeline_microbatches=4", "num_layers_per_pipeline_stage=2"})},
      {"tiny-llama",
       with(four_layers, {"compile_topology=v5e-4", "per_device_batch_size=4",
                          "ici_fsdp_parallelism=1", "ici_pipeline_parallelism=4",
                          "num_pipeline_microbatches=8", "num_layers_per_pipeline_stage=1"})},
      {"tiny-llama",
       with(four_layers, {"compile_topology=v5e-4", "per_device_batch_size=2",
                          "ici_fsdp_parallelism=2", "ici_pipeline_parallelism=2",
                          "num_pipeline_microbatches=2", "num_layers_per_pipeline_stage=1",
                          "gradient_accumulation_steps=2", "pipeline_fsdp_ag_once=true"})},
      {"tiny-moe",
       {"compile_topology=v5e-4", "per_device_batch_size=2", "ici_fsdp_parallelism=1",
        "ici_expert_parallelism=2", "ici_pipeline_parallelism=2", "num_pipeline_microbatches=2"}},
  };
  expect_each_matches_unsharded(cases);
}

// A microbatch that would leave a device part of a sequence is refused naming the key (the
// performance model pads it; the engine computes whole sequences only).
TEST(ShardedTraining, PipelineMicrobatchOfPartSequencesIsUserError) {
  const Config config = Config::load(
      "", {"model_name=tiny-llama", "compile_topology=v5e-4", "per_device_batch_size=1",
           "ici_fsdp_parallelism=1", "ici_data_parallelism=2", "ici_pipeline_parallelism=2",
           "num_pipeline_microbatches=4", "max_target_length=32", "dataset_type=synthetic"});
  try {
    Trainer trainer(config);
    std::ostringstream quiet;
    trainer.run({.verify = false, .progress = false, .dump_directory = ""}, quiet);
    ADD_FAILURE() << "a microbatch of half a sequence per device was accepted";
  } catch (const UserError& error) {
    EXPECT_EQ(error.key(), "num_pipeline_microbatches");
    EXPECT_NE(std::string(error.what()).find("whole sequence"), std::string::npos) << error.what();
  }
}

TEST(ShardedTraining, TrainingIsDeterministic) {
  const std::vector<std::string> overrides = {"model_name=tiny-llama",
                                              "compile_topology=v5e-4",
                                              "per_device_batch_size=1",
                                              "ici_fsdp_parallelism=2",
                                              "ici_tensor_parallelism=2",
                                              "max_target_length=32",
                                              "steps=3",
                                              "learning_rate=1e-3"};
  const Config config = Config::load("", overrides);
  std::ostringstream quiet;
  Trainer first(config);
  Trainer second(config);
  const auto a = first.run({.verify = false, .progress = false, .dump_directory = ""}, quiet);
  const auto b = second.run({.verify = false, .progress = false, .dump_directory = ""}, quiet);
  ASSERT_EQ(a.size(), b.size());
  for (size_t index = 0; index < a.size(); ++index) {
    EXPECT_EQ(a[index].loss, b[index].loss);  // bitwise
    EXPECT_EQ(a[index].grad_norm, b[index].grad_norm);
  }
}

// num_threads bounds how many of the 8 devices compute at once (down to one at a time); the
// losses, gradient norms and final weights and Adam moments are bitwise the same for every count.
TEST(ShardedTraining, ThreadCountDoesNotChangeResults) {
  const std::string root = ::testing::TempDir() + std::to_string(::getpid()) + "_tpusim_threads";
  std::filesystem::remove_all(root);
  std::vector<std::vector<StepMetrics>> curves;
  std::vector<Checkpoint> finals;
  const std::vector<int> counts = {1, 2, 3, 8};
  for (const int threads : counts) {
    const std::string run = "t" + std::to_string(threads);
    const Config config = Config::load(
        "", {"model_name=tiny-llama", "compile_topology=v5e-8", "per_device_batch_size=1",
             "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "ici_data_parallelism=2",
             "max_target_length=32", "steps=3", "learning_rate=1e-3",
             "num_threads=" + std::to_string(threads), "enable_checkpointing=true",
             "checkpoint_period=3", "base_output_directory=" + root, "run_name=" + run});
    Trainer trainer(config);
    std::ostringstream quiet;
    curves.push_back(
        trainer.run({.verify = false, .progress = false, .dump_directory = ""}, quiet));
    finals.push_back(load_checkpoint(checkpoint_directory(root + "/" + run, 3)));
  }
  for (size_t run = 1; run < counts.size(); ++run) {
    SCOPED_TRACE("num_threads=" + std::to_string(counts[run]) + " vs 1");
    ASSERT_EQ(curves[run].size(), 3u);
    for (size_t step = 0; step < 3; ++step) {
      EXPECT_EQ(curves[run][step].loss, curves[0][step].loss);  // bitwise
      EXPECT_EQ(curves[run][step].grad_norm, curves[0][step].grad_norm);
    }
    using Tensors = std::map<std::string, CheckpointTensor>;
    for (Tensors Checkpoint::*part : {&Checkpoint::weights, &Checkpoint::optimizer}) {
      const Tensors& expected = finals[0].*part;
      const Tensors& actual = finals[run].*part;
      ASSERT_EQ(actual.size(), expected.size());
      ASSERT_FALSE(expected.empty());
      for (const auto& [name, tensor] : expected) {
        const auto found = actual.find(name);
        ASSERT_NE(found, actual.end()) << name;
        ASSERT_EQ(found->second.values.size(), tensor.values.size()) << name;
        EXPECT_EQ(std::memcmp(found->second.values.data(), tensor.values.data(),
                              tensor.values.size() * sizeof(float)),
                  0)
            << name;
      }
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace tpusim

namespace tpusim {
namespace {

// Per process, so concurrent test runs (ctest -j, a sanitizer build) never share directories.
std::string run_root() {
  return ::testing::TempDir() + std::to_string(::getpid()) + "_";
}

std::vector<StepMetrics> train_to(int64_t steps, const std::string& run_name,
                                  const std::vector<std::string>& mesh,
                                  const std::string& per_device_batch = "1") {
  std::vector<std::string> overrides = {
      "model_name=tiny-llama",
      "per_device_batch_size=" + per_device_batch,
      "max_target_length=32",
      "steps=" + std::to_string(steps),
      "learning_rate=1e-3",
      "enable_checkpointing=true",
      "checkpoint_period=2",
      "learning_rate_schedule_steps=4",
      "base_output_directory=" + run_root() + "tpusim_resume_" + run_name,
      "run_name=" + run_name};
  overrides.insert(overrides.end(), mesh.begin(), mesh.end());
  Trainer trainer(Config::load("", overrides));
  std::ostringstream quiet;
  return trainer.run({.verify = false, .progress = false, .dump_directory = ""}, quiet);
}

// Kill-and-resume gives the same curve as an uninterrupted run (bitwise): stop after step 2
// (the last checkpoint; the schedule length is fixed, as for a run killed mid-way), start
// again, and compare steps 3-4.
TEST(Checkpointing, ResumeContinuesBitwiseIdentically) {
  const std::vector<std::string> mesh = {"compile_topology=v5e-4", "ici_fsdp_parallelism=2",
                                         "ici_tensor_parallelism=2"};
  std::filesystem::remove_all(run_root() + "tpusim_resume_straight");
  std::filesystem::remove_all(run_root() + "tpusim_resume_resumed");
  const auto uninterrupted = train_to(4, "straight", mesh);
  const auto first_half = train_to(2, "resumed", mesh);
  const auto second_half = train_to(4, "resumed", mesh);
  ASSERT_EQ(uninterrupted.size(), 4u);
  ASSERT_EQ(first_half.size(), 2u);
  ASSERT_EQ(second_half.size(), 2u);
  EXPECT_EQ(second_half[0].step, 3);
  for (size_t index = 0; index < 2; ++index) {
    EXPECT_EQ(first_half[index].loss, uninterrupted[index].loss);
    EXPECT_EQ(second_half[index].loss, uninterrupted[index + 2].loss);
    EXPECT_EQ(second_half[index].grad_norm, uninterrupted[index + 2].grad_norm);
  }
}

// A checkpoint is global arrays: one written by 4 devices resumes on 1 device (and continues
// within fp32 summation-order tolerance of the 4-device run).
TEST(Checkpointing, ResumesOnAnotherMesh) {
  std::filesystem::remove_all(run_root() + "tpusim_resume_mesh");
  const auto sharded = train_to(4, "mesh", {"compile_topology=v5e-4", "ici_fsdp_parallelism=4"});
  std::filesystem::remove_all(run_root() + "tpusim_resume_mesh/mesh/checkpoints/4");
  const auto single = train_to(4, "mesh", {"compile_topology=v5e-1"}, "4");
  ASSERT_EQ(single.size(), 2u);
  EXPECT_NEAR(single[1].loss, sharded[3].loss, 1e-5 * sharded[3].loss);
}

// A pipelined run's checkpoint holds the model's layers by their number, whichever stage held
// them: 4 layers trained on 2 stages (circular) resume on one device, and a run without stages
// resumes on 2 stages; each continues within fp32 summation-order tolerance of the run it left.
TEST(Checkpointing, ResumesAcrossStageCounts) {
  const std::vector<std::string> staged = {
      "override_model_config=true",     "base_num_decoder_layers=4",  "compile_topology=v5e-4",
      "ici_fsdp_parallelism=2",         "ici_pipeline_parallelism=2", "num_pipeline_microbatches=4",
      "num_layers_per_pipeline_stage=1"};
  const std::vector<std::string> single = {"override_model_config=true",
                                           "base_num_decoder_layers=4", "compile_topology=v5e-1"};
  std::filesystem::remove_all(run_root() + "tpusim_resume_stages");
  const auto pipelined = train_to(4, "stages", staged, "2");
  ASSERT_EQ(pipelined.size(), 4u);
  std::filesystem::remove_all(run_root() + "tpusim_resume_stages/stages/checkpoints/4");
  const auto on_one_device = train_to(4, "stages", single, "8");
  ASSERT_EQ(on_one_device.size(), 2u);
  EXPECT_EQ(on_one_device[0].step, 3);
  for (size_t index = 0; index < 2; ++index) {
    EXPECT_NEAR(on_one_device[index].loss, pipelined[index + 2].loss,
                1e-5 * pipelined[index + 2].loss);
  }
  std::filesystem::remove_all(run_root() + "tpusim_resume_unstaged");
  const auto unstaged = train_to(4, "unstaged", single, "8");
  std::filesystem::remove_all(run_root() + "tpusim_resume_unstaged/unstaged/checkpoints/4");
  const auto on_stages = train_to(4, "unstaged", staged, "2");
  ASSERT_EQ(on_stages.size(), 2u);
  for (size_t index = 0; index < 2; ++index) {
    EXPECT_NEAR(on_stages[index].loss, unstaged[index + 2].loss, 1e-5 * unstaged[index + 2].loss);
  }
}

// A checkpoint carries the config keys that fix the model's math; one made with another
// rope_max_timescale or attn_logits_soft_cap (same shapes) is refused naming the key, not
// resumed (another opt_type is refused before: train builds AdamW only, train_keys.tsv).
TEST(Checkpointing, RefusesACheckpointOfAnotherModel) {
  std::filesystem::remove_all(run_root() + "tpusim_resume_other");
  train_to(2, "other", {"compile_topology=v5e-1"});
  for (const char* changed : {"rope_max_timescale=500000", "attn_logits_soft_cap=50.0"}) {
    std::vector<std::string> mesh = {"compile_topology=v5e-1", changed};
    try {
      train_to(4, "other", mesh);
      ADD_FAILURE() << changed << " resumed a checkpoint of another config";
    } catch (const UserError& error) {
      const std::string key = std::string(changed).substr(0, std::string(changed).find('='));
      EXPECT_EQ(error.key(), key);
      EXPECT_NE(std::string(error.what()).find("was made with " + key), std::string::npos)
          << error.what();
    }
  }
}

}  // namespace
}  // namespace tpusim
