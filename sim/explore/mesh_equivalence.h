// sim/explore/mesh_equivalence.h: meshes that give the same per-device program, found from the
// training step's tensors and the logical axis rules alone (no partitioned program), so that the
// explorer can reuse one mesh's compute bounds and memory for the others.
//
// The rules give every tensor dim its mesh axes whatever the mesh (sharding/logical_rules.h: the
// rule is chosen by the axes it names, and a mesh only drops its axes of size 1, which split
// nothing), and the partitioner reads a mesh only through the sizes of the axes of those sets
// (and the pipeline's stage axis by name). Call an "atom" a largest group of axes that every
// resolved set holds all together or not at all (e.g. the axes that no rule of the model uses).
// Every
// dim's split, and every collective group formed from those sets (their unions, intersections
// and differences), is then a product of whole atoms, so two meshes with the same product of
// sizes per atom have the same local shapes, compute ops and memory per device; their collectives
// differ only by the axes' names (and, by placement, in time). key() gives those products.
// mesh_equivalence_test partitions meshes of equal keys and checks their compute bounds and
// memory agree bit for bit.
//
// Example:
//   MeshEquivalence same({&step}, rules);
//   same.key(fsdp=16) != same.key(fsdp=8 x tensor=2)  // tensor splits other dims than fsdp
//   same.key(a) == same.key(b)  // a and b give the same per-device program
#pragma once

#include <cstdint>
#include <vector>

#include "model/autodiff/training_step.h"
#include "sharding/device_mesh.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"

namespace tpusim {

class MeshEquivalence {
 public:
  // From the sets of axes the rules give the dims of every tensor of `steps`.
  MeshEquivalence(const std::vector<const TrainingStep*>& steps, const LogicalAxisRules& rules);

  // The product of the mesh's axis sizes (ICI x DCN) per atom: equal keys, same per-device
  // program.
  std::vector<int64_t> key(const MeshShape& mesh) const;

  // `placed` (a placement of a mesh B) laid onto the axis names of `onto`, a mesh of B's key, so
  // that the program partitioned on `onto` times its collectives as B's program does on `placed`:
  // every collective spans whole atoms, so each atom's devices, ICI portions and DCN size go to
  // one axis of that atom, the lowest larger than 1 on `onto` (its other axes get none). The sums
  // over a collective's portions may run in another order than on B (bandwidths of several
  // atoms: the same within rounding). Timing reads a mesh only through its collectives
  // (sim/perf/collective_cost.h), so B's bounds come without partitioning B.
  DeviceMesh relabeled(const DeviceMesh& placed, const MeshShape& onto) const;

  // The atoms, each a bit set of mesh axis indices (1 << axis); together they hold every axis.
  const std::vector<uint32_t>& atoms() const { return atoms_; }

 private:
  std::vector<uint32_t> atoms_;
};

}  // namespace tpusim
