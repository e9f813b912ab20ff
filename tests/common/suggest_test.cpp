#include "common/suggest.h"

#include <gtest/gtest.h>

namespace tpusim {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0);
  EXPECT_EQ(edit_distance("abc", "abc"), 0);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
}

TEST(ClosestMatch, FindsPlausibleTypoOnly) {
  const std::vector<std::string> keys = {"ici_fsdp_parallelism", "ici_data_parallelism",
                                         "remat_policy"};
  EXPECT_EQ(closest_match("ici_fsdp_paralelism", keys), "ici_fsdp_parallelism");
  EXPECT_EQ(closest_match("remat_polcy", keys), "remat_policy");
  EXPECT_FALSE(closest_match("completely_unrelated", keys).has_value());
  EXPECT_EQ(did_you_mean("remat_polcy", keys), " (did you mean 'remat_policy'?)");
  EXPECT_EQ(did_you_mean("zzzzzzzzzzzz", keys), "");
}

}  // namespace
}  // namespace tpusim
