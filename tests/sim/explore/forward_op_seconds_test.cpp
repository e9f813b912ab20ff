// The forward ops' seconds table of the explorer's remat bounds (sim/explore/forward_op_seconds.h)
// against a std::map built the way tensorcore_lower_bounds built it before: the same seconds for
// every (region, name), the least of a name seen twice, and no entry for one never added.
#include "sim/explore/forward_op_seconds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tpusim {
namespace {

TEST(ForwardOpSeconds, KeepsTheLeastSecondsOfEachRegionAndName) {
  ForwardOpSeconds table(2);
  const double first[] = {3.0, 1.0};
  const double second[] = {2.0, 4.0};
  table.add(1, "layers/mlp/wi", first);
  table.add(0, "layers/mlp/wi", second);
  table.add(1, "layers/mlp/wi", second);
  table.finish();
  ASSERT_EQ(table.size(), 2U);
  const double* merged = table.find(1, "layers/mlp/wi");
  ASSERT_NE(merged, nullptr);
  EXPECT_EQ(merged[0], 2.0);
  EXPECT_EQ(merged[1], 1.0);
  const double* other = table.find(0, "layers/mlp/wi");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other[1], 4.0);
  EXPECT_EQ(table.find(2, "layers/mlp/wi"), nullptr);
  EXPECT_EQ(table.find(1, "layers/mlp/wo"), nullptr);
  EXPECT_EQ(table.find(1, "layers/mlp/w"), nullptr);  // a prefix is another name
}

TEST(ForwardOpSeconds, AgreesWithAMapOverRandomOps) {
  std::mt19937 random(45);
  const std::vector<std::string> names = {
      "a", "ab", "layers/self_attention/query", "layers/self_attention/key", "layers/mlp/wi_0", ""};
  constexpr size_t kContexts = 3;
  ForwardOpSeconds table(kContexts);
  std::map<std::pair<int, std::string>, std::vector<double>> reference;
  for (int op = 0; op < 200; ++op) {
    const int region = static_cast<int>(random() % 4);
    const std::string& name = names[random() % names.size()];
    std::vector<double> seconds(kContexts);
    for (double& value : seconds) {
      value = static_cast<double>(random() % 1000) * 1e-6;
    }
    table.add(region, name, seconds.data());
    const auto [entry, added] = reference.try_emplace({region, name}, seconds);
    for (size_t context = 0; context < kContexts && !added; ++context) {
      entry->second[context] = std::min(entry->second[context], seconds[context]);
    }
  }
  table.finish();
  EXPECT_EQ(table.size(), reference.size());
  for (int region = 0; region < 5; ++region) {
    for (const std::string& name : names) {
      const auto expected = reference.find({region, name});
      const double* found = table.find(region, name);
      ASSERT_EQ(found == nullptr, expected == reference.end()) << region << " " << name;
      for (size_t context = 0; found != nullptr && context < kContexts; ++context) {
        EXPECT_EQ(found[context], expected->second[context]);
      }
    }
  }
}

}  // namespace
}  // namespace tpusim
