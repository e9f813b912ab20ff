// tests/support/same_top.h: explore's skips must not change its result. Two searches of one
// config, with a skip (`with`) and without it, list the same top N (arguments and step times), and
// `with`'s is the top N of a search with no bar at all (`unbounded`).
//
// Example:
//   testing::expect_same_top(with_classes, without_classes, unbounded);
#pragma once

#include <gtest/gtest.h>

#include "sim/explore/explorer.h"

namespace tpusim::testing {

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
