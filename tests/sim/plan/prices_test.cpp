// tests/sim/plan/prices_test.cpp: the price file (sim/plan/prices.h), the hardware list and the
// global batch range: values read as written, and bad input refused naming the key and value.
#include "sim/plan/prices.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "hw/slice.h"
#include "sim/plan/global_batch.h"
#include "sim/plan/slice_candidates.h"

namespace tpusim {
namespace {

constexpr const char* kToyPrices = R"(currency: TOY
hardware:
  v6e: {per: chip_hour, on_demand: 3.0, spot: 1.5}
  a3: {per: node_hour, on_demand: 80}
)";

// The error message of `action`, or "" when it does not throw a UserError.
template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(Prices, ReadsPerChipAndSpreadsANodeOverItsGpus) {
  const PriceTable prices = PriceTable::from_yaml(kToyPrices, "toy.yml");
  EXPECT_EQ(prices.currency(), "TOY");
  EXPECT_EQ(prices.per_chip_hour(parse_slice("v6e-256"), Consumption::kOnDemand), 3.0);
  EXPECT_EQ(prices.per_chip_hour(parse_slice("v6e-8", 4), Consumption::kSpot), 1.5);
  EXPECT_FALSE(prices.per_chip_hour(parse_slice("v6e-8"), Consumption::kCommitted).has_value());
  EXPECT_FALSE(prices.per_chip_hour(parse_slice("v5p-8"), Consumption::kOnDemand).has_value());
  // 80 per 8-GPU node-hour: 10 per GPU-hour.
  EXPECT_EQ(prices.per_chip_hour(parse_slice("a3", 2), Consumption::kOnDemand), 10.0);
}

TEST(Prices, TheExampleFileReads) {
  const PriceTable prices =
      PriceTable::read(std::string(TPUSIM_DEFAULT_SOURCE_DIR) + "/configs/prices.example.yml");
  EXPECT_TRUE(prices.per_chip_hour(parse_slice("tpu7x-256"), Consumption::kSpot).has_value());
}

TEST(Prices, BadFilesNameTheKeyAndValue) {
  const auto refusal = [](const std::string& text) {
    return error_of([&] { PriceTable::from_yaml(text, "p.yml"); });
  };
  EXPECT_NE(refusal("hardware:\n  v9z: {per: chip_hour, on_demand: 1}\n").find("'v9z'"),
            std::string::npos);
  EXPECT_NE(refusal("hardware:\n  v6e: {per: chip_hour, on_demand: -2}\n").find("-2 is negative"),
            std::string::npos);
  EXPECT_NE(refusal("hardware:\n  v6e: {per: chip_hour, on_demand: cheap}\n").find("'cheap'"),
            std::string::npos);
  EXPECT_NE(refusal("hardware:\n  v6e: {per: node_hour, on_demand: 1}\n").find("node_hour"),
            std::string::npos);
  EXPECT_NE(refusal("hardware:\n  v6e: {per: chip_hour, reserved: 1}\n").find("v6e.reserved"),
            std::string::npos);
  EXPECT_NE(refusal("prices:\n  v6e: 1\n").find("'prices'"), std::string::npos);
  EXPECT_NE(refusal("hardware: [v6e\n").find("p.yml"), std::string::npos);  // malformed YAML
  EXPECT_NE(refusal("hardware:\n  a3: {on_demand: 80}\n").find("node_hour or per chip_hour"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_consumption("reserved"); }).find("'reserved'"), std::string::npos);
}

// --consumption picks a column of --prices: other than on_demand without the file it is refused
// (explore and plan share this check).
TEST(ConsumptionOption, NeedsPricesUnlessOnDemand) {
  EXPECT_EQ(consumption_option("on_demand", ""), Consumption::kOnDemand);
  EXPECT_EQ(consumption_option("spot", "p.yml"), Consumption::kSpot);
  EXPECT_NE(error_of([] { consumption_option("spot", ""); }).find("--consumption spot: picks"),
            std::string::npos);
  EXPECT_NE(error_of([] { consumption_option("foo", "p.yml"); }).find("'foo'"), std::string::npos);
}

TEST(HardwareKinds, UnknownOrRepeatedKindsAreRefused) {
  EXPECT_EQ(parse_hardware_kinds("v5p,tpu7x,a3").size(), 3U);
  EXPECT_NE(error_of([] { parse_hardware_kinds("v5p,v9"); }).find("'v9'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_hardware_kinds("tpu7x,v7x"); }).find("twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_hardware_kinds("v5p,,v6e"); }).find("empty"), std::string::npos);
}

TEST(SliceCandidates, LegalSizesThenWholeSlicesOverDcn) {
  const std::vector<SliceCandidate> candidates =
      enumerate_slice_candidates(parse_hardware_kinds("v6e,a3"), 1024, 4);
  std::vector<std::string> labels;
  for (const SliceCandidate& candidate : candidates) {
    labels.push_back(candidate.label());
    // Every candidate is a slice the catalog accepts, with the chips it says.
    EXPECT_EQ(parse_slice(candidate.slice_name, candidate.num_slices).total_chips(),
              candidate.chips);
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"v6e-1", "v6e-4", "v6e-8", "v6e-16", "v6e-32",
                                              "v6e-64", "v6e-128", "v6e-256", "v6e-256 x 2",
                                              "v6e-256 x 4", "a3", "a3 x 2", "a3 x 4"}));
  EXPECT_NE(error_of([] {
              enumerate_slice_candidates(parse_hardware_kinds("v6e"), 0, 4);
            }).find("--max-chips"),
            std::string::npos);
}

TEST(GlobalBatch, RangesAndTheSequencesSearched) {
  const GlobalBatchRange range = parse_global_batch_range("2M-8M");
  EXPECT_EQ(range.min_tokens, 2e6);
  EXPECT_EQ(range.max_tokens, 8e6);
  // 8e6 / 8192 = 976.6: the largest power of two of sequences in range is 512 (4.2M tokens).
  EXPECT_EQ(global_batch_sequences(range, 8192), 512);
  // No power of two in 1100-1200 sequences: the most whole sequences.
  EXPECT_EQ(global_batch_sequences({1100.0 * 8192, 1200.0 * 8192, "t"}, 8192), 1200);
  EXPECT_NE(error_of([] {
              global_batch_sequences({1000, 2000, "t"}, 8192);
            }).find("no whole"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_global_batch_range("-5"); }).find("'-5'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_global_batch_range("8M-2M"); }).find("ends below"),
            std::string::npos);
  // llama3.1-70b has published runs (validation/published.csv): v6e-64 at 2 x 64 x 8192 tokens is
  // among them, the range says where it comes from.
  const GlobalBatchRange published = default_global_batch_range("llama3.1-70b");
  EXPECT_NE(published.source.find("published"), std::string::npos);
  EXPECT_LE(published.min_tokens, 2.0 * 64 * 8192);
  EXPECT_GE(published.max_tokens, 2.0 * 64 * 8192);
  EXPECT_EQ(default_global_batch_range("tiny-llama").max_tokens, 16e6);
}

}  // namespace
}  // namespace tpusim
