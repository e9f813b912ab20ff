#include "model/flops_maxtext.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/csv.h"
#include "common/yaml_text.h"
#include "model/config.h"
#include "support/run_command.h"

namespace tpusim {
namespace {

constexpr double kTera = 1e12;
// Tolerances: MaxText's worked example is quoted to 5 significant digits. The published rows
// give TFLOP/s to 3+ digits and step times to 4 (published.csv derives the 2023 step times from
// the TFLOP/s with the row's convention), so they agree to rounding; 0.5% (tighter than the 2%
// asked for) also tells 2023a from 2023b on the 512B/1T rows, where the two are 1.6% apart.
constexpr double kWorkedExampleRelativeTolerance = 1e-4;
constexpr double kPublishedRelativeTolerance = 0.005;
// tpu7x: MaxText's device is one TensorCore, two per chip; published Ironwood figures are per chip
// (docs/reference/maxtext.md §0).
constexpr double kTpu7xDevicesPerChip = 2.0;
constexpr double kExactRelativeTolerance = 1e-12;

MaxTextFlops flops_of(const std::vector<std::string>& overrides) {
  return maxtext_training_flops_per_device(Config::load("", overrides));
}

void expect_relative(double actual, double expected, double tolerance, const std::string& what) {
  EXPECT_NEAR(actual / expected, 1.0, tolerance)
      << what << ": actual " << actual << ", expected " << expected;
}

// MaxText docs (reference/performance_metrics.md): deepseek2-16b on v5p-8, batch 24 x 2048
// tokens per device -> 764.67 TFLOP per device per step; 134.9 TFLOP/s at a 5.667 s step.
TEST(MaxTextFlops, DeepSeek2WorkedExampleFromMaxTextDocs) {
  const MaxTextFlops flops = flops_of({"model_name=deepseek2-16b", "compile_topology=v5p-8",
                                       "per_device_batch_size=24", "max_target_length=2048"});
  expect_relative(flops.total_tflops(), 764.67, kWorkedExampleRelativeTolerance, "total");
  // Before PR #1988 the attention term was not halved for the causal mask: 806.41.
  expect_relative(flops.learnable_weight_tflops + 2.0 * flops.attention_tflops, 806.41,
                  kWorkedExampleRelativeTolerance, "non-causal");
  EXPECT_EQ(flops.forward.num_layers, 27);
  EXPECT_EQ(flops.forward.num_dense_layers, 1);
  EXPECT_EQ(flops.forward.num_moe_layers, 26);
  EXPECT_EQ(flops.forward.num_global_attention_layers, 27);
  EXPECT_EQ(flops.forward.num_local_attention_layers, 0);
  // MLA without query compression (q_lora_rank 0), B.S = 24 x 2048 tokens, D 2048, 16 heads,
  // nope 128, rope 64, v 128, kv_lora 512.
  const double tokens = 24.0 * 2048;
  EXPECT_DOUBLE_EQ(
      flops.forward.qkv,
      2 * tokens * (2048.0 * 16 * (128 + 64) + 2048.0 * (512 + 64) + 512.0 * 16 * (128 + 128)));
  EXPECT_DOUBLE_EQ(flops.forward.out_proj, 2 * tokens * 2048.0 * 16 * 128);
  EXPECT_DOUBLE_EQ(flops.forward.global_attention,
                   2 * 24.0 * 2048 * 2048 * 16 * (128 + 64 + 128) / 2);
  // Router over 64 experts, then 2 shared + 6 routed SwiGLU experts of width 1408.
  EXPECT_DOUBLE_EQ(flops.forward.router, 2 * tokens * 2048 * 64);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn,
                   (2 + 6) * (2 * tokens * 2048 * 1408 * 2 + 2 * tokens * 2048 * 1408));
  EXPECT_DOUBLE_EQ(flops.forward.dense_ffn,
                   2 * tokens * 2048 * 10944 * 2 + 2 * tokens * 2048 * 10944);
  EXPECT_DOUBLE_EQ(flops.forward.unembed, 2 * tokens * 2048 * 102400);
}

// Dense Llama-style (GQA, SwiGLU): B=2, S=1024, D=1024, H=8, K=2, h=128, F=4096, L=4, V=32000.
TEST(MaxTextFlops, DenseLlamaStyleByHand) {
  const MaxTextFlops flops =
      flops_of({"base_emb_dim=1024", "base_num_query_heads=8", "base_num_kv_heads=2",
                "head_dim=128", "base_mlp_dim=4096", "base_num_decoder_layers=4",
                "vocab_size=32000", "mlp_activations=[silu, linear]", "decoder_block=llama2",
                "per_device_batch_size=2", "max_target_length=1024"});
  const double tokens = 2.0 * 1024;                              // B.S = 2048
  const double ffn = 2 * tokens * 1024 * 4096 * 2                // gate + up (a = 2)
                     + 2 * tokens * 1024 * 4096;                 // down: 51,539,607,552
  const double qkv = 2 * tokens * 1024 * (8 + 2 * 2) * 128;      // 6,442,450,944
  const double out_proj = 2 * tokens * 1024 * 8 * 128;           // 4,294,967,296
  const double attention = 4 * 2.0 * 1024 * 1024 * 8 * 128 / 2;  // causal: 4,294,967,296
  const double unembed = 2 * tokens * 1024 * 32000;              // 134,217,728,000
  EXPECT_DOUBLE_EQ(flops.forward.dense_ffn, ffn);
  EXPECT_DOUBLE_EQ(flops.forward.qkv, qkv);
  EXPECT_DOUBLE_EQ(flops.forward.out_proj, out_proj);
  EXPECT_DOUBLE_EQ(flops.forward.global_attention, attention);
  EXPECT_DOUBLE_EQ(flops.forward.unembed, unembed);
  EXPECT_DOUBLE_EQ(flops.forward.router, 0.0);
  // 3 x [4 x (ffn + qkv + out) + unembed] = 1.149977493504 TFLOP; 3 x 4 x attention = 0.0515...
  EXPECT_DOUBLE_EQ(flops.learnable_weight_tflops,
                   3 * (4 * (ffn + qkv + out_proj) + unembed) / kTera);
  expect_relative(flops.learnable_weight_tflops, 1.149977493504, kExactRelativeTolerance,
                  "learnable");
  expect_relative(flops.attention_tflops, 0.051539607552, kExactRelativeTolerance, "attention");
  expect_relative(flops.total_tflops(), 1.201517101056, kExactRelativeTolerance, "total");
}

// GPT-3 6B: one (GELU) input matmul, MHA, tied embeddings (the logits matmul still counts).
// B=1, S=2048, D=3072, H=K=12, h=256, F=12288, L=48, V=32768.
TEST(MaxTextFlops, Gpt3StyleOneActivationByHand) {
  const MaxTextFlops flops = flops_of({"model_name=gpt3-6b", "per_device_batch_size=1",
                                       "max_target_length=2048", "override_model_config=true"});
  const double tokens = 2048.0;
  const double ffn = 2 * tokens * 3072 * 12288 * 1 + 2 * tokens * 3072 * 12288;
  const double qkv = 2 * tokens * 3072 * (12 + 2 * 12) * 256;
  const double out_proj = 2 * tokens * 3072 * 12 * 256;
  const double attention = 2 * 1.0 * 2048 * 2048 * 12 * 256;
  const double unembed = 2 * tokens * 3072 * 32768;
  EXPECT_DOUBLE_EQ(flops.forward.dense_ffn, ffn);
  expect_relative(flops.learnable_weight_tflops,
                  3 * (48 * (ffn + qkv + out_proj) + unembed) / kTera, kExactRelativeTolerance,
                  "learnable");
  expect_relative(flops.attention_tflops, 3 * 48 * attention / kTera, kExactRelativeTolerance,
                  "attention");
  expect_relative(flops.total_tflops(), 71.743133712384, kExactRelativeTolerance, "total");
}

// Mixtral 8x7B: router over 8 experts plus the 2 active SwiGLU experts (dropless), every layer.
// B=1, S=4096, D=4096, H=32, K=8, h=128, F=14336, L=32, V=32000.
TEST(MaxTextFlops, MixtralCountsActiveExpertsOnly) {
  const MaxTextFlops flops =
      flops_of({"model_name=mixtral-8x7b", "per_device_batch_size=1", "max_target_length=4096"});
  const double tokens = 4096.0;
  const double expert = 2 * tokens * 4096 * 14336 * 2 + 2 * tokens * 4096 * 14336;
  const double router = 2 * tokens * 4096 * 8;
  const double qkv = 2 * tokens * 4096 * (32 + 2 * 8) * 128;
  const double out_proj = 2 * tokens * 4096 * 32 * 128;
  const double attention = 2 * 1.0 * 4096 * 4096 * 32 * 128;
  const double unembed = 2 * tokens * 4096 * 32000;
  EXPECT_EQ(flops.forward.num_moe_layers, 32);
  EXPECT_EQ(flops.forward.num_dense_layers, 0);
  EXPECT_DOUBLE_EQ(flops.forward.router, router);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn, 2 * expert);
  expect_relative(flops.learnable_weight_tflops,
                  3 * (32 * (router + 2 * expert + qkv + out_proj) + unembed) / kTera,
                  kExactRelativeTolerance, "learnable");
  expect_relative(flops.attention_tflops, 3 * 32 * attention / kTera, kExactRelativeTolerance,
                  "attention");
  expect_relative(flops.total_tflops(), 326.50341384192, kExactRelativeTolerance, "total");
  // Counting all 8 experts (MaxText before PR #678) would be 3.5x the expert FLOPs.
  EXPECT_LT(flops.learnable_weight_tflops, 3 * 32 * 8 * expert / kTera);
}

