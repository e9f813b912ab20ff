// tests/sim/train/generator_test.cpp: the next-token choice of `tpusim generate`
// (sim/train/generator.h): greedy ties, top-k, the seed, and the sampled frequencies.
#include "sim/train/generator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

namespace tpusim {
namespace {

TEST(ChooseToken, GreedyTakesTheLowestIdAmongEqualLogits) {
  std::mt19937_64 random(0);
  const std::mt19937_64 untouched = random;
  EXPECT_EQ(choose_token({0.5f, 2.0f, -1.0f, 2.0f}, {}, random), 1);
  EXPECT_EQ(random, untouched);  // greedy draws nothing
}

TEST(ChooseToken, TopKOneIsGreedyAtAnyTemperature) {
  std::mt19937_64 random(3);
  const GenerateOptions options{.temperature = 5.0, .top_k = 1};
  for (int draw = 0; draw < 50; ++draw) {
    EXPECT_EQ(choose_token({0.1f, 0.3f, 0.2f}, options, random), 1);
  }
}

TEST(ChooseToken, SamplesWithinTopKAtSoftmaxFrequencies) {
  // Logits 0 and log 3 (and a third below the top 2): p = 1/4 and 3/4 at temperature 1.
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(3.0)), -0.5f};
  const GenerateOptions options{.temperature = 1.0, .top_k = 2};
  std::mt19937_64 random(7);
  constexpr int kDraws = 20000;
  int second = 0;
  for (int draw = 0; draw < kDraws; ++draw) {
    const int32_t id = choose_token(logits, options, random);
    ASSERT_NE(id, 2);  // outside the top 2
    second += id == 1 ? 1 : 0;
  }
  // Binomial standard deviation sqrt(0.75 0.25 / 20000) = 0.0031: 5 of them.
  EXPECT_NEAR(static_cast<double>(second) / kDraws, 0.75, 0.016);
}

TEST(ChooseToken, TheSeedFixesTheDraws) {
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  const GenerateOptions options{.temperature = 2.0};
  const auto draws = [&](uint64_t seed) {
    std::mt19937_64 random(seed);
    std::vector<int32_t> ids;
    for (int draw = 0; draw < 64; ++draw) {
      ids.push_back(choose_token(logits, options, random));
    }
    return ids;
  };
  EXPECT_EQ(draws(11), draws(11));
  EXPECT_NE(draws(11), draws(12));
  const std::vector<int32_t> ids = draws(11);
  EXPECT_GT(std::set<int32_t>(ids.begin(), ids.end()).size(), 3u);  // it does sample
}

}  // namespace
}  // namespace tpusim
