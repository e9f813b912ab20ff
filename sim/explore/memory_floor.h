// sim/explore/memory_floor.h: a lower bound on a candidate's peak HBM per device, from its
// training step and mesh alone (no partitioned program), for the explorer to skip partitioning
// what cannot fit.
//
// The partitioner gives every tensor of the step a local copy split by the logical axis rules
// (each dim: its size over the product of its mesh axes, rounded up), and the memory model
// (sim/memory/memory_model.h) counts, at the end of the last forward region:
//   - the state (parameters and Adam moments no op produces), each x its region's parameter
//     sets, at every point of the step;
//   - the forward tensors the remat policy keeps on device, and the inputs, each x its region's
//     repeat (saved activations pile up through the forward regions);
// plus gathered weights, temporaries and pipeline buffers (>= 0, left out here). So
// state + saved <= peak, and state is the memory model's weights + optimizer_state exactly.
// Tensors with a dropless expert_tokens dim (sized at partition time) are left out, which keeps
// the floor below the peak. explore_test checks floor <= peak over random candidates.
//
// Example:
//   MemoryFloor floor(step, rules);
//   MemoryFloor::Bytes bytes = floor.bytes(mesh);
//   bytes.state;            // == estimate_memory(program).at_peak.weights + optimizer_state
//   bytes.state + bytes.saved <= estimate_memory(program).peak_bytes
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/autodiff/training_step.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"

namespace tpusim {

class MemoryFloor {
 public:
  // Every tensor's mesh axes are resolved here once: the rules pick a dim's axes whatever the
  // mesh (logical_rules.h: a mesh only drops its axes of size 1, which split nothing), so bytes()
  // then only multiplies a mesh's axis sizes (the same integers).
  MemoryFloor(const TrainingStep& step, const LogicalAxisRules& rules);

  struct Bytes {
    double state = 0;  // parameters and optimizer moments
    double saved = 0;  // saved activations and inputs, at the end of the forward pass
    double total() const { return state + saved; }
  };
  Bytes bytes(const MeshShape& mesh) const;
  // The same sums term by term, in the step's tensor order (what bytes() falls back to).
  Bytes bytes_by_term(const MeshShape& mesh) const;

 private:
  friend class MemoryFloorSet;  // merges several floors' groups (memory_floor_set.h)
  // One tensor: its global dim sizes (by index into its group's shapes), bytes per element and
  // how many copies are live.
  struct Term {
    size_t shape = 0;
    double bytes_per_element = 0;
    double copies = 1;
    bool state = false;
  };
  // Tensors whose dims carry the same logical names split the same way: resolved once per mesh.
  // Their global sizes repeat (every layer's weights), so each distinct one is split once per
  // mesh: shapes holds them one after another, rank sizes each.
  struct Group {
    std::vector<Dim> dims;               // a representative's (the rules read the logical names)
    std::vector<std::vector<int>> axes;  // the rules' axes for dims, on every mesh
    std::vector<int64_t> shapes;         // the distinct global sizes, flattened
    std::vector<Term> terms;
  };
  // Local elements of each distinct shape of `group` on `mesh` into `elements` (resized).
  static void local_elements(const Group& group, const MeshShape& mesh,
                             std::vector<double>& elements);
  // Every term's bytes are whole: local elements x bytes per element x copies, integers. Below
  // 2^52 bytes in all, a double adds integers exactly in any order, so bytes() takes each
  // distinct shape once with its terms' bytes per element x copies summed (an integer too), and
  // gives the sums bytes_by_term gives bit for bit; above, it takes the terms one by one.
  // The explorer asks for floors of many steps on many meshes, so they are read from one array
  // (merged_), group after group: rank, distinct shapes; per dim its axis count and axes; per
  // shape its rank sizes, then its state and saved bytes per element x copies.
  void merge_terms();
  // Walks such an array on `mesh`: per distinct shape, its local elements (padded up, multiplied
  // dim by dim as local_elements does) and a cursor on the values after its sizes, which
  // `per_shape(elements, at)` reads and returns past. MemoryFloorSet's array has the same layout
  // with one (state, saved) pair per step.
  template <typename PerShape>
  static void walk_merged(const std::vector<int64_t>& merged, const MeshShape& mesh,
                          PerShape&& per_shape) {
    std::array<int64_t, kMostMergedRank> splits{};
    const int64_t* at = merged.data();
    const int64_t* const end = at + merged.size();
    while (at < end) {
      const auto rank = static_cast<size_t>(*at++);
      const int64_t shapes = *at++;
      for (size_t dim = 0; dim < rank; ++dim) {
        const auto axes = static_cast<size_t>(*at++);
        splits[dim] = mesh.product_of(std::span<const int64_t>(at, axes));
        at += axes;
      }
      for (int64_t shape = 0; shape < shapes; ++shape) {
        double elements = 1.0;
        for (size_t dim = 0; dim < rank; ++dim) {
          const int64_t size = *at++;
          const int64_t split = splits[dim];
          // Padded up; most dims are not split, and a division costs more than the test.
          elements *= static_cast<double>(split == 1 ? size : (size + split - 1) / split);
        }
        at = per_shape(elements, at);
      }
    }
  }
  std::vector<Group> groups_;
  std::vector<int64_t> merged_;
  static constexpr size_t kMostMergedRank = 16;  // a group of higher rank: term by term
  bool merged_all_ = true;
};

}  // namespace tpusim
