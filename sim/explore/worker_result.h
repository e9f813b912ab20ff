// sim/explore/worker_result.h: what part of an explore search found (one worker thread's meshes,
// or one rank's), and how the parts merge into the search's result.
//
// A part keeps its best N answers: one entry per per-device program (program_signature.h; the
// candidates of one program differ only in placement and timing switches, or spell the same
// program with other mesh axes), the best of them, with the other spellings it saw. Entries rank
// by the objective to 9 digits (tie_key), then the space's order, so the merged top N does not
// depend on how the meshes were split. Candidates without a signature (0) are one entry per
// tie_key, the first in the space's order. It also counts what it evaluated and pruned by reason
// (the kPruned* names of sim/explore/explorer.h), the time its phases took, and keeps a uniform
// sample of what it evaluated for plots.
//
// Example:
//   WorkerResult part;
//   part.offer({candidate, /*objective=*/0.41}, /*limit=*/10);
//   part.pruned[kPrunedDoesNotFitHbm] += 8;
//   WorkerResult all;
//   all.merge(std::move(part), 10);
//   all = merge_ranks(all, processes, CandidateNumbering(space), 10);  // under mpirun
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "sim/explore/candidate.h"
#include "sim/explore/explorer.h"

namespace tpusim {

class ProcessGroup;

// Why a candidate was not timed (see sim/explore/explorer.h).
inline constexpr const char* kPrunedAxisDoesNotDivide = "axis_does_not_divide";
inline constexpr const char* kPrunedSamePlacement = "same_placement";
inline constexpr const char* kPrunedWeightsExceedHbm = "weights_exceed_hbm";
inline constexpr const char* kPrunedDoesNotFitHbm = "does_not_fit_hbm";
inline constexpr const char* kPrunedCannotBeatTop = "cannot_beat_top";

// The same reasons as indices, for counting per candidate pair without a lookup by name.
enum class PrunedReason : size_t {
  kAxisDoesNotDivide,
  kSamePlacement,
  kWeightsExceedHbm,
  kDoesNotFitHbm,
  kCannotBeatTop,
};
inline constexpr size_t kPrunedReasons = 5;

// Counts by reason, added to a WorkerResult's `pruned` map at the end of a unit of work (the
// explorer counts several million times per search; a lookup by string each time cost 4% of a
// bounded-out multislice search). A reason reached, even by 0, gets its entry, as
// `pruned[name] += 0` would give it.
//
// Example:
//   PrunedTally tally;
//   tally[PrunedReason::kDoesNotFitHbm] += 8;
//   tally.flush(part.pruned);  // part.pruned["does_not_fit_hbm"] += 8; tally is empty again
class PrunedTally {
 public:
  int64_t& operator[](PrunedReason reason) {
    const auto index = static_cast<size_t>(reason);
    reached_[index] = true;
    return counts_[index];
  }
  int64_t count(PrunedReason reason) const { return counts_[static_cast<size_t>(reason)]; }
  void flush(std::map<std::string, int64_t>& pruned);

 private:
  std::array<int64_t, kPrunedReasons> counts_{};
  std::array<bool, kPrunedReasons> reached_{};
};

// The objective to 9 significant digits: candidates that share it score the same for the user
// (e.g. the same devices split as fsdp=128 or fsdp=64 x fsdp_transpose=2) and are one entry.
double tie_key(double objective);

// True when a candidate whose objective is at most `bound` cannot enter a top N whose last entry
// scores `threshold`: below it, and not tied with it (a tie may still replace that entry).
bool cannot_reach(double bound, double threshold);

// A timed candidate and its objective (larger is better).
struct Scored {
  Candidate candidate;
  double objective = 0;
  uint64_t program = 0;  // program_signature; 0: not known (one entry per tie_key)
  // Other candidates of the same program with another mesh, batch split or remat policy (at most
  // kMaxSpellings), not timed better than this one.
  std::vector<Candidate> spellings;
};

inline constexpr size_t kMaxSpellings = 8;

struct WorkerResult {
  std::vector<Scored> top;  // kept sorted best first, at most N
  int64_t evaluated = 0;
  int64_t programs = 0;
  std::map<std::string, int64_t> pruned;
  // MeshEvaluator's counts, not yet in `pruned` (empty between its units of work).
  PrunedTally tally;
  double smallest_peak = std::numeric_limits<double>::infinity();
  double capacity = 0;
  ExplorePhases phases;
  // A uniform sample of what was evaluated (reservoir sampling, a fixed seed per worker).
  std::vector<ExploreSample> samples;
  int64_t samples_seen = 0;
  uint64_t random_state = 0x9E3779B97F4A7C15ULL;

  // Keeps `value` in the sample with the probability that keeps the sample uniform.
  void sample(const ExploreSample& value, size_t limit);
  // True when `scored` would enter the best `limit` so far (else offer() would at most list it
  // as another spelling of an entry).
  bool would_enter(const Scored& scored, size_t limit) const;
  // Keeps `scored` if it is among the best `limit` so far.
  void offer(Scored scored, size_t limit);
  // Adds another part's counts, samples and top (keeping the best `limit`).
  void merge(WorkerResult other, size_t limit);
};

// Merges every rank's counts, phase times and top N (exchanged as numbers: counts, then
// (order, objective, program) triples, from which each candidate is rebuilt); every rank gets the
// same merged result, without samples or other spellings.
WorkerResult merge_ranks(const WorkerResult& mine, ProcessGroup& processes,
                         const CandidateNumbering& numbering, size_t top);

}  // namespace tpusim
