#include "sim/explore/candidate.h"

#include <algorithm>
#include <charconv>
#include <system_error>
#include <utility>
#include <variant>

#include "model/config.h"

namespace tpusim {
namespace {

// The shortest text that reads back as `value` (0.5, 0.005859375, 6.103515625e-05).
std::string round_trip_text(double value) {
  char buffer[32];
  const std::to_chars_result written = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, written.ptr);
}

bool searched(const SearchSpace& space, const std::string& key) {
  return std::find(space.searched_keys.begin(), space.searched_keys.end(), key) !=
         space.searched_keys.end();
}

// One key of a candidate, typed, with its command-line text.
struct CandidateKey {
  std::string key;
  std::variant<int64_t, double, bool, std::string> value;

  void apply(Config& config) const {
    if (const auto* number = std::get_if<int64_t>(&value)) {
      config.set_int(key, *number, kExploreOrigin);
    } else if (const auto* real = std::get_if<double>(&value)) {
      config.set_float(key, *real, kExploreOrigin);
    } else if (const auto* flag = std::get_if<bool>(&value)) {
      config.set_bool(key, *flag, kExploreOrigin);
    } else {
      config.set_string(key, std::get<std::string>(value), kExploreOrigin);
    }
  }

  std::string text() const {
    if (const auto* number = std::get_if<int64_t>(&value)) {
      return key + "=" + std::to_string(*number);
    }
    if (const auto* real = std::get_if<double>(&value)) {
      return key + "=" + round_trip_text(*real);
    }
    if (const auto* flag = std::get_if<bool>(&value)) {
      return key + "=" + (*flag ? "true" : "false");
    }
    return key + "=" + std::get<std::string>(value);
  }
};

// The candidate's keys, in command-line order: the mesh (when asked for), then the rest.
std::vector<CandidateKey> candidate_keys(const SearchSpace& space, const Candidate& candidate,
                                         CandidateKeys which) {
  std::vector<CandidateKey> keys;
  if (which == CandidateKeys::kWithMesh) {
    for (const int axis : space.ici_axes) {
      const auto index = static_cast<size_t>(axis);
      keys.push_back(
          {mesh_axis_key(false, mesh_axis_names()[index]), int64_t{candidate.mesh.ici[index]}});
    }
    for (const int axis : space.dcn_axes) {
      const auto index = static_cast<size_t>(axis);
      keys.push_back(
          {mesh_axis_key(true, mesh_axis_names()[index]), int64_t{candidate.mesh.dcn[index]}});
    }
  }
  keys.push_back({"per_device_batch_size", candidate.batch.per_device_batch_size});
  keys.push_back({"gradient_accumulation_steps", candidate.batch.accumulation_steps});
  const RematChoice& remat = space.remats[static_cast<size_t>(candidate.remat)];
  keys.push_back({"remat_policy", remat.policy});
  for (const auto& [key, value] : remat.tensors) {
    keys.push_back({key, value});
  }
  keys.push_back({"attention", candidate.attention});
  if (candidate.perf.block_q > 0) {
    keys.push_back({"sa_block_q", candidate.perf.block_q});
    keys.push_back({"sa_block_kv", candidate.perf.block_kv});
  }
  if (searched(space, "sparse_core_collective_offload")) {
    keys.push_back({"sparse_core_collective_offload", candidate.perf.sparse_core_offload});
  }
  if (searched(space, "collective_matmul")) {
    keys.push_back({"collective_matmul", candidate.perf.collective_matmul});
  }
  if (searched(space, "mesh_placement_first")) {
    keys.push_back(
        {"mesh_placement_first", space.placement_text(static_cast<size_t>(candidate.placement))});
  }
  return keys;
}

}  // namespace

void apply_candidate(Config& config, const SearchSpace& space, const Candidate& candidate,
                     CandidateKeys keys) {
  for (const CandidateKey& key : candidate_keys(space, candidate, keys)) {
    key.apply(config);
  }
}

Config candidate_config(const Config& config, const SearchSpace& space,
                        const Candidate& candidate) {
  Config result = config;
  apply_candidate(result, space, candidate, CandidateKeys::kWithoutMesh);
  return result;
}

std::vector<std::string> candidate_overrides(const SearchSpace& space, const Candidate& candidate) {
  std::vector<std::string> overrides;
  for (const CandidateKey& key : candidate_keys(space, candidate, CandidateKeys::kWithMesh)) {
    overrides.push_back(key.text());
  }
  return overrides;
}

CandidateNumbering::CandidateNumbering(const SearchSpace& space) : space_(space) {
  for (const std::string& kind : space.attention_kinds) {
    perf_choices_.push_back(space.perf_choices(kind));
    per_placement_ += static_cast<int64_t>(perf_choices_.back().size());
  }
}

int64_t CandidateNumbering::order(size_t mesh, size_t batch, size_t remat, size_t placement,
                                  size_t variant) const {
  const auto batches = static_cast<int64_t>(space_.batches.size());
  const auto remats = static_cast<int64_t>(space_.remats.size());
  const auto placements = static_cast<int64_t>(space_.placements.size());
  return (((static_cast<int64_t>(mesh) * batches + static_cast<int64_t>(batch)) * remats +
           static_cast<int64_t>(remat)) *
              placements +
          static_cast<int64_t>(placement)) *
             per_placement_ +
         static_cast<int64_t>(variant);
}

Candidate CandidateNumbering::candidate(int64_t order) const {
  const auto placements = static_cast<int64_t>(space_.placements.size());
  const auto remats = static_cast<int64_t>(space_.remats.size());
  const auto batches = static_cast<int64_t>(space_.batches.size());
  Candidate candidate;
  candidate.order = order;
  int64_t within = order % per_placement_;
  int64_t rest = order / per_placement_;
  candidate.placement = static_cast<int>(rest % placements);
  rest /= placements;
  candidate.remat = static_cast<int>(rest % remats);
  rest /= remats;
  candidate.batch = space_.batches[static_cast<size_t>(rest % batches)];
  candidate.mesh = space_.meshes[static_cast<size_t>(rest / batches)];
  for (size_t kind = 0; kind < perf_choices_.size(); ++kind) {
    const auto count = static_cast<int64_t>(perf_choices_[kind].size());
    if (within < count) {
      candidate.attention = space_.attention_kinds[kind];
      candidate.perf = perf_choices_[kind][static_cast<size_t>(within)];
      break;
    }
    within -= count;
  }
  return candidate;
}

}  // namespace tpusim
