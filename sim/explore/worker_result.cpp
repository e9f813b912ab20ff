#include "sim/explore/worker_result.h"

#include <algorithm>
#include <cmath>

#include "sim/transport/process_group.h"

namespace tpusim {
namespace {

// Ranks by the objective to 9 digits, then the space's order: of candidates that score the same
// for the user the first in the space's order wins, whatever order they arrive in.
bool better(const Scored& a, const Scored& b) {
  const double key_a = tie_key(a.objective);
  const double key_b = tie_key(b.objective);
  if (key_a != key_b) {
    return key_a > key_b;
  }
  return a.candidate.order < b.candidate.order;
}

// One answer for the user: the same program, or (without signatures) the same score.
bool same_answer(const Scored& a, const Scored& b) {
  if (a.program != 0 && b.program != 0) {
    return a.program == b.program;
  }
  return tie_key(a.objective) == tie_key(b.objective);
}

bool same_spelling(const Candidate& a, const Candidate& b) {
  return a.mesh.ici == b.mesh.ici && a.mesh.dcn == b.mesh.dcn &&
         a.batch.per_device_batch_size == b.batch.per_device_batch_size &&
         a.batch.accumulation_steps == b.batch.accumulation_steps && a.remat == b.remat;
}

// Adds `candidate` to `kept`'s other spellings unless it is kept's own or already listed.
void add_spelling(Scored& kept, const Candidate& candidate) {
  if (kept.spellings.size() >= kMaxSpellings || same_spelling(kept.candidate, candidate)) {
    return;
  }
  for (const Candidate& listed : kept.spellings) {
    if (same_spelling(listed, candidate)) {
      return;
    }
  }
  kept.spellings.push_back(candidate);
}

// The better of two entries of one answer, with the other's spellings.
void absorb(Scored& winner, const Scored& loser) {
  add_spelling(winner, loser.candidate);
  for (const Candidate& spelling : loser.spellings) {
    add_spelling(winner, spelling);
  }
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
  // tie_key moves a value by less than 1e-7 of it (9 significant digits, or 8 should log10 land
  // one decade off), so a bound below the threshold by more than 1e-6 of it keeps a tie key of
  // its own: true without the two keys' pow and log10 (most calls, the pruned ones). Where a key
  // is not a number (a threshold under 1e-300) the keys differ too, as the full test says.
  constexpr double kFarBelow = 1.0 - 1e-6;
  if (threshold > 0 && bound < threshold * kFarBelow) {
    return true;
  }
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

bool WorkerResult::would_enter(const Scored& scored, size_t limit) const {
  return top.size() < limit || better(scored, top.back());
}

void WorkerResult::offer(Scored scored, size_t limit) {
  // One entry per answer (same_answer): the better candidate stays, with the other's spellings,
  // and the other places go to different answers.
  const auto same = std::find_if(top.begin(), top.end(),
                                 [&](const Scored& kept) { return same_answer(kept, scored); });
  if (same != top.end()) {
    if (!better(scored, *same)) {
      absorb(*same, scored);
      return;
    }
    absorb(scored, *same);
    top.erase(same);
  }
  if (top.size() == limit && !better(scored, top.back())) {
    return;
  }
  top.insert(std::upper_bound(top.begin(), top.end(), scored, better), std::move(scored));
  if (top.size() > limit) {
    top.pop_back();
  }
}

void PrunedTally::flush(std::map<std::string, int64_t>& pruned) {
  static constexpr std::array<const char*, kPrunedReasons> kNames = {
      kPrunedAxisDoesNotDivide, kPrunedSamePlacement, kPrunedWeightsExceedHbm, kPrunedDoesNotFitHbm,
      kPrunedCannotBeatTop};
  for (size_t reason = 0; reason < kPrunedReasons; ++reason) {
    if (reached_[reason]) {
      pruned[kNames[reason]] += counts_[reason];
    }
  }
  counts_ = {};
  reached_ = {};
}

void WorkerResult::merge(WorkerResult other, size_t limit) {
  evaluated += other.evaluated;
  programs += other.programs;
  smallest_peak = std::min(smallest_peak, other.smallest_peak);
  capacity = std::max(capacity, other.capacity);
  phases.add(other.phases);
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
  const std::vector<double> phases = mine.phases.as_numbers();
  encoded.insert(encoded.end(), phases.begin(), phases.end());
  for (const std::string& reason : prune_reasons()) {
    const auto found = mine.pruned.find(reason);
    encoded.push_back(found == mine.pruned.end() ? 0.0 : static_cast<double>(found->second));
  }
  for (const Scored& scored : mine.top) {
    encoded.push_back(static_cast<double>(scored.candidate.order));
    encoded.push_back(scored.objective);
    encoded.push_back(static_cast<double>(scored.program));  // < 2^52: exact
  }
  WorkerResult merged;
  for (const std::vector<double>& theirs : processes.all_gather(encoded)) {
    size_t at = 0;
    merged.evaluated += static_cast<int64_t>(theirs[at++]);
    merged.programs += static_cast<int64_t>(theirs[at++]);
    merged.smallest_peak = std::min(merged.smallest_peak, theirs[at++]);
    merged.capacity = std::max(merged.capacity, theirs[at++]);
    const size_t phase_count = ExplorePhases().as_numbers().size();
    merged.phases.add(ExplorePhases::from_numbers(
        std::vector<double>(theirs.begin() + static_cast<std::ptrdiff_t>(at),
                            theirs.begin() + static_cast<std::ptrdiff_t>(at + phase_count))));
    at += phase_count;
    for (const std::string& reason : prune_reasons()) {
      const auto count = static_cast<int64_t>(theirs[at++]);
      if (count > 0) {
        merged.pruned[reason] += count;
      }
    }
    for (; at + 2 < theirs.size(); at += 3) {
      Scored scored;
      scored.candidate = numbering.candidate(static_cast<int64_t>(theirs[at]));
      scored.objective = theirs[at + 1];
      scored.program = static_cast<uint64_t>(theirs[at + 2]);
      merged.offer(std::move(scored), top);
    }
  }
  return merged;
}

}  // namespace tpusim
