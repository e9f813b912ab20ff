// PrunedTally (sim/explore/worker_result.h): counts by reason index, added to the pruned map by
// name; a reason reached by 0 gets its entry as `pruned[name] += 0` does, one never reached none.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "sim/explore/worker_result.h"

namespace tpusim {
namespace {

TEST(PrunedTally, FlushAddsEachReachedReasonByNameOnce) {
  std::map<std::string, int64_t> pruned{{kPrunedDoesNotFitHbm, 5}};
  PrunedTally tally;
  tally[PrunedReason::kDoesNotFitHbm] += 3;
  tally[PrunedReason::kDoesNotFitHbm] += 4;
  tally[PrunedReason::kCannotBeatTop] += 0;  // reached: its entry appears with 0
  tally.flush(pruned);
  const std::map<std::string, int64_t> expected{{kPrunedDoesNotFitHbm, 12},
                                                {kPrunedCannotBeatTop, 0}};
  EXPECT_EQ(pruned, expected);
  // Flushed: a second flush adds nothing and creates no entry.
  tally.flush(pruned);
  EXPECT_EQ(pruned, expected);
  tally[PrunedReason::kAxisDoesNotDivide] += 2;
  tally[PrunedReason::kSamePlacement] += 1;
  tally[PrunedReason::kWeightsExceedHbm] += 9;
  tally.flush(pruned);
  EXPECT_EQ(pruned[kPrunedAxisDoesNotDivide], 2);
  EXPECT_EQ(pruned[kPrunedSamePlacement], 1);
  EXPECT_EQ(pruned[kPrunedWeightsExceedHbm], 9);
  EXPECT_EQ(pruned[kPrunedDoesNotFitHbm], 12);
}

}  // namespace
}  // namespace tpusim
