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

// Red-team item 19: the distance is |word| x |candidate| per candidate, and a 2 MB unknown key took
// 171 s before its error. A word over kMaxSuggestedWordBytes gets no suggestion, even a close one.
TEST(RedTeam, Item19_NoSuggestionForAnOverLongWord) {
  const std::string longest(kMaxSuggestedWordBytes, 'k');
  const std::vector<std::string> near = {longest.substr(1), std::string(400, 'k')};
  EXPECT_EQ(closest_match(longest, near), longest.substr(1));  // at the bound: still suggested
  const std::string over(kMaxSuggestedWordBytes + 1, 'k');
  EXPECT_FALSE(closest_match(over, {over.substr(1)}).has_value());
  EXPECT_EQ(did_you_mean(std::string(size_t{2} << 20, 'k'), near), "");
}

}  // namespace
}  // namespace tpusim
