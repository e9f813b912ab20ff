// The forward ops' seconds table of the explorer's remat bounds (sim/explore/forward_op_seconds.h)
// against a std::map built the way tensorcore_lower_bounds built it before: the same seconds for
// every (region, name), the least of a name seen twice, and no entry for one never added.
#include "sim/explore/forward_op_seconds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
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

// A table made like a finished one, from the same regions and names in the same order with other
// seconds (and another number of contexts), equals the table finished from those adds, and one
// with another number of adds is refused.
TEST(ForwardOpSeconds, ATableMadeLikeAnotherFinishesAsItsOwnAdds) {
  std::mt19937 random(46);
  const std::vector<std::string> names = {"a", "ab", "layers/mlp/wi_0", "layers/mlp/wo", ""};
  constexpr int kAdds = 100;
  std::vector<std::pair<int, std::string>> adds;
  adds.reserve(kAdds);
  for (int op = 0; op < kAdds; ++op) {
    adds.emplace_back(static_cast<int>(random() % 3), names[random() % names.size()]);
  }
  auto seconds_of = [&](size_t contexts) {
    std::vector<double> seconds(adds.size() * contexts);
    for (double& value : seconds) {
      value = static_cast<double>(random() % 1000) * 1e-6;
    }
    return seconds;
  };
  ForwardOpSeconds layout(1);
  const std::vector<double> first = seconds_of(1);
  for (size_t at = 0; at < adds.size(); ++at) {
    layout.add(adds[at].first, adds[at].second, &first[at]);
  }
  layout.finish();
  constexpr size_t kContexts = 2;
  const std::vector<double> other = seconds_of(kContexts);
  ForwardOpSeconds own(kContexts);
  ForwardOpSeconds like(kContexts, &layout);
  for (size_t at = 0; at < adds.size(); ++at) {
    own.add(adds[at].first, adds[at].second, &other[at * kContexts]);
    like.add(adds[at].first, "", &other[at * kContexts]);  // its names are the layout's
  }
  own.finish();
  like.finish();
  ASSERT_EQ(like.size(), own.size());
  for (int region = 0; region < 3; ++region) {
    for (const std::string& name : names) {
      const double* a = like.find(region, name);
      const double* b = own.find(region, name);
      ASSERT_EQ(a == nullptr, b == nullptr) << region << " " << name;
      for (size_t context = 0; a != nullptr && context < kContexts; ++context) {
        EXPECT_EQ(a[context], b[context]) << region << " " << name;
      }
    }
  }
  ForwardOpSeconds short_of(1, &layout);
  short_of.add(0, "a", first.data());
  EXPECT_THROW(short_of.finish(), std::logic_error);
}

}  // namespace
}  // namespace tpusim
