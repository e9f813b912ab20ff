// tests/sim/plan/pareto_front_test.cpp: the Pareto front of two costs (sim/plan/pareto_front.h)
// against the definition checked pair by pair.
#include "sim/plan/pareto_front.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace tpusim {
namespace {

// Written here from the definition, not taken from the code under test.
bool beats(const std::pair<double, double>& a, const std::pair<double, double>& b) {
  return a.first <= b.first && a.second <= b.second && a != b;
}

TEST(ParetoFront, HandExample) {
  // (9, 7) is beaten by (8, 6); the second (10, 5) repeats the first.
  EXPECT_EQ(pareto_front({{10, 5}, {8, 6}, {9, 7}, {10, 5}}), (std::vector<size_t>{1, 0}));
  EXPECT_TRUE(pareto_front({}).empty());
  EXPECT_EQ(pareto_front({{1, 1}}), (std::vector<size_t>{0}));
}

TEST(ParetoFront, RandomPointsAgainstTheDefinition) {
  std::mt19937 random(45);
  std::uniform_int_distribution<int> value(1, 12);  // small range: many ties
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<double, double>> costs(static_cast<size_t>(value(random)));
    for (auto& cost : costs) {
      cost = {value(random), value(random)};
    }
    const std::vector<size_t> front = pareto_front(costs);
    for (size_t index = 0; index < costs.size(); ++index) {
      const bool listed = std::find(front.begin(), front.end(), index) != front.end();
      const bool beaten = std::any_of(costs.begin(), costs.end(), [&](const auto& other) {
        return beats(other, costs[index]);
      });
      const bool repeats_an_earlier =
          std::find(costs.begin(), costs.begin() + index, costs[index]) != costs.begin() + index;
      EXPECT_EQ(listed, !beaten && !repeats_an_earlier) << "trial " << trial << " point " << index;
      EXPECT_EQ(dominates(costs[index], costs[index]), false);
    }
    for (size_t rank = 1; rank < front.size(); ++rank) {
      EXPECT_LT(costs[front[rank - 1]].first, costs[front[rank]].first);
      EXPECT_GT(costs[front[rank - 1]].second, costs[front[rank]].second);
    }
  }
}

}  // namespace
}  // namespace tpusim