// Gemma 2 2B: 13 (local W=4096, global) pairs = 26 layers, GeGLU. B=1, S=8192, D=2304, H=8, K=4,
// h=256, F=9216, V=256128.
TEST(MaxTextFlops, Gemma2AlternatesSlidingWindowAndGlobalLayers) {
  const MaxTextFlops flops =
      flops_of({"model_name=gemma2-2b", "per_device_batch_size=1", "max_target_length=8192"});
  const double tokens = 8192.0;
  const double ffn = 2 * tokens * 2304 * 9216 * 2 + 2 * tokens * 2304 * 9216;
  const double qkv = 2 * tokens * 2304 * (8 + 2 * 4) * 256;
  const double out_proj = 2 * tokens * 2304 * 8 * 256;
  const double global = 2 * 1.0 * 8192 * 8192 * 8 * 256;
  const double local = 4 * 1.0 * (8192.0 * 4096 - 4096.0 * 4096 / 2) * 8 * 256;
  const double unembed = 2 * tokens * 2304 * 256128;
  EXPECT_EQ(flops.forward.num_layers, 26);
  EXPECT_EQ(flops.forward.num_global_attention_layers, 13);
  EXPECT_EQ(flops.forward.num_local_attention_layers, 13);
  EXPECT_DOUBLE_EQ(flops.forward.local_attention, local);
  expect_relative(flops.learnable_weight_tflops,
                  3 * (26 * (ffn + qkv + out_proj) + unembed) / kTera, kExactRelativeTolerance,
                  "learnable");
  expect_relative(flops.attention_tflops, 3 * 13 * (global + local) / kTera,
                  kExactRelativeTolerance, "attention");
  expect_relative(flops.total_tflops(), 147.263154290688, kExactRelativeTolerance, "total");
}

