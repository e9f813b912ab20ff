// ClassBounds (sim/explore/class_bounds.h): the store of region seconds the explorer bounds
// batches from. Seconds come back only when every region's key is known, per cost context and
// region as offered; a key offered twice with other seconds throws in check mode.
#include "sim/explore/class_bounds.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tpusim {
namespace {

using Keys = std::vector<std::vector<int64_t>>;
using Seconds = std::vector<std::vector<double>>;  // [context][region]

TEST(ClassBounds, GivesEveryRegionsSecondsOnlyWhenEachRegionIsKnown) {
  ClassBounds kept(false);
  kept.offer({{1, 0}, {1, 1}}, Seconds{{2.0, 3.0}, {4.0, 5.0}}, 0);
  const std::optional<ClassSeconds> same = kept.find({{1, 0}, {1, 1}}, 0);
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->region_seconds, (Seconds{{2.0, 3.0}, {4.0, 5.0}}));
  EXPECT_FALSE(same->other_schedule);
  // Region 1 of this batch has a key no program had: no bound.
  EXPECT_FALSE(kept.find({{1, 0}, {1, 1, 7, 2}}, 0).has_value());
  // Regions of two programs make one bound; one of them from another schedule is reported.
  kept.offer({{1, 0, 7, 2}, {1, 1, 7, 2}}, Seconds{{6.0, 7.0}, {8.0, 9.0}}, 1);
  const std::optional<ClassSeconds> mixed = kept.find({{1, 0}, {1, 1, 7, 2}}, 0);
  ASSERT_TRUE(mixed.has_value());
  EXPECT_EQ(mixed->region_seconds, (Seconds{{2.0, 7.0}, {4.0, 9.0}}));
  EXPECT_TRUE(mixed->other_schedule);
}

TEST(ClassBounds, SecondsOfAnotherContextCountGiveNoBound) {
  ClassBounds kept(false);
  kept.offer({{1, 0}}, Seconds{{2.0}, {4.0}}, 0);
  kept.offer({{2, 0}}, Seconds{{3.0}}, 0);
  EXPECT_FALSE(kept.find({{1, 0}, {2, 0}}, 0).has_value());
}

TEST(ClassBounds, CheckModeThrowsWhenOneKeyGetsOtherSeconds) {
  ClassBounds checked(true);
  checked.offer({{1, 0}}, Seconds{{2.0}}, 0);
  EXPECT_NO_THROW(checked.offer({{1, 0}}, Seconds{{2.0}}, 1));
  EXPECT_THROW(checked.offer({{1, 0}}, Seconds{{2.0 + 1e-12}}, 1), std::logic_error);
  ClassBounds unchecked(false);
  unchecked.offer({{1, 0}}, Seconds{{2.0}}, 0);
  EXPECT_NO_THROW(unchecked.offer({{1, 0}}, Seconds{{9.0}}, 0));
  EXPECT_EQ(unchecked.find({{1, 0}}, 0)->region_seconds, (Seconds{{2.0}}));  // the first kept
}

}  // namespace
}  // namespace tpusim
