#include "common/suggest.h"

#include <algorithm>
#include <limits>

namespace tpusim {

int edit_distance(std::string_view a, std::string_view b) {
  std::vector<int> previous(b.size() + 1);
  std::vector<int> current(b.size() + 1);
  for (size_t col = 0; col <= b.size(); ++col) {
    previous[col] = static_cast<int>(col);
  }
  for (size_t row = 1; row <= a.size(); ++row) {
    current[0] = static_cast<int>(row);
    for (size_t col = 1; col <= b.size(); ++col) {
      const int substitution = previous[col - 1] + (a[row - 1] == b[col - 1] ? 0 : 1);
      current[col] = std::min({previous[col] + 1, current[col - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates) {
  if (word.size() > kMaxSuggestedWordBytes) {
    return std::nullopt;
  }
  const int limit = std::max(2, static_cast<int>(word.size()) / 3);
  int best_distance = std::numeric_limits<int>::max();
  std::optional<std::string> best;
  for (const std::string& candidate : candidates) {
    // The length difference is a lower bound of the distance: a candidate that far off cannot be
    // the suggestion, so its quadratic distance is not computed.
    const size_t length_gap = candidate.size() > word.size() ? candidate.size() - word.size()
                                                             : word.size() - candidate.size();
    if (length_gap > static_cast<size_t>(limit)) {
      continue;
    }
    const int distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  if (best_distance > limit) {
    return std::nullopt;
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::optional<std::string> match = closest_match(word, candidates);
  return match ? " (did you mean '" + *match + "'?)" : "";
}

}  // namespace tpusim