// Gemma 3: 5 local : 1 global, so 12 layers = 2 global + 10 local. GPT-OSS: alternating, with
// the 128-token window. A window at least as long as the sequence is plain causal attention.
TEST(MaxTextFlops, Gemma3AndGptOssSlidingWindowPatterns) {
  const MaxTextFlops gemma3 =
      flops_of({"decoder_block=gemma3", "base_num_decoder_layers=12", "sliding_window_size=1024",
                "base_num_query_heads=8", "base_num_kv_heads=4", "head_dim=256",
                "per_device_batch_size=1", "max_target_length=4096"});
  EXPECT_EQ(gemma3.forward.num_global_attention_layers, 2);
  EXPECT_EQ(gemma3.forward.num_local_attention_layers, 10);
  EXPECT_DOUBLE_EQ(gemma3.forward.global_attention, 2 * 1.0 * 4096 * 4096 * 8 * 256);
  EXPECT_DOUBLE_EQ(gemma3.forward.local_attention,
                   4 * 1.0 * (4096.0 * 1024 - 1024.0 * 1024 / 2) * 8 * 256);

  const MaxTextFlops gpt_oss =
      flops_of({"model_name=gpt-oss-20b", "per_device_batch_size=2", "max_target_length=8192"});
  EXPECT_EQ(gpt_oss.forward.num_global_attention_layers, 12);
  EXPECT_EQ(gpt_oss.forward.num_local_attention_layers, 12);
  EXPECT_DOUBLE_EQ(gpt_oss.forward.local_attention,
                   4 * 2.0 * (8192.0 * 128 - 128.0 * 128 / 2) * 64 * 64);
  // Generic MoE: router over 32 experts + top-4 of width 2880 with one (sigmoid) gate + linear.
  EXPECT_DOUBLE_EQ(gpt_oss.forward.router, 2 * 2.0 * 8192 * 2880 * 32);
  EXPECT_DOUBLE_EQ(gpt_oss.forward.moe_ffn,
                   4 * (2 * 2.0 * 8192 * 2880 * 2880 * 2 + 2 * 2.0 * 8192 * 2880 * 2880));

  const MaxTextFlops short_sequence =
      flops_of({"model_name=gemma2-2b", "per_device_batch_size=1", "max_target_length=2048"});
  EXPECT_DOUBLE_EQ(short_sequence.forward.local_attention, short_sequence.forward.global_attention);
}

