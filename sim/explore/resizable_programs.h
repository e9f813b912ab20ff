// sim/explore/resizable_programs.h: remat_policy=none programs the explorer built, kept by (batch,
// axes larger than 1) so that other meshes get their TensorCore bound by re-sizing one
// (sharding/program_resize.h) instead of partitioning their own. Shared by the worker threads of
// one schedule's search (a schedule has its own training steps).
//
// A mesh of another equivalence key but the same axes larger than 1 takes the partitioner down
// the same path wherever the recorded size choices come out the same; the kept program, its local
// sizes rewritten for that mesh, is then the mesh's own program, and its TensorCore bound
// (step_bounds.h) the same bit for bit. Memory is capped: kPerKey programs per key and kMaxKept in
// all; a program that does not fit the caps is not kept.
//
// Example:
//   ResizablePrograms kept;
//   kept.offer(batch, program, mesh_a);  // after partitioning mesh_a's none program
//   kept.with_resized(batch, mesh_b, [&](const Graph& graph) { ... bounds on graph ... });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "sharding/program_resize.h"

namespace tpusim {

class ResizablePrograms {
 public:
  static constexpr size_t kPerKey = 3;
  static constexpr size_t kMaxKept = 1024;

  // Calls `use` with the first kept program of `batch` that re-sizes for `mesh` (under that
  // program's lock); false when none does.
  bool with_resized(size_t batch, const MeshShape& mesh,
                    const std::function<void(const Graph&)>& use) const;
  // Keeps `program`, built for `batch` on `mesh`, unless a cap is reached or it made a size choice
  // that is not recorded.
  void offer(size_t batch, const PartitionedProgram& program, const MeshShape& mesh);

 private:
  struct Slot {
    std::mutex mutex;  // the program is re-sized in place
    ResizableProgram program;
  };
  using Key = std::pair<size_t, uint32_t>;  // batch, axes larger than 1
  std::vector<std::shared_ptr<Slot>> slots(const Key& key) const;

  mutable std::mutex mutex_;
  std::map<Key, std::vector<std::shared_ptr<Slot>>> kept_;
  size_t count_ = 0;
};

}  // namespace tpusim
