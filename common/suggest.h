// common/suggest.h: "did you mean" suggestions for misspelled keys and names.
//
// Example:
//   closest_match("ici_fsdp_paralelism", all_keys)  -> "ici_fsdp_parallelism"
//   did_you_mean("v5q-128", {"v5p", "v5e"})          -> " (did you mean 'v5p'?)" or ""
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

// Levenshtein edit distance between two strings.
int edit_distance(std::string_view a, std::string_view b);

// No suggestion is computed for a word longer than this many bytes: the distance costs
// |word| x |candidate| per candidate, and a 2 MB unknown key took 171 s against the config's keys.
// No key, slice or model name is near this long, so no real typo loses its suggestion.
inline constexpr size_t kMaxSuggestedWordBytes = 256;

// The candidate closest to `word`, if it is close enough to be a plausible typo
// (distance <= max(2, |word|/3)); none for a word over kMaxSuggestedWordBytes.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" for the closest plausible candidate, or "" when none is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace tpusim