// MLA with query compression (q_lora_rank > 0), DeepSeek-style dense-then-MoE with a shared
// expert. tiny-mla: D=64, H=4, q_lora 32, kv_lora 32, nope 16, rope 8, v 16, F=128, moe F=64,
// 3 layers (1 dense), 4 experts top-2 + 1 shared, V=256. B=2, S=64.
TEST(MaxTextFlops, MlaWithQueryLoraAndSharedExpertsByHand) {
  const MaxTextFlops flops =
      flops_of({"model_name=tiny-mla", "per_device_batch_size=2", "max_target_length=64"});
  const double tokens = 2.0 * 64;
  const double query = 64.0 * 32 + 32.0 * 4 * (16 + 8);      // down to q_lora, up to heads
  const double kv = 64.0 * (32 + 8) + 32.0 * 4 * (16 + 16);  // down to kv_lora + rope, up
  EXPECT_DOUBLE_EQ(flops.forward.qkv, 2 * tokens * (query + kv));
  EXPECT_DOUBLE_EQ(flops.forward.out_proj, 2 * tokens * 4 * 16 * 64);
  EXPECT_DOUBLE_EQ(flops.forward.global_attention, 2 * 2.0 * 64 * 64 * 4 * (16 + 8 + 16) / 2);
  const double dense = 2 * tokens * 64 * 128 * 2 + 2 * tokens * 64 * 128;
  const double expert = 2 * tokens * 64 * 64 * 2 + 2 * tokens * 64 * 64;
  const double router = 2 * tokens * 64 * 4;
  const double unembed = 2 * tokens * 64 * 256;
  EXPECT_EQ(flops.forward.num_dense_layers, 1);
  EXPECT_EQ(flops.forward.num_moe_layers, 2);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn, (1 + 2) * expert);
  expect_relative(flops.learnable_weight_tflops,
                  3 *
                      (dense + 2 * (router + 3 * expert) +
                       3 * (flops.forward.qkv + flops.forward.out_proj) + unembed) /
                      kTera,
                  kExactRelativeTolerance, "learnable");
}

TEST(MaxTextFlops, GradientAccumulationScalesBothTerms) {
  const std::vector<std::string> base = {"model_name=llama3.1-8b", "per_device_batch_size=2",
                                         "max_target_length=4096"};
  std::vector<std::string> accumulated = base;
  accumulated.push_back("gradient_accumulation_steps=4");
  const MaxTextFlops one = flops_of(base);
  const MaxTextFlops four = flops_of(accumulated);
  EXPECT_EQ(four.gradient_accumulation_steps, 4);
  EXPECT_DOUBLE_EQ(four.learnable_weight_tflops, 4 * one.learnable_weight_tflops);
  EXPECT_DOUBLE_EQ(four.attention_tflops, 4 * one.attention_tflops);
  EXPECT_DOUBLE_EQ(four.forward.qkv, one.forward.qkv);  // per microbatch, unchanged
  const MaxText2023Flops old_one = maxtext_2023_flops_per_device(Config::load("", base));
  const MaxText2023Flops old_four = maxtext_2023_flops_per_device(Config::load("", accumulated));
  EXPECT_DOUBLE_EQ(old_four.total_2023b_tflops(), 4 * old_one.total_2023b_tflops());
}

// The dims are MaxText's after global_parameter_scale: scale 16 on the defaults equals writing
// the scaled dims out (D x2, heads and F x4, L x2; maxtext.md §0).
TEST(MaxTextFlops, UsesScaledDims) {
  const MaxTextFlops scaled = flops_of({"global_parameter_scale=16"});
  const MaxTextFlops explicit_dims =
      flops_of({"base_emb_dim=4096", "base_num_query_heads=64", "base_num_kv_heads=64",
                "base_mlp_dim=28672", "base_num_decoder_layers=32"});
  EXPECT_DOUBLE_EQ(scaled.total_tflops(), explicit_dims.total_tflops());
}

// ---- 2023 conventions against the published 2023 README tables ----------------------------

struct PublishedRow {
  std::map<std::string, std::string> fields;
  const std::string& operator[](const std::string& column) const { return fields.at(column); }
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::istringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) {
    parts.push_back(part);
  }
  return parts;
}

// validation/published.csv, in the repository, read with the project's CSV parser (the full
// recipes of I-2 and I-4 hold quoted commas).
std::vector<PublishedRow> read_published_csv() {
  const std::string path = testing::source_dir() + "/validation/published.csv";
  const CsvTable table = parse_csv(read_text_file(path), path);
  std::vector<PublishedRow> rows;
  for (const std::vector<std::string>& values : table.rows) {
    PublishedRow row;
    for (size_t column = 0; column < table.header.size(); ++column) {
      row.fields[table.header[column]] = values[column];
    }
    rows.push_back(row);
  }
  return rows;
}

