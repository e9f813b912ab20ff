#include "sim/explore/worker_result.h"

#include <algorithm>
#include <cmath>

#include "sim/transport/process_group.h"

namespace tpusim {
namespace {

bool better(const Scored& a, const Scored& b) {
  if (a.objective != b.objective) {
    return a.objective > b.objective;
  }
  return a.candidate.order < b.candidate.order;
}

const std::vector<std::string>& prune_reasons() {
  static const std::vector<std::string> reasons = {kPrunedAxisDoesNotDivide, kPrunedSamePlacement,
                                                   kPrunedWeightsExceedHbm, kPrunedDoesNotFitHbm,
                                                   kPrunedCannotBeatTop};
  return reasons;
}

}  // namespace

double tie_key(double objective) {
  if (objective == 0 || !std::isfinite(objective)) {
    return objective;
  }
  const double scale = std::pow(10.0, 8 - std::floor(std::log10(std::abs(objective))));
  return std::round(objective * scale) / scale;
}

bool cannot_reach(double bound, double threshold) {
  return bound < threshold && tie_key(bound) != tie_key(threshold);
}

void WorkerResult::sample(const ExploreSample& value, size_t limit) {
  if (limit == 0) {
    return;
  }
  ++samples_seen;
  if (samples.size() < limit) {
    samples.push_back(value);
    return;
  }
  random_state ^= random_state << 13;
  random_state ^= random_state >> 7;
  random_state ^= random_state << 17;
  const uint64_t slot = random_state % static_cast<uint64_t>(samples_seen);
  if (slot < limit) {
    samples[slot] = value;
  }
}

void WorkerResult::offer(Scored scored, size_t limit) {
  // Candidates that score the same (tie_key) are one answer for the user: the list keeps the
  // first in the space's order, whatever order they arrive in, and gives its other places to
  // different answers.
  const double key = tie_key(scored.objective);
  const auto tie = std::find_if(
      top.begin(), top.end(), [key](const Scored& kept) { return tie_key(kept.objective) == key; });
  if (tie != top.end()) {
    if (scored.candidate.order >= tie->candidate.order) {
      return;
    }
    top.erase(tie);
  }
  if (top.size() == limit && !better(scored, top.back())) {
    return;
  }
  top.insert(std::upper_bound(top.begin(), top.end(), scored, better), std::move(scored));
  if (top.size() > limit) {
    top.pop_back();
  }
}

void WorkerResult::merge(WorkerResult other, size_t limit) {
  evaluated += other.evaluated;
  programs += other.programs;
  smallest_peak = std::min(smallest_peak, other.smallest_peak);
  capacity = std::max(capacity, other.capacity);
  for (const auto& [reason, count] : other.pruned) {
    pruned[reason] += count;
  }
  for (Scored& scored : other.top) {
    offer(std::move(scored), limit);
  }
  samples.insert(samples.end(), other.samples.begin(), other.samples.end());
  samples_seen += other.samples_seen;
}

WorkerResult merge_ranks(const WorkerResult& mine, ProcessGroup& processes,
                         const CandidateNumbering& numbering, size_t top) {
  std::vector<double> encoded = {static_cast<double>(mine.evaluated),
                                 static_cast<double>(mine.programs), mine.smallest_peak,
                                 mine.capacity};
  for (const std::string& reason : prune_reasons()) {
    const auto found = mine.pruned.find(reason);
    encoded.push_back(found == mine.pruned.end() ? 0.0 : static_cast<double>(found->second));
  }
  for (const Scored& scored : mine.top) {
    encoded.push_back(static_cast<double>(scored.candidate.order));
    encoded.push_back(scored.objective);
  }
  WorkerResult merged;
  for (const std::vector<double>& theirs : processes.all_gather(encoded)) {
    size_t at = 0;
    merged.evaluated += static_cast<int64_t>(theirs[at++]);
    merged.programs += static_cast<int64_t>(theirs[at++]);
    merged.smallest_peak = std::min(merged.smallest_peak, theirs[at++]);
    merged.capacity = std::max(merged.capacity, theirs[at++]);
    for (const std::string& reason : prune_reasons()) {
      const auto count = static_cast<int64_t>(theirs[at++]);
      if (count > 0) {
        merged.pruned[reason] += count;
      }
    }
    for (; at + 1 < theirs.size(); at += 2) {
      Scored scored;
      scored.candidate = numbering.candidate(static_cast<int64_t>(theirs[at]));
      scored.objective = theirs[at + 1];
      merged.offer(std::move(scored), top);
    }
  }
  return merged;
}

}  // namespace tpusim
