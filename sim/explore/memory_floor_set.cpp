#include "sim/explore/memory_floor_set.h"

#include <array>
#include <cstddef>
#include <map>
#include <utility>

namespace tpusim {
namespace {

// A group of the set: the tensors of every step that split on these axes.
struct SetGroup {
  std::vector<std::vector<int>> axes;
  std::vector<int64_t> shapes;                   // distinct global sizes, flattened
  std::map<std::vector<int64_t>, size_t> index;  // a shape's place in shapes
  std::vector<int64_t> weights;                  // per shape, per step: state, saved
};

}  // namespace

MemoryFloorSet::MemoryFloorSet(std::vector<const MemoryFloor*> floors)
    : floors_(std::move(floors)) {
  for (const MemoryFloor* floor : floors_) {
    merged_all_ = merged_all_ && floor->merged_all_;
  }
  if (merged_all_) {
    merge(floors_);
  }
}

void MemoryFloorSet::merge(const std::vector<const MemoryFloor*>& floors) {
  const size_t steps = floors.size();
  std::map<std::vector<std::vector<int>>, SetGroup> groups;
  for (size_t step = 0; step < steps; ++step) {
    for (const MemoryFloor::Group& group : floors[step]->groups_) {
      SetGroup& merged = groups[group.axes];
      merged.axes = group.axes;
      const size_t rank = group.dims.size();
      for (const MemoryFloor::Term& term : group.terms) {
        const auto begin = group.shapes.begin() + static_cast<std::ptrdiff_t>(term.shape * rank);
        std::vector<int64_t> sizes(begin, begin + static_cast<std::ptrdiff_t>(rank));
        const auto [found, added] = merged.index.try_emplace(sizes, merged.index.size());
        if (added) {
          merged.shapes.insert(merged.shapes.end(), sizes.begin(), sizes.end());
          merged.weights.resize(merged.weights.size() + 2 * steps, 0);
        }
        // As MemoryFloor::merge_terms sums them: whole bytes per element x copies.
        merged.weights[(found->second * steps + step) * 2 + (term.state ? 0 : 1)] +=
            static_cast<int64_t>(term.bytes_per_element) * static_cast<int64_t>(term.copies);
      }
    }
  }
  for (const auto& [axes, group] : groups) {
    const size_t rank = axes.size();
    const size_t shapes = group.index.size();
    merged_.push_back(static_cast<int64_t>(rank));
    merged_.push_back(static_cast<int64_t>(shapes));
    for (const std::vector<int>& dim_axes : axes) {
      merged_.push_back(static_cast<int64_t>(dim_axes.size()));
      merged_.insert(merged_.end(), dim_axes.begin(), dim_axes.end());
    }
    for (size_t shape = 0; shape < shapes; ++shape) {
      const auto sizes = group.shapes.begin() + static_cast<std::ptrdiff_t>(shape * rank);
      merged_.insert(merged_.end(), sizes, sizes + static_cast<std::ptrdiff_t>(rank));
      const auto weights = group.weights.begin() + static_cast<std::ptrdiff_t>(shape * steps * 2);
      merged_.insert(merged_.end(), weights, weights + static_cast<std::ptrdiff_t>(steps * 2));
    }
  }
}

void MemoryFloorSet::bytes(const MeshShape& mesh, std::vector<MemoryFloor::Bytes>& bytes) const {
  const size_t steps = floors_.size();
  bytes.assign(steps, MemoryFloor::Bytes{});
  if (!merged_all_) {
    for (size_t step = 0; step < steps; ++step) {
      bytes[step] = floors_[step]->bytes(mesh);
    }
    return;
  }
  MemoryFloor::walk_merged(merged_, mesh, [&bytes](double elements, const int64_t* at) {
    for (MemoryFloor::Bytes& step : bytes) {
      step.state += elements * static_cast<double>(*at++);
      step.saved += elements * static_cast<double>(*at++);
    }
    return at;
  });
  // Whole numbers below 2^52 add exactly in any order: each step's own bytes() gives the same
  // sums. Above, its own bytes() decides (term by term).
  constexpr double kExactBelow = 4503599627370496.0;  // 2^52
  for (size_t step = 0; step < steps; ++step) {
    if (bytes[step].state >= kExactBelow || bytes[step].saved >= kExactBelow) {
      bytes[step] = floors_[step]->bytes(mesh);
    }
  }
}

}  // namespace tpusim
