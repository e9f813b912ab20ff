// common/suffixed_count.h: a count written with an optional K, M, G or T suffix (powers of 1000),
// as command-line options write token budgets and batch sizes.
//
// The whole text must be the number: no leading or trailing spaces, no sign other than '-', no
// hex; the caller checks the sign. nullopt when the text is not such a number or not finite.
//
// Example:
//   parse_suffixed_count("1.5T", "KMGT");   // 1.5e12
//   parse_suffixed_count("4M", "KMG");      // 4e6
//   parse_suffixed_count("2e12", "KMGT");   // 2e12
//   parse_suffixed_count(" 5", "KMGT");     // nullopt
//   parse_suffixed_count("3T", "KMG");      // nullopt: T is not allowed here
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tpusim {

// `suffixes`: the suffix letters allowed (upper case; the text may use either case).
std::optional<double> parse_suffixed_count(const std::string& text, std::string_view suffixes);

}  // namespace tpusim
