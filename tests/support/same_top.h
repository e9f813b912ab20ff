// tests/support/same_top.h: explore's skips must not change its result. Two searches of one
// config, with a skip (`with`) and without it, list the same top N (arguments and step times), and
// `with`'s is the top N of a search with no bar at all (`unbounded`).
//
// Example:
//   ExploreOptions options;
//   options.batch_classes = false;
//   const ExploreResult unbounded = testing::explore_top3(config, -1e300, options);
//   const ExploreResult without = testing::explore_top3(config,
//   testing::bar_under_third(unbounded),
//                                                       options);
//   testing::expect_same_top(with_classes, without, unbounded);
#pragma once

#include <gtest/gtest.h>

#include "sim/explore/explorer.h"

namespace tpusim::testing {

// The top 3 by tokens/s/chip above `bar` (-1e300: no bar), with the caller's other options.
inline ExploreResult explore_top3(const Config& config, double bar, ExploreOptions options) {
  options.objective = ExploreObjective::kTokensPerSecondPerChip;
  options.top = 3;
  options.initial_bar = bar;
  return explore(config, options);
}

// A bar just under the third best of a search with none: the top 3 stays above it, most batches
// are bounded out.
inline double bar_under_third(const ExploreResult& unbounded) {
  return unbounded.top.back().objective * (1 - 1e-9);
}

inline void expect_same_top(const ExploreResult& with, const ExploreResult& without,
                            const ExploreResult& unbounded) {
  ASSERT_EQ(with.top.size(), without.top.size());
  for (size_t index = 0; index < with.top.size(); ++index) {
    EXPECT_EQ(with.top[index].args, without.top[index].args) << index;
    EXPECT_EQ(with.top[index].step_time_s, without.top[index].step_time_s) << index;
    EXPECT_EQ(with.top[index].args, unbounded.top[index].args) << index;
  }
}

}  // namespace tpusim::testing
