// common/suggest.h: "did you mean" suggestions for misspelled keys and names.
//
// Example:
//   closest_match("ici_fsdp_paralelism", all_keys)  -> "ici_fsdp_parallelism"
//   did_you_mean("v5q-128", {"v5p", "v5e"})          -> " (did you mean 'v5p'?)" or ""
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

// Levenshtein edit distance between two strings.
int edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, if it is close enough to be a plausible typo
// (distance <= max(2, |word|/3)).
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" for the closest plausible candidate, or "" when none is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace tpusim
