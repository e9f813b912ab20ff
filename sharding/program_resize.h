// sharding/program_resize.h: a partitioned program re-sized for another mesh, without partitioning
// again, where the partitioner would make the same choices there.
//
// Two meshes with the same axes larger than 1 give the partitioner the same layouts (the rules drop
// only axes of size 1), so it takes the same path through the step but where a choice compares
// sizes (sharding/size_decisions.h). When every recorded choice comes out the same on the other
// mesh, partitioning there gives the same ops, the same tensors and the same layouts; what differs
// is each local dim, ceil(global size / product of its axes' sizes) on that mesh, each
// collective's group size (the product of its axes' sizes) and the padding notes. resize()
// rewrites those three, so the program is then partition()'s on the other mesh, to the text
// (`tpusim program`); only its DeviceMesh (the placement) is the caller's to set.
//
// Example:
//   // copies the program:
//   std::optional<ResizableProgram> kept = ResizableProgram::from(program, mesh_a.shape);
//   if (kept.has_value() && kept->resize(mesh_b.shape)) {
//     PartitionedProgram b = kept->program();  // partition()'s on mesh_b but for b.mesh
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
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

  const PartitionedProgram& program() const { return program_; }
  // Swaps program() with `other` (a lender hands it out for a while, then swaps it back; nothing
  // else may be called meanwhile).
  void swap_program(PartitionedProgram& other) { std::swap(program_, other); }
  const Graph& graph() const { return program_.graph; }

  // Rewrites the local sizes, group sizes and padding for `mesh` in place; true when `mesh` has
  // this program's axes larger than 1 and every recorded choice comes out the same there, i.e.
  // when program() is then the one partition() builds on `mesh` (false: program() is of no mesh
  // until the next resize).
  bool resize(const MeshShape& mesh);

  // Piecewise, for a reader of a few tensors (the explorer's TensorCore bound,
  // sim/explore/resized_op_costs.h): after holds_on(mesh), a tensor re-sized by resize_tensor has
  // its local sizes on `mesh`; the others, and the group sizes and padding, are of no mesh until
  // the next resize().
  //
  // The distinct sets of mesh axes the program's dims are split over (bit per axis index).
  const std::vector<uint32_t>& split_axes() const { return split_axes_; }
  // The product of each split_axes() set's sizes on `mesh`, by the same index, into `splits`.
  void splits_on(const MeshShape& mesh, std::vector<int64_t>& splits) const;
  // Indices into split_axes() of `tensor`'s split dims (repeats included), appended to `sets`.
  void split_sets_of(TensorId tensor, std::vector<uint32_t>& sets) const;
  // What resize(mesh) returns, re-sizing only the tensors the recorded choices compare; `splits`
  // is splits_on(mesh).
  bool holds_on(const MeshShape& mesh, const std::vector<int64_t>& splits);
  // Rewrites `tensor`'s local sizes for `splits` (splits_on of a mesh).
  void resize_tensor(TensorId tensor, const std::vector<int64_t>& splits);

 private:
  // A local dim to re-size: ceil(global / product of the sizes of `axes`).
  struct SplitDim {
    TensorId tensor = -1;
    uint32_t dim = 0;
    uint32_t axes = 0;  // bit per mesh axis index
    uint32_t set = 0;   // index of `axes` into split_axes_
    int64_t global = 0;
  };
  void resize_dims(size_t begin, size_t end, const std::vector<int64_t>& splits);
  void point_sizes();
  // A collective over mesh axes: its group size is the product of their sizes.
  struct GroupOp {
    int op = -1;
    uint32_t axes = 0;
  };
  bool holds(const SizeDecision& decision, const MeshShape& mesh) const;
  void note_padding();             // for the mesh of splits_
  uint32_t set_of(uint32_t axes);  // index of `axes` into split_axes_, added if new

  PartitionedProgram program_;
  std::vector<SplitDim> split_dims_;  // in tensor id order
  std::vector<uint32_t> split_axes_;  // the distinct SplitDim::axes
  std::vector<size_t> tensor_dims_;   // tensor t's split dims: [tensor_dims_[t], [t + 1])
  std::vector<int64_t> splits_;       // scratch: splits_on(the mesh being re-sized for)
  // Pointers that a copy or a move of their owner does not take: copied, they would point into
  // the other program's tensors (even where the copy has the same address as the program it was
  // copied from: a program given a copy of itself), so the new owner points them again.
  class SizePointers {
   public:
    SizePointers() = default;
    SizePointers(const SizePointers& /*other*/) {}
    SizePointers(SizePointers&& other) noexcept { other.at.clear(); }
    SizePointers& operator=(const SizePointers& /*other*/) {
      at.clear();
      return *this;
    }
    SizePointers& operator=(SizePointers&& other) noexcept {
      at.clear();
      other.at.clear();
      return *this;
    }
    ~SizePointers() = default;
    std::vector<int64_t*> at;
  };
  // Where each split dim's local size is in program_.graph, by split_dims_ index (point_sizes,
  // on the first re-size of this object).
  SizePointers sizes_;
  std::vector<GroupOp> group_ops_;
  size_t primary_tensors_ = 0;  // local tensors [0, n) are the global tensors' own (padding notes)
  uint32_t structure_ = 0;
};

// The same per-device program: `tpusim program`'s text (ops, tensors, local sizes, collectives with
// their group sizes), the padding notes and the local tensor of every global one (the explorer's
// checking run compares a re-sized program with the partition this way).
bool same_program(const PartitionedProgram& a, const PartitionedProgram& b);

}  // namespace tpusim
