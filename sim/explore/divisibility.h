// sim/explore/divisibility.h: JAX's rule that jit arguments split evenly, checked per mesh with
// integer products before any program is built (explore's axis_does_not_divide).
//
// The logical rules assign mesh axes to dims independently of the axis sizes (sizes only drop
// axes of size 1, which split nothing), so the assignment is resolved once from one training
// step and each mesh is checked against it.
//
// Example:
//   const Divisibility divisibility(step, LogicalAxisRules::from_config(config));
//   divisibility.parameters_divide(mesh);            // every parameter dim splits evenly
//   divisibility.batch_divides(mesh, /*microbatch=*/32);  // and the inputs' batch
#pragma once

#include <cstdint>
#include <vector>

#include "model/autodiff/training_step.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"

namespace tpusim {

class Divisibility {
 public:
  Divisibility(const TrainingStep& step, const LogicalAxisRules& rules);

  bool parameters_divide(const MeshShape& mesh) const;
  bool batch_divides(const MeshShape& mesh, int64_t microbatch) const;

 private:
  struct SplitDim {
    int64_t size = 0;
    std::vector<int> axes;
    int64_t shards(const MeshShape& mesh) const;
  };
  std::vector<SplitDim> fixed_dims_;  // parameter dims and input dims other than the batch
  std::vector<SplitDim> batch_dims_;  // the inputs' batch dims (size varies with the batch)
};

}  // namespace tpusim
