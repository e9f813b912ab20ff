// sim/explore/batch_classes.h: which batches of one mesh partition to the same per-microbatch
// program, so that the TensorCore bound of one of them gives every other's without a partition.
//
// At a fixed global batch the batches of a mesh differ in their microbatch m (sequences) and
// gradient accumulation k = global / m. The remat_policy=none steps of two batches have the same
// graph except for the sizes of the dims that carry the batch (the inputs' and activations' batch
// dims). The partitioner lays every tensor out by its dims' logical names and the mesh
// (logical_rules.h), splits each dim into ceil(size / split) (partitioner.cpp's make_local, padded
// up), and its per-op choices read only those layouts and local sizes. So when every such dim has
// the same local size at m and m' on a mesh (e.g. 4,096 and 2,048 sequences over a batch split of
// 4,096 or more: one padded sequence per device either way) the two per-device programs are the
// same, and their TensorCore bounds (step_bounds.h) are microbatch x k + optimizer with the same
// two sums: one built program bounds the whole class exactly.
// tests/sim/explore/batch_classes_test.cpp partitions random (mesh, batch) pairs of one key and
// checks their bounds equal bit for bit.
//
// Left out (no key: every batch is its own class): models with MoE routing (the partitioner sizes
// dropless expert buffers and routed fractions from the tokens), and batches whose step differs
// from the first batch's in anything but dim sizes.
//
// Example:
//   BatchClasses classes(none_steps, rules);  // none_steps[b]: batch b's remat_policy=none step
//   classes.key(mesh, 0) == classes.key(mesh, 1);  // true: one per-microbatch program
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/autodiff/training_step.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"

namespace tpusim {

class BatchClasses {
 public:
  // `none_steps`: the remat_policy=none step of every batch of the space, by batch index.
  BatchClasses(const std::vector<const TrainingStep*>& none_steps, const LogicalAxisRules& rules);
  // No class at all (an empty space, one batch, or MoE routing): key() is always empty.
  BatchClasses() = default;

  // The local sizes of the batch-carrying dims of `batch` on `mesh`: two batches with the same
  // non-empty key on one mesh partition to the same per-microbatch program. Empty: no class.
  std::vector<int64_t> key(const MeshShape& mesh, size_t batch) const;

 private:
  // Dims whose size differs between batches, grouped by their tensor's logical names (split the
  // same way on every mesh).
  struct Group {
    std::vector<std::vector<int>> axes;  // the rules' axes of each dim, on every mesh
    std::vector<size_t> dims;            // the varying dims' indices
    // sizes[batch][n]: the size of the n-th varying dim of the group's tensors at that batch.
    std::vector<std::vector<int64_t>> sizes;
  };
  std::vector<Group> groups_;
  std::vector<bool> comparable_;  // by batch: its step is the first's but for dim sizes
};

}  // namespace tpusim
