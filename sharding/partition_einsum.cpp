#include "sharding/partitioner_internal.h"

namespace tpusim::partitioner_internal {

void Partitioner::partition_einsum(const Op& op, const std::array<TensorId, 2>& operands,
                                   const std::array<PlanDims, 2>& operand_dims,
                                   std::span<const std::string> contracted) {
  const TensorId output = op.outputs[0];
  const Layout& out_layout = layout(output);
  const Tensor& out_tensor = global_.tensor(output);
  // Local sizes, read in the loops below (nothing is added to the program before they end).
  const double output_bytes = static_cast<double>(out_.tensor(local(output)).bytes());
  std::array<double, 2> operand_bytes{};
  for (size_t which = 0; which < operands.size(); ++which) {
    if (operands[which] >= 0) {
      operand_bytes[which] = static_cast<double>(out_.tensor(local(operands[which])).bytes());
    }
  }
  AxesByName iteration;
  AxisList used;
  for (size_t dim = 0; dim < out_tensor.dims.size(); ++dim) {
    iteration[out_tensor.dims[dim].name] = out_layout[dim];
    used.append(out_layout[dim]);
  }
  AxisList partial;
  for (const std::string& name : contracted) {
    // The operand dims named `name`: both operands contract it when there are exactly two.
    std::array<const AxisList*, 2> sharding{};
    size_t found = 0;
    const Name* interned = nullptr;  // the dim's Name, so that lookups by it compare pointers
    for (const auto& dims : operand_dims) {
      for (const PlanDim& dim : dims) {
        if (*dim.name == name) {
          if (found < sharding.size()) {
            sharding[found] = &dim.axes;
          }
          ++found;
          interned = dim.name;
        }
      }
    }
    AxisList chosen;
    if (found == 2) {
      for (const int axis : *sharding[0]) {
        const bool both = contains(*sharding[1], axis);
        if (both && !contains(partial, axis)) {
          chosen.push_back(axis);
        }
      }
      // An axis only one operand splits, free in the output: slice the other operand and
      // reduce the output rather than gathering, when the output is the smaller of the two.
      for (size_t which = 0; which < 2; ++which) {
        for (const int axis : *sharding[which]) {
          if (operands[which] < 0 || contains(chosen, axis) || contains(used, axis) ||
              contains(partial, axis)) {
            continue;
          }
          const bool slice = 2.0 * output_bytes < operand_bytes[which];
          decisions_.bytes_less(2.0, local(output), local(operands[which]), slice);
          if (slice) {
            chosen.push_back(axis);
          }
        }
      }
    }
    (interned != nullptr ? iteration[*interned] : iteration[name]) = chosen;
    partial.append(chosen);
  }
  // Output dims lose the partial axes (they come back through reduce-scatter).
  Layout computed = out_layout;
  for (AxisList& axes : computed) {
    axes = without(axes, partial);
  }
  // An output dim an operand splits over an axis the output leaves free: keep the split and
  // gather the (smaller) result instead of gathering the operand, as XLA would.
  for (size_t dim = 0; dim < out_tensor.dims.size(); ++dim) {
    for (size_t which = 0; which < operands.size(); ++which) {
      if (operands[which] < 0) {
        continue;
      }
      for (const PlanDim& plan : operand_dims[which]) {
        if (*plan.name != out_tensor.dims[dim].name) {
          continue;
        }
        for (const int axis : plan.axes) {
          if (contains(used, axis) || contains(partial, axis)) {
            continue;
          }
          const bool keep_split = output_bytes < operand_bytes[which];
          decisions_.bytes_less(1.0, local(output), local(operands[which]), keep_split);
          if (keep_split) {
            computed[dim].push_back(axis);
            used.push_back(axis);
          }
        }
      }
    }
  }
  computed = normalized(computed);
  for (size_t dim = 0; dim < out_tensor.dims.size(); ++dim) {
    iteration[out_tensor.dims[dim].name] = computed[dim];
  }
  TensorIds inputs;
  for (const TensorId operand : op.inputs) {
    inputs.push_back(reshard(operand, follow(operand, iteration), op.region));
  }
  emit(op, inputs, {computed}, partial);
}

}  // namespace tpusim::partitioner_internal