// Each row's `derived` column names the convention its TFLOP/s was published with: "2023a"
// (6.N.T only; the Mar-2023 v4 rows) or "2023b" (6.N.T + 12.L.H.h.S^2.B; v5e and v5p tables).
// The TFLOP per step is published TFLOP/s x step time.
TEST(MaxText2023Flops, ReproducesPublished2023Tables) {
  int rows_2023a = 0;
  int rows_2023b = 0;
  for (const PublishedRow& row : read_published_csv()) {
    const std::string& hardware = row["hardware"];
    if (hardware != "v4" && hardware != "v5e" && hardware != "v5p") {
      continue;
    }
    const bool is_2023a = row["derived"].find("MaxText 2023a") != std::string::npos;
    const bool is_2023b = row["derived"].find("MaxText 2023b") != std::string::npos;
    ASSERT_TRUE(is_2023a != is_2023b) << row["id"] << ": derived names no 2023 convention";
    const MaxText2023Flops flops =
        maxtext_2023_flops_per_device(Config::load("", split(row["args"], ' ')));
    const double published =
        std::stod(row["published_tflops_chip"]) * std::stod(row["measured_step_s"]);
    const double computed = is_2023a ? flops.total_2023a_tflops() : flops.total_2023b_tflops();
    expect_relative(computed, published, kPublishedRelativeTolerance, row["id"]);
    (is_2023a ? rows_2023a : rows_2023b) += 1;
  }
  EXPECT_EQ(rows_2023a, 2);  // V4-1, V4-4
  EXPECT_EQ(rows_2023b, 9);  // E16-1 ... P1T-3
}

// The newer rows of published.csv (tpu-recipes, 2024-2025) carry no convention in `derived`;
// they match the per-matmul formula: the v6e rows before PR #1988 (attention not halved, i.e.
// learnable + 2 x attention), the tpu7x (Ironwood) rows after it (causal), per chip.
TEST(MaxTextFlops, ReproducesPublishedRecipeRows) {
  int rows = 0;
  for (const PublishedRow& row : read_published_csv()) {
    const std::string& hardware = row["hardware"];
    if (hardware != "v6e" && hardware != "v7x") {
      continue;
    }
    const MaxTextFlops flops =
        maxtext_training_flops_per_device(Config::load("", split(row["args"], ' ')));
    const double published =
        std::stod(row["published_tflops_chip"]) * std::stod(row["measured_step_s"]);
    const double computed = hardware == "v6e"
                                ? flops.learnable_weight_tflops + 2.0 * flops.attention_tflops
                                : kTpu7xDevicesPerChip * flops.total_tflops();
    expect_relative(computed, published, kPublishedRelativeTolerance, row["id"]);
    ++rows;
  }
  // R-16 (v6e); I-14, I-16, I-12, I-2, I-3, I-4, I-11, I-19,
  // I-21 (tpu7x, MoE included).
  EXPECT_EQ(rows, 16);
}

// Every public recipe that publishes TFLOP/s per chip (Ironwood README rows: tpu7x, per chip of 2
// devices): MaxText's count for the recipe as written, x step time, equals tpusim's. This covers
// gemma4's global layers (their own head width and kv heads, one shared K/V projection), its
// shared expert as wide as the dense MLP, deepseek3, qwen3 MoE, gpt-oss, llama3.1 at 128k.
TEST(MaxTextFlops, ReproducesPublishedRecipeTflops) {
  std::ifstream file(testing::source_dir() + "/validation/recipes_public.json");
  ASSERT_TRUE(file.good());
  const nlohmann::json recipes = nlohmann::json::parse(file);
  std::set<std::string> models;
  for (const auto& recipe : recipes) {
    if (!recipe.contains("measured_tflops_per_chip") ||
        !recipe["measured_tflops_per_chip"].is_number()) {
      continue;
    }
    const std::string model = recipe["model_name"].get<std::string>();
    SCOPED_TRACE(recipe["id"].get<std::string>());
    ASSERT_EQ(recipe["generation"], "v7x");
    std::vector<std::string> overrides = {"compile_topology=" +
                                          recipe["topology"].get<std::string>()};
    for (const auto& arg : recipe["args"]) {
      overrides.push_back(arg.get<std::string>());
    }
    const MaxTextFlops flops = flops_of(overrides);
    // The README rounds step times to 0.01 s (0.57 s is 0.566 s by its tokens/s): where the
    // recipe publishes tokens/s per chip, the step time is the chip's tokens per step over it.
    double step_s = recipe["measured_step_s"].get<double>();
    if (recipe.contains("measured_tokens_per_s_per_chip") &&
        recipe["measured_tokens_per_s_per_chip"].is_number()) {
      const Config config = Config::load("", overrides);
      const double tokens_per_chip = kTpu7xDevicesPerChip *
                                     config.get_float("per_device_batch_size") *
                                     static_cast<double>(config.get_int("max_target_length") *
                                                         flops.gradient_accumulation_steps);
      step_s = tokens_per_chip / recipe["measured_tokens_per_s_per_chip"].get<double>();
    }
    const double published = recipe["measured_tflops_per_chip"].get<double>() * step_s;
    expect_relative(kTpu7xDevicesPerChip * flops.total_tflops(), published,
                    kPublishedRelativeTolerance, recipe["id"].get<std::string>());
    models.insert(model);
  }
  EXPECT_TRUE(models.contains("gemma4-26b"));
  EXPECT_TRUE(models.contains("gemma4-31b"));
  EXPECT_TRUE(models.contains("gemma4-e2b"));
  EXPECT_GE(models.size(), 8u);
}

