#include "hw/catalog.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"

namespace tpusim {
namespace {

TEST(Catalog, BuiltinHasEveryGenerationWithProvenanceOnEveryNumber) {
  const HardwareCatalog& catalog = HardwareCatalog::builtin();
  for (const char* name : {"v4", "v5e", "v5p", "v6e", "v7x"}) {
    const ChipSpec& chip = catalog.chip(name);
    for (const std::string& key : chip_spec_keys()) {
      ASSERT_TRUE(chip.provenance.contains(key)) << name << " " << key;
      EXPECT_FALSE(chip.provenance.at(key).text.empty()) << name << " " << key;
    }
  }
}

// Published peak numbers from docs/reference/hardware.md §1a.
TEST(Catalog, PeakAndMemoryMatchReferenceTable) {
  const HardwareCatalog& catalog = HardwareCatalog::builtin();
  EXPECT_DOUBLE_EQ(catalog.chip("v4").peak_bf16_tflops, 275);
  EXPECT_DOUBLE_EQ(catalog.chip("v5e").peak_bf16_tflops, 197);
  EXPECT_DOUBLE_EQ(catalog.chip("v5p").peak_bf16_tflops, 459);
  EXPECT_DOUBLE_EQ(catalog.chip("v6e").peak_bf16_tflops, 918);
  EXPECT_DOUBLE_EQ(catalog.chip("v7x").peak_bf16_tflops, 2307);
  EXPECT_DOUBLE_EQ(catalog.chip("v5p").hbm_bandwidth_gbps, 2765);
  EXPECT_DOUBLE_EQ(catalog.chip("v7x").hbm_capacity_gib, 192);
  EXPECT_DOUBLE_EQ(catalog.chip("v7x").devices_per_chip, 2);
  EXPECT_DOUBLE_EQ(catalog.chip("v5p").devices_per_chip, 1);
}

// The MXU arithmetic (TensorCores x MXUs x dim^2 x 2 FLOP x clock) reproduces the published peak,
// so cycle-level numbers and peak FLOP/s cannot drift apart.
TEST(Catalog, MxuArithmeticReproducesPeak) {
  for (const ChipSpec& chip : HardwareCatalog::builtin().chips()) {
    if (chip.is_gpu()) {
      continue;  // tensor cores are no systolic array; the GPU entry takes the published peak
    }
    const double derived = chip.tensorcores_per_chip * chip.mxus_per_tensorcore * chip.mxu_dim *
                           chip.mxu_dim * 2.0 * chip.clock_ghz * 1e9 / 1e12;
    EXPECT_NEAR(derived / chip.peak_bf16_tflops, 1.0, 0.01) << chip.name;
  }
}

TEST(Catalog, OnlyV7xHasD2dAndSparseCoreOffloadByDefault) {
  for (const ChipSpec& chip : HardwareCatalog::builtin().chips()) {
    const bool is_v7x = chip.name == "v7x";
    EXPECT_EQ(chip.d2d_bandwidth_uni_gbps > 0, is_v7x) << chip.name;
    EXPECT_EQ(chip.sparsecore_collective_offload_default > 0, is_v7x) << chip.name;
  }
}

TEST(Catalog, UnknownChipSuggests) {
  try {
    HardwareCatalog::builtin().chip("v5q");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("did you mean"), std::string::npos);
  }
}

constexpr const char* kMinimalChip = R"(
name: test
display_name: "Test"
slice: {name_prefixes: ["t"], name_counts: chips, shape_rule: plane, small_shapes: ["2x2"], wraparound: axis_16}
specs:
)";

std::string chip_text_with(const std::string& override_key, const std::string& override_entry) {
  std::string text = kMinimalChip;
  for (const std::string& key : chip_spec_keys()) {
    // 1 everywhere, but a share of the compute that collectives hold (which must leave some).
    const std::string plain = key == "collective_compute_share" ? "{value: 0, source: \"s\"}"
                                                                : "{value: 1, source: \"s\"}";
    const std::string entry = key == override_key ? override_entry : plain;
    if (!entry.empty()) {
      text += "  " + key + ": " + entry + "\n";
    }
  }
  return text;
}

TEST(Catalog, RejectsNumberWithoutProvenance) {
  EXPECT_NO_THROW(HardwareCatalog::from_texts({{"ok.yml", chip_text_with("", "")}}));
  EXPECT_THROW(HardwareCatalog::from_texts({{"a.yml", chip_text_with("clock_ghz", "{value: 1}")}}),
               UserError);
  EXPECT_THROW(
      HardwareCatalog::from_texts(
          {{"b.yml", chip_text_with("clock_ghz", "{value: 1, source: s, assumption: a}")}}),
      UserError);
  EXPECT_THROW(HardwareCatalog::from_texts({{"c.yml", chip_text_with("clock_ghz", "")}}),
               UserError);
  EXPECT_THROW(HardwareCatalog::from_texts(
                   {{"d.yml", chip_text_with("clock_ghz", "{value: fast, source: s}")}}),
               UserError);
  EXPECT_THROW(HardwareCatalog::from_texts(
                   {{"e.yml", chip_text_with("", "") + "  clok_ghz: {value: 1, source: s}\n"}}),
               UserError);
}

// Red-team item 9: a catalog (TPUSIM_HW_DIR) with a zero, negative, non-finite or absurd number
// gave NaN or infinite step times and a 1644% MFU. Every number is checked when the file loads,
// naming the file and the key.
TEST(RedTeam, Item9_CatalogNumbersAreValidatedOnLoad) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"hbm_bandwidth_gbps", "0"},
      {"hbm_bandwidth_gbps", "-819"},
      {"peak_bf16_tflops", ".nan"},
      {"peak_bf16_tflops", ".inf"},
      {"clock_ghz", "1e300"},
      {"ici_achievable_fraction", "1.5"},
      {"ici_link_bandwidth_uni_gbps", "0"},
      {"dcn_bandwidth_per_chip_gbps", "0"},
      {"devices_per_chip", "1.5"},
      {"max_slice_chips", "1e12"},
      {"collective_compute_share", "1"},
      {"matmul_output_fusion", "0.5"},
      {"power_watts", "0"},
      {"chips_per_host", "0"}};
  for (const auto& [key, value] : bad) {
    SCOPED_TRACE(key + "=" + value);
    try {
      HardwareCatalog::from_texts(
          {{"dir/test.yml", chip_text_with(key, "{value: " + value + ", source: s}")}});
      ADD_FAILURE() << "no error";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find("dir/test.yml: specs." + key + ".value"),
                std::string::npos)
          << error.what();
    }
  }
  // Across keys: an MFU peak far below the chip's peak, more usable HBM than the chip has.
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"peak_bf16_tflops", "16.44"}, {"hbm_usable_gib", "2"}}) {
    SCOPED_TRACE(key);
    try {
      HardwareCatalog::from_texts(
          {{"dir/test.yml", chip_text_with(key, "{value: " + value + ", source: s}")}});
      ADD_FAILURE() << "no error";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find("dir/test.yml: specs."), std::string::npos)
          << error.what();
    }
  }
}

}  // namespace
}  // namespace tpusim
