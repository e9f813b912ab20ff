#include "sim/plan/slice_candidates.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/suggest.h"
#include "hw/slice.h"

namespace tpusim {
namespace {

// Every legal size: example_slice_names lists one name per size when given room for all.
constexpr int kAllSliceSizes = 64;

SliceCandidate candidate_for(const HardwareKind& kind, const std::string& name, int num_slices) {
  const Slice slice = parse_slice(name, num_slices);
  SliceCandidate candidate;
  candidate.kind = kind;
  candidate.slice_name = name;
  candidate.num_slices = num_slices;
  candidate.chips = slice.total_chips();
  candidate.devices = slice.total_devices();
  return candidate;
}

// The slice name of `kind` spelled with its user-given prefix ("ironwood-256" stays ironwood).
std::string with_prefix(const HardwareKind& kind, const std::string& name) {
  const size_t dash = name.rfind('-');
  return dash == std::string::npos ? kind.name : kind.name + name.substr(dash);
}

}  // namespace

std::string SliceCandidate::label() const {
  return num_slices == 1 ? slice_name : slice_name + " x " + std::to_string(num_slices);
}

std::vector<HardwareKind> parse_hardware_kinds(const std::string& list,
                                               const HardwareCatalog& catalog) {
  std::vector<HardwareKind> kinds;
  std::istringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    if (name.empty()) {
      throw UserError("--hardware: empty kind in '" + list + "' (e.g. v5p,v6e,tpu7x,a3)");
    }
    const ChipSpec* chip = catalog.chip_for_slice_prefix(name);
    if (chip == nullptr) {
      throw UserError("--hardware: unknown hardware kind '" + name + "'" +
                      did_you_mean(name, catalog.slice_prefixes()));
    }
    if (std::any_of(kinds.begin(), kinds.end(),
                    [&](const HardwareKind& kind) { return kind.chip == chip; })) {
      throw UserError("--hardware: '" + name + "' names " + chip->name + " twice");
    }
    kinds.push_back({name, chip});
  }
  if (kinds.empty()) {
    throw UserError("--hardware: no hardware kind given (e.g. v5p,v6e,tpu7x,a3)");
  }
  return kinds;
}

std::vector<SliceCandidate> enumerate_slice_candidates(const std::vector<HardwareKind>& kinds,
                                                       int64_t max_chips, int max_slices) {
  if (max_chips < 1) {
    throw UserError("--max-chips: " + std::to_string(max_chips) + " must be 1 or more");
  }
  if (max_slices < 1) {
    throw UserError("--max-slices: " + std::to_string(max_slices) + " must be 1 or more");
  }
  std::vector<SliceCandidate> candidates;
  for (const HardwareKind& kind : kinds) {
    std::vector<SliceCandidate> own;
    const std::vector<std::string> names = example_slice_names(*kind.chip, kAllSliceSizes);
    own.reserve(names.size() + static_cast<size_t>(max_slices));
    for (const std::string& name : names) {
      own.push_back(candidate_for(kind, with_prefix(kind, name), 1));
    }
    const std::string largest = with_prefix(kind, names.back());
    for (int count = 2; count <= max_slices; count *= 2) {
      own.push_back(candidate_for(kind, largest, count));
    }
    std::stable_sort(own.begin(), own.end(), [](const SliceCandidate& a, const SliceCandidate& b) {
      return a.chips < b.chips;
    });
    for (const SliceCandidate& candidate : own) {
      if (candidate.chips <= max_chips) {
        candidates.push_back(candidate);
      }
    }
  }
  return candidates;
}

}  // namespace tpusim