// gemma4-e2b by hand: 35 layers, every 5th global (7: 4, 9, ..., 34) with head_dim 512, the others
// sliding-window (512) with head_dim 256; 8 query heads, 1 kv head; the last 20 layers reuse
// earlier keys and values (no K/V projection) and have a double-wide MLP (2 x 6144); every layer
// has a per-layer input of width 256 (gate and output projections, plus its slice of the
// embeddings' projection to 35 x 256). D 1536, V 262144, GeGLU (2 input matmuls).
TEST(MaxTextFlops, Gemma4SmallByHand) {
  const MaxTextFlops flops =
      flops_of({"model_name=gemma4-e2b", "per_device_batch_size=1", "max_target_length=8192"});
  const double tokens = 8192.0;
  const double dim = 1536;
  const double heads = 8;
  auto ffn = [&](double width) { return 2 * tokens * dim * width * 2 + 2 * tokens * dim * width; };
  auto qkv = [&](double head_dim, double kv_heads) {
    return 2 * tokens * dim * (heads + 2 * kv_heads) * head_dim;
  };
  auto out = [&](double head_dim) { return 2 * tokens * dim * heads * head_dim; };
  // Layers 0-14: 12 local, 3 global (4, 9, 14), own K/V. Layers 15-34: 16 local, 4 global.
  const double weights = 15 * ffn(6144) + 20 * ffn(12288) + 12 * (qkv(256, 1) + out(256)) +
                         3 * (qkv(512, 1) + out(512)) + 16 * (qkv(256, 0) + out(256)) +
                         4 * (qkv(512, 0) + out(512)) + 2 * tokens * dim * 262144 +
                         2 * tokens * dim * 35 * 256 + 35 * 2 * (2 * tokens * dim * 256);
  const double window = 512;
  const double local = 4 * (tokens * window - window * window / 2) * heads * 256;
  const double global = 2 * tokens * tokens * heads * 512;
  EXPECT_EQ(flops.forward.num_global_attention_layers, 7);
  EXPECT_EQ(flops.forward.num_kv_shared_layers, 20);
  EXPECT_EQ(flops.forward.num_kv_shared_global_layers, 4);
  EXPECT_NEAR(flops.forward.learnable_weight_flops(), weights, 1e-9 * weights);
  EXPECT_NEAR(flops.forward.attention_flops(), 28 * local + 7 * global,
              1e-9 * (28 * local + 7 * global));
}

// llama4-17b-128e by hand: 48 layers; every 4th global (no RoPE), the others chunked (8192);
// every 2nd MoE (1 shared + top-1 of 128 experts of width 8192), the others dense (16384).
// D 5120, 40 query / 8 kv heads of 128, V 202048. At S = 8192 = C a chunk is the whole sequence.
TEST(MaxTextFlops, Llama4InterleavedMoeAndChunkedAttentionByHand) {
  const MaxTextFlops flops =
      flops_of({"model_name=llama4-17b-128e", "per_device_batch_size=1", "max_target_length=8192"});
  const double tokens = 8192.0;
  const double dim = 5120;
  auto ffn = [&](double width) { return 2 * tokens * dim * width * 2 + 2 * tokens * dim * width; };
  EXPECT_EQ(flops.forward.num_layers, 48);
  EXPECT_EQ(flops.forward.num_dense_layers, 24);
  EXPECT_EQ(flops.forward.num_moe_layers, 24);
  EXPECT_EQ(flops.forward.num_global_attention_layers, 12);
  EXPECT_EQ(flops.forward.num_chunked_attention_layers, 36);
  EXPECT_DOUBLE_EQ(flops.forward.dense_ffn, ffn(16384));
  EXPECT_DOUBLE_EQ(flops.forward.router, 2 * tokens * dim * 128);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn, 2 * ffn(8192));
  EXPECT_DOUBLE_EQ(flops.forward.qkv, 2 * tokens * dim * (40 + 2 * 8) * 128);
  const double causal = 2 * 1.0 * 8192 * 8192 * 40 * 128;
  EXPECT_DOUBLE_EQ(flops.forward.global_attention, causal);
  EXPECT_DOUBLE_EQ(flops.forward.chunked_attention, causal);
  // At 3 chunks of 4096 + 1024 tokens: 4.(3 x 4096^2/2 + 1024^2/2).H.h.
  const MaxTextFlops longer =
      flops_of({"model_name=llama4-17b-128e", "per_device_batch_size=1", "max_target_length=13312",
                "chunk_attn_window_size=4096", "override_model_config=true"});
  EXPECT_DOUBLE_EQ(longer.forward.chunked_attention,
                   4.0 * (3 * 4096.0 * 4096 / 2 + 1024.0 * 1024 / 2) * 40 * 128);
}

