// sim/explore/memory_floor_set.h: the memory floors (memory_floor.h) of several training steps
// on one mesh in one pass, bit for bit each floor's own bytes().
//
// The explorer asks, on the first mesh of each equivalence key, for the floor of every remat
// policy still fitting at a batch. The policies' steps hold the same tensors (they differ in
// which forward tensors they keep), so their local sizes (the divisions) are worked out once
// per mesh and only the bytes per element x copies differ per step.
//
// Example:
//   MemoryFloorSet set({&steps.memory_floor(0, 0), &steps.memory_floor(0, 1)});
//   std::vector<MemoryFloor::Bytes> bytes;
//   set.bytes(mesh, bytes);  // bytes[1] == steps.memory_floor(0, 1).bytes(mesh), bit for bit
#pragma once

#include <cstdint>
#include <vector>

#include "sharding/mesh.h"
#include "sim/explore/memory_floor.h"

namespace tpusim {

class MemoryFloorSet {
 public:
  // The floors must outlive the set.
  explicit MemoryFloorSet(std::vector<const MemoryFloor*> floors);

  // floors[i]->bytes(mesh) into bytes[i] (resized), for every i.
  void bytes(const MeshShape& mesh, std::vector<MemoryFloor::Bytes>& bytes) const;
  size_t size() const { return floors_.size(); }

 private:
  // Tensors of any step whose dims split on the same mesh axes, grouped: per group, rank,
  // distinct shapes; per dim its axis count and axes; per shape its rank sizes, then per step
  // its state and saved bytes per element x copies (integers; 0 when the step has none).
  void merge(const std::vector<const MemoryFloor*>& floors);
  std::vector<const MemoryFloor*> floors_;
  std::vector<int64_t> merged_;
  bool merged_all_ = true;  // else every floor's own bytes()
};

}  // namespace tpusim
