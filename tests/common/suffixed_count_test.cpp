// tests/common/suffixed_count_test.cpp: counts with K/M/G/T suffixes (common/suffixed_count.h).
#include "common/suffixed_count.h"

#include <gtest/gtest.h>

namespace tpusim {
namespace {

TEST(SuffixedCount, ReadsNumbersAndTheirSuffixes) {
  EXPECT_EQ(parse_suffixed_count("2e12", "KMGT"), 2e12);
  EXPECT_EQ(parse_suffixed_count("1.5T", "KMGT"), 1.5e12);
  EXPECT_EQ(parse_suffixed_count("4m", "KMG"), 4e6);  // either case
  EXPECT_EQ(parse_suffixed_count("65536", "KMG"), 65536);
  EXPECT_EQ(parse_suffixed_count("-3K", "KMG"), -3000);  // the sign is the caller's to check
}

TEST(SuffixedCount, TheWholeTextMustBeTheNumber) {
  for (const char* text : {"", " 5", "5 ", "+5", "5x", "5KK", "0x10", "1e999", "inf", "nan", "M"}) {
    EXPECT_EQ(parse_suffixed_count(text, "KMGT"), std::nullopt) << "'" << text << "'";
  }
  EXPECT_EQ(parse_suffixed_count("3T", "KMG"), std::nullopt);  // T not allowed there
}

}  // namespace
}  // namespace tpusim