// deepseek4-284b by hand, from MaxText's calculate_tflops_training_per_device at commit 00902f36
// (docs/reference/deepseek4.md): DEEPSEEK4 is in none of its per-block branches, so the generic
// path counts it. B = 1, S = 4096 (T = 4096 tokens), D 4096, 64 query heads and 1 kv head of 512,
// 43 layers, all MoE (num_experts 256 > 1): router 2.T.D.E, top-6 experts of width 2048 with
// SwiGLU (3 matmuls of 2.T.F.D); the shared expert is not counted (the generic MoE path), nor are
// the compressors, the indexer, mHC or the grouped out projection. Q, K, V: 2.T.D.(H + 2K).h, out
// 2.T.D.H.h, causal attention 2.B.S^2.H.h per layer, unembedding 2.T.D.V (V = 129280).
//   router      2 x 4096 x 4096 x 256                 =     8,589,934,592
//   experts     6 x 3 x (2 x 4096 x 2048 x 4096)      = 1,236,950,581,248
//   qkv         2 x 4096 x 4096 x 66 x 512            = 1,133,871,366,144
//   out         2 x 4096 x 4096 x 64 x 512            = 1,099,511,627,776
//   one layer                                         = 3,478,923,509,760
//   43 layers + unembedding 4,337,916,968,960         = 153,931,627,888,640 (forward weights)
//   attention   43 x 2 x 4096^2 x 64 x 512            = 47,278,999,994,368
//   x 3 (forward + backward) / 1e12: 461.79488366592 + 141.836999983104 = 603.631883649024 TFLOP
TEST(MaxTextFlops, Deepseek4ByHandFromMaxTextsGenericPath) {
  const MaxTextFlops flops =
      flops_of({"model_name=deepseek4-284b", "per_device_batch_size=1", "max_target_length=4096"});
  EXPECT_EQ(flops.forward.num_layers, 43);
  EXPECT_EQ(flops.forward.num_moe_layers, 43);
  EXPECT_EQ(flops.forward.num_global_attention_layers, 43);
  EXPECT_DOUBLE_EQ(flops.forward.router, 8589934592.0);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn, 1236950581248.0);
  EXPECT_DOUBLE_EQ(flops.forward.global_qkv, 1133871366144.0);
  EXPECT_DOUBLE_EQ(flops.forward.global_out_proj, 1099511627776.0);
  EXPECT_DOUBLE_EQ(flops.forward.learnable_weight_flops(), 153931627888640.0);
  EXPECT_DOUBLE_EQ(flops.forward.attention_flops(), 47278999994368.0);
  expect_relative(flops.learnable_weight_tflops, 461.79488366592, kExactRelativeTolerance,
                  "learnable");
  expect_relative(flops.attention_tflops, 141.836999983104, kExactRelativeTolerance, "attention");
  expect_relative(flops.total_tflops(), 603.631883649024, kExactRelativeTolerance, "total");
}

