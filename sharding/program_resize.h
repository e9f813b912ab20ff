// sharding/program_resize.h: a partitioned program re-sized for another mesh, without partitioning
// again, where the partitioner would make the same choices there.
//
// Two meshes with the same axes larger than 1 give the partitioner the same layouts (the rules drop
// only axes of size 1), so it takes the same path through the step but where a choice compares
// sizes (sharding/size_decisions.h). When every recorded choice comes out the same on the other
// mesh, partitioning there gives the same ops, the same tensors and the same layouts, every local
// dim ceil(global size / product of its axes' sizes) on that mesh: the program below with its
// local sizes rewritten. What reads only ops and local shapes (the TensorCore bound of
// sim/explore/step_bounds.h) then needs no partition; collectives differ in their group sizes and
// are not rewritten.
//
// Example:
//   // copies the program:
//   std::optional<ResizableProgram> kept = ResizableProgram::from(program, mesh_a.shape);
//   if (kept.has_value() && kept->resize(mesh_b.shape)) {
//     kept->graph();  // mesh_b's program as partition() builds it (collective group sizes aside)
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/ir/graph.h"
#include "sharding/mesh.h"
#include "sharding/partitioner.h"
#include "sharding/size_decisions.h"

namespace tpusim {

class ResizableProgram {
 public:
  // The program of `mesh`; nullopt when it made a size-dependent choice that is not recorded.
  static std::optional<ResizableProgram> from(const PartitionedProgram& program,
                                              const MeshShape& mesh);

  // Bit per mesh axis larger than 1.
  static uint32_t axes_above_one(const MeshShape& mesh);

  const Graph& graph() const { return graph_; }
  uint32_t structure() const { return structure_; }

  // Rewrites the local sizes for `mesh` in place; true when `mesh` has this program's axes larger
  // than 1 and every recorded choice comes out the same there, i.e. when graph() is then the
  // program partition() builds on `mesh` (false: graph() is of no mesh until the next resize).
  bool resize(const MeshShape& mesh);

 private:
  // A local dim to re-size: ceil(global / product of the sizes of `axes`).
  struct SplitDim {
    TensorId tensor = -1;
    uint32_t dim = 0;
    uint32_t axes = 0;  // bit per mesh axis index
    int64_t global = 0;
  };
  bool holds(const SizeDecision& decision, const MeshShape& mesh) const;

  Graph graph_;
  SizeDecisions decisions_;
  std::vector<SplitDim> split_dims_;
  uint32_t structure_ = 0;
};

}  // namespace tpusim
