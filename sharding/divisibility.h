// sharding/divisibility.h: JAX's rule that jit arguments split evenly, checked per mesh with
// integer products before any program is built. The one check behind explore's
// axis_does_not_divide and the refusals of estimate and train (build_step_program): what explore
// prunes, the others refuse.
//
// The arguments are the parameters and the inputs (tokens, targets, positions). Every dim of
// theirs that the logical rules shard must split evenly over its mesh axes: parameter dims (e.g.
// kv_heads over tensor) and the inputs' length (max_target_length over context). The inputs'
// batch is the one MaxText loads (BatchPlan::loaded_microbatch): per_device_batch_size >= 1
// loads the microbatch itself, which must split over the batch's axes (data, fsdp, ...); a
// fraction loads one sequence per device, which always splits, and the step keeps fewer of them,
// which XLA pads (the partitioner's PaddingNote) and tpusim train cannot compute
// (require_train_batch_divides). Inputs read in chunks (num_vocab_tiling's targets) count whole.
//
// The logical rules assign mesh axes to dims independently of the axis sizes (sizes only drop
// axes of size 1, which split nothing), so the assignment is resolved once from one training
// step and each mesh is checked against it.
//
// Example:
//   const Divisibility divisibility(step, LogicalAxisRules::from_config(config));
//   divisibility.parameters_divide(mesh);            // every parameter dim splits evenly
//   divisibility.batch_divides(mesh, /*loaded_microbatch=*/32);  // and the inputs' batch
//   divisibility.require_divides(mesh, plan, /*per_device_batch_size=*/2);  // UserError if not
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/autodiff/training_step.h"
#include "model/batch_plan.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"

namespace tpusim {

// One argument dim that a mesh does not split evenly.
struct UnevenSplit {
  std::string tensor;     // "tokens", "decoder/layer/attention/key"
  std::string dim;        // "batch", "length", "kv_heads"
  bool input = false;     // an input (tokens, targets, positions), not a parameter
  int64_t size = 0;       // the dim's size (for the batch: the sequences split)
  std::vector<int> axes;  // mesh axes splitting it (indices into mesh_axis_names())
  int64_t shards = 1;     // their product on the mesh

  // "fsdp=4 (ici_fsdp_parallelism=4)": the axes of size > 1 and the keys that set them.
  std::string describe_axes(const MeshShape& mesh) const;
};

class Divisibility {
 public:
  Divisibility(const TrainingStep& step, const LogicalAxisRules& rules);

  // explore's pruning: false exactly when first_uneven_parameter / first_uneven_batch find one.
  bool parameters_divide(const MeshShape& mesh) const;
  bool batch_divides(const MeshShape& mesh, int64_t loaded_microbatch) const;

  // Parameter dims and the inputs' other dims (length).
  std::optional<UnevenSplit> first_uneven_parameter(const MeshShape& mesh) const;
  // The inputs' batch dim holding `batch` sequences.
  std::optional<UnevenSplit> first_uneven_batch(const MeshShape& mesh, int64_t batch) const;

  // estimate and train (build_step_program): UserError naming the key, its value and the mesh
  // axes when parameters_divide or batch_divides(plan.loaded_microbatch) is false.
  void require_divides(const MeshShape& mesh, const BatchPlan& plan,
                       double per_device_batch_size) const;
  // tpusim train computes only even splits: UserError when the microbatch itself (not the loaded
  // one) does not split over the batch's axes, which a per_device_batch_size < 1 allows.
  void require_train_batch_divides(const MeshShape& mesh, const BatchPlan& plan,
                                   double per_device_batch_size) const;

 private:
  std::vector<UnevenSplit> fixed_dims_;  // parameter dims and input dims other than the batch
  std::vector<UnevenSplit> batch_dims_;  // the inputs' batch dims (size varies with the batch)
};

}  // namespace tpusim