// qwen3-custom-30b-a3b by hand, from MaxText's QWEN3_CUSTOM_MOE branches (commit 00902f36): the
// router and experts at moe_expert_input_dim A = 768, the out projection to A, a layer up
// projection A -> D. B = 1, S = 4096, D 2048, 16 query / 2 kv heads of 256, 48 layers, 128
// experts top-8 of width 2048 (SwiGLU), V 151936.
//   router      2 x 4096 x 768 x 128                  =       805,306,368
//   experts     8 x 3 x (2 x 4096 x 2048 x 768)       =   309,237,645,312
//   qkv         2 x 4096 x 2048 x 20 x 256            =    85,899,345,920
//   out         2 x 4096 x 768 x 16 x 256             =    25,769,803,776
//   up          2 x 4096 x 768 x 2048                 =    12,884,901,888
//   one layer                                         =   434,597,003,264
//   48 layers + unembedding 2,549,063,090,176         = 23,409,719,246,848 (forward weights)
//   attention   48 x 2 x 4096^2 x 16 x 256            =  6,597,069,766,656
//   x 3 / 1e12: 70.229157740544 + 19.791209299968 = 90.020367040512 TFLOP
TEST(MaxTextFlops, Qwen3CustomMoeByHandFromMaxTextsFormula) {
  const MaxTextFlops flops = flops_of(
      {"model_name=qwen3-custom-30b-a3b", "per_device_batch_size=1", "max_target_length=4096"});
  EXPECT_EQ(flops.forward.num_layers, 48);
  EXPECT_EQ(flops.forward.num_moe_layers, 48);
  EXPECT_DOUBLE_EQ(flops.forward.router, 805306368.0);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn, 309237645312.0);
  EXPECT_DOUBLE_EQ(flops.forward.global_qkv, 85899345920.0);
  EXPECT_DOUBLE_EQ(flops.forward.global_out_proj, 25769803776.0);
  EXPECT_DOUBLE_EQ(flops.forward.layer_up_projection, 12884901888.0);
  EXPECT_DOUBLE_EQ(flops.forward.learnable_weight_flops(), 23409719246848.0);
  EXPECT_DOUBLE_EQ(flops.forward.attention_flops(), 6597069766656.0);
  expect_relative(flops.total_tflops(), 90.020367040512, kExactRelativeTolerance, "total");
}

// envy-switch-base by hand (MaxText's preset): 12 layers, every 2nd (1, 3, ...) a top-1 MoE of
// 128 SwiGLU experts of width 6144, the others a dense SwiGLU MLP of 6144. D 1536, 12 query and
// 12 kv heads of 128 (MaxText's default head_dim), V 32768, causal global attention everywhere.
TEST(MaxTextFlops, EnvySwitchInterleavedTopOneMoeByHand) {
  const MaxTextFlops flops = flops_of(
      {"model_name=envy-switch-base", "per_device_batch_size=1", "max_target_length=4096"});
  const double tokens = 4096.0;
  const double dim = 1536;
  const double ffn = 2 * tokens * dim * 6144 * 2 + 2 * tokens * dim * 6144;
  const double router = 2 * tokens * dim * 128;
  const double qkv = 2 * tokens * dim * (12 + 2 * 12) * 128;
  const double out_proj = 2 * tokens * dim * 12 * 128;
  const double attention = 2 * 1.0 * 4096 * 4096 * 12 * 128;
  const double unembed = 2 * tokens * dim * 32768;
  EXPECT_EQ(flops.forward.num_layers, 12);
  EXPECT_EQ(flops.forward.num_dense_layers, 6);
  EXPECT_EQ(flops.forward.num_moe_layers, 6);
  EXPECT_DOUBLE_EQ(flops.forward.dense_ffn, ffn);
  EXPECT_DOUBLE_EQ(flops.forward.moe_ffn, ffn);
  EXPECT_DOUBLE_EQ(flops.forward.router, router);
  expect_relative(flops.learnable_weight_tflops,
                  3 * (6 * ffn + 6 * (router + ffn) + 12 * (qkv + out_proj) + unembed) / kTera,
                  kExactRelativeTolerance, "learnable");
  expect_relative(flops.attention_tflops, 3 * 12 * attention / kTera, kExactRelativeTolerance,
                  "attention");
}

// gps16 by hand (maxtext.md §0): D=5120, 32 heads x 256 (MHA), F=32768 (relu), L=32, V=32768,
// tied embeddings. N = 32 x (4.D.H.h + 2.D.F + 2.D) + V.D + D.
TEST(MaxText2023Flops, Gps16ByHand) {
  const MaxText2023Flops flops = maxtext_2023_flops_per_device(
      Config::load("", {"base_emb_dim=5120", "base_num_query_heads=32", "base_num_kv_heads=32",
                        "head_dim=256", "base_mlp_dim=32768", "base_num_decoder_layers=32",
                        "vocab_size=32768", "mlp_activations=[relu]", "logits_via_embedding=true",
                        "max_target_length=2048", "per_device_batch_size=6"}));
  const double params =
      32 * (4 * 5120.0 * 32 * 256 + 2 * 5120.0 * 32768 + 2 * 5120.0) + 32768.0 * 5120 + 5120;
  EXPECT_DOUBLE_EQ(flops.num_params, params);  // 16.27e9
  EXPECT_DOUBLE_EQ(flops.weight_tflops, 6 * params * 6 * 2048 / kTera);
  EXPECT_DOUBLE_EQ(flops.attention_tflops, 12.0 * 32 * 32 * 256 * 2048 * 2048 * 6 / kTera);
}

}  // namespace
}  // namespace tpusim
