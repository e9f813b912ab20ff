// sim/explore/batch_classes.h: which (pipeline schedule, batch) pairs partition to the same
// per-device compute on a mesh, so that the TensorCore seconds of one built program bound every
// other pair of its class without a partition.
//
// At a fixed global batch the batches of a schedule differ in their microbatch m (sequences) and
// gradient accumulation k = global / m, and the pipeline schedules of one stage count in
// num_pipeline_microbatches M and layers per stage (the layer loop's microbatch is m / M, its
// repeat the schedule's iterations). Their remat_policy=none steps then have the same graph
// except for the sizes of the dims that carry the batch and the regions' repeats and pipeline
// loops (which the partitioner reads only for the stage hand-over collectives:
// sharding/partition_pipeline.cpp). The partitioner lays every tensor out by its dims' logical
// names and the mesh (logical_rules.h), splits each dim into ceil(size / split) (partitioner.cpp's
// make_local, padded up), and its per-op choices read only those layouts and local sizes. So when
// every such dim has the same local size at two pairs on a mesh (e.g. 4,096 and 2,048 sequences
// over a batch split of 4,096 or more: one padded sequence per device either way) the two
// per-device programs run the same compute ops per region pass: their TensorCore bounds
// (step_bounds.h) come from the same seconds per region pass, each with its own repeats and
// accumulation count (bounds_from_regions). One built program bounds the whole class exactly.
// The same holds region by region (region_keys): the partitioner emits a region's compute ops
// from the layouts and local sizes of the tensors that region's ops read or write, so in a
// pipeline the layer loop (m / M sequences) of one pair and the embedding and head (m) of another
// give a third pair's seconds between them.
// tests/sim/explore/batch_classes_test.cpp partitions random pairs of one key (whole or of one
// region) apart, within a schedule and across schedules, and checks their seconds per region
// pass equal bit for bit.
//
// Keys are relative to a reference step (the first joined step that the others are the same as
// but for sizes): a key lists the dims whose local size differs from the reference's local size
// on that mesh, so that pairs of several schedules, joined one schedule after another, compare.
// Left out (no key): models with MoE routing (the partitioner sizes dropless expert buffers and
// routed fractions from the tokens).
//
// Example:
//   BatchClasses classes;
//   size_t two = classes.add_schedule(none_steps_m2, atoms, rules);  // batch b: none step b
//   size_t four = classes.add_schedule(none_steps_m4, atoms, rules);
//   classes.key(two, mesh, 0) == classes.key(four, mesh, 0);  // where both pad alike
//   // batch 1 has twice batch 0's sequences: the same layer loop microbatch at M = 4 and M = 2
//   classes.region_keys(four, mesh, 1)[loop] == classes.region_keys(two, mesh, 0)[loop];
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/autodiff/training_step.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"

namespace tpusim {

class BatchClasses {
 public:
  // Joins one schedule's batches: `none_steps[b]` is batch b's remat_policy=none step (none at
  // all: the schedule gets no keys), `atoms` the MeshEquivalence atoms its meshes are keyed by
  // (only steps of the same atoms share a reference). Returns the schedule's number for key().
  size_t add_schedule(const std::vector<std::shared_ptr<const TrainingStep>>& none_steps,
                      const std::vector<uint32_t>& atoms, const LogicalAxisRules& rules);

  // Two (schedule, batch) pairs with the same non-empty key on one mesh (or on meshes of one
  // equivalence key) run the same compute ops per region pass. Empty: no class.
  std::vector<int64_t> key(size_t schedule, const MeshShape& mesh, size_t batch) const;
  // The same per region of the step: two pairs with the same key of region r on one mesh run the
  // same compute ops in one pass of r (the key lists only the dims of tensors r's ops read or
  // write). Empty: no class.
  std::vector<std::vector<int64_t>> region_keys(size_t schedule, const MeshShape& mesh,
                                                size_t batch) const;

 private:
  struct Reference {
    std::shared_ptr<const TrainingStep> step;
    std::vector<uint32_t> atoms;
    std::vector<LogicalRule> rules;  // what group_axes was read from
    // The tensors' distinct logical names (logical_names_key) and the rules' axes of each of their
    // dims, by group (Varying::group).
    std::vector<std::string> group_names;
    std::vector<std::vector<std::vector<int>>> group_axes;
    size_t regions = 0;
    std::vector<std::vector<int>> regions_of_tensor;  // the regions whose ops read or write it
  };
  // A dim whose size differs from the reference's: where (tensor x kMaxDims + dim), its group
  // (the tensor's logical names), and both sizes.
  struct Varying {
    int64_t position = 0;
    size_t group = 0;
    size_t dim = 0;
    int64_t size = 0;
    int64_t reference_size = 0;
  };
  struct Member {
    int64_t reference = -1;        // no key
    std::vector<Varying> varying;  // by position
  };

  // The member of (schedule, batch), or null when it has no key.
  const Member* member_with_key(size_t schedule, size_t batch) const;
  // The local size of `varying`'s dim on `mesh` (padded up, as make_local); none where it equals
  // the reference's local size there (the dim then leaves the key alone).
  std::optional<int64_t> differing_local_size(const Reference& reference, const Varying& varying,
                                              const MeshShape& mesh) const;
  // `graph` as a member of reference `index` (the same graph but for dim sizes).
  Member member_of(size_t index, const Graph& graph) const;
  // `step` as the origin of a new class; none when its dims cannot be given positions.
  static std::optional<Reference> new_reference(const std::shared_ptr<const TrainingStep>& step,
                                                const std::vector<uint32_t>& atoms,
                                                const LogicalAxisRules& rules);
  // The member for `step`: against the first reference it is the same as but for sizes, else as
  // a new reference.
  Member join(const std::shared_ptr<const TrainingStep>& step, const std::vector<uint32_t>& atoms,
              const LogicalAxisRules& rules);

  std::vector<Reference> references_;
  std::vector<std::vector<Member>> schedules_;  // [schedule][batch]
};

}  // namespace tpusim
