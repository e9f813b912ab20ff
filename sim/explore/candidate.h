// sim/explore/candidate.h: one point of a SearchSpace, as typed values, and the ways to use it.
//
// A candidate is applied to a Config with typed setters (set_int, set_float, ...), the same
// Config that `tpusim estimate` builds its program from; text appears only where a person reads
// it (the `args` line that reproduces the candidate on the command line). Candidates are
// numbered in the space's enumeration order (mesh, batch, remat, placement, attention kind, perf
// variant): the number breaks ties between equal objectives, so rankings do not depend on
// threads, and ranks under mpirun exchange candidates as these numbers.
//
// Example:
//   Candidate candidate = CandidateNumbering(space).candidate(42);
//   Config full = config;
//   apply_candidate(full, space, candidate, CandidateKeys::kWithMesh);
//   estimate_config(full);                  // what explore ranked
//   candidate_overrides(space, candidate);  // {"ici_fsdp_parallelism=16", ..., "attention=flash"}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/explore/search_space.h"

namespace tpusim {

class Config;

struct Candidate {
  MeshShape mesh;
  BatchChoice batch;
  int remat = 0;  // index into SearchSpace::remats
  std::string attention;
  PerfChoice perf;
  int placement = 0;  // index into SearchSpace::placements
  int64_t order = 0;  // position in the space's enumeration (tie-break)
};

// The origin explore's keys carry in a Config (Config::origin).
inline constexpr const char* kExploreOrigin = "explore";

// Which of a candidate's keys apply_candidate sets. The training step and its FLOPs do not
// depend on the mesh (the partitioner takes it as a DeviceMesh), so the explorer's shared steps
// are built without it; a full estimate needs it.
enum class CandidateKeys { kWithoutMesh, kWithMesh };

// Sets the candidate's keys on `config`, typed: every searched key (so the result does not
// depend on the defaults), the batch, the remat policy (and its per-tensor keys), the attention
// kind and its splash blocks.
void apply_candidate(Config& config, const SearchSpace& space, const Candidate& candidate,
                     CandidateKeys keys);
// `config` with the candidate's keys other than the mesh set (see CandidateKeys).
Config candidate_config(const Config& config, const SearchSpace& space, const Candidate& candidate);

// The keys apply_candidate(kWithMesh) sets, as key=value text for the command line, in the same
// order. A number prints with the fewest digits that read back as the same double.
std::vector<std::string> candidate_overrides(const SearchSpace& space, const Candidate& candidate);

// The numbering of a space's candidates, in its enumeration order: mesh, batch, remat, placement,
// then the variant (attention kinds and their perf choices, in the space's order).
class CandidateNumbering {
 public:
  explicit CandidateNumbering(const SearchSpace& space);
  // The candidate's position, from its indices into the space.
  int64_t order(size_t mesh, size_t batch, size_t remat, size_t placement, size_t variant) const;
  // The candidate at position `order` (the inverse of order()).
  Candidate candidate(int64_t order) const;

 private:
  const SearchSpace& space_;
  std::vector<std::vector<PerfChoice>> perf_choices_;  // by attention kind
  int64_t per_placement_ = 0;                          // variants
};

}  // namespace tpusim
