#include "sim/explore/mesh_equivalence.h"

#include <map>
#include <set>
#include <string>

namespace tpusim {

MeshEquivalence::MeshEquivalence(const std::vector<const TrainingStep*>& steps,
                                 const LogicalAxisRules& rules) {
  std::set<uint32_t> sets;
  // The pipeline's stage axis is read by name (sharding/partition_pipeline.cpp): its own set.
  sets.insert(1U << static_cast<unsigned>(mesh_axis_index("stage")));
  std::set<std::string> seen;  // tensors whose dims carry the same logical names split alike
  for (const TrainingStep* step : steps) {
    for (const Tensor& tensor : step->graph.tensors()) {
      if (!seen.insert(logical_names_key(tensor.dims)).second) {
        continue;
      }
      for (const std::vector<int>& axes : rules.shard_dims_on_every_axis(tensor.dims)) {
        const uint32_t bits = mesh_axis_bits(axes);
        if (bits != 0) {
          sets.insert(bits);
        }
      }
    }
  }
  // An axis's membership: which sets hold it. Axes of one membership form an atom.
  std::map<std::vector<bool>, uint32_t> atom_of_membership;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    std::vector<bool> membership;
    membership.reserve(sets.size());
    for (const uint32_t bits : sets) {
      membership.push_back((bits >> static_cast<unsigned>(axis) & 1U) != 0);
    }
    atom_of_membership[membership] |= 1U << static_cast<unsigned>(axis);
  }
  for (const auto& [membership, bits] : atom_of_membership) {
    atoms_.push_back(bits);
  }
}

std::vector<int64_t> MeshEquivalence::key(const MeshShape& mesh) const {
  std::vector<int64_t> products;
  products.reserve(atoms_.size());
  for (const uint32_t bits : atoms_) {
    products.push_back(mesh.product_of(bits));
  }
  return products;
}

DeviceMesh MeshEquivalence::relabeled(const DeviceMesh& placed, const MeshShape& onto) const {
  DeviceMesh result;
  result.shape = onto;
  result.placement_order = placed.placement_order;
  result.axes.resize(placed.axes.size());
  for (size_t axis = 0; axis < result.axes.size(); ++axis) {
    result.axes[axis].mesh_axis = static_cast<int>(axis);
  }
  for (const uint32_t bits : atoms_) {
    int representative = -1;
    for (int axis = 0; axis < kNumMeshAxes && representative < 0; ++axis) {
      if ((bits >> static_cast<unsigned>(axis) & 1U) != 0 && onto.size(axis) > 1) {
        representative = axis;
      }
    }
    if (representative < 0) {
      continue;  // the atom splits nothing (a product of 1 on every mesh of the key)
    }
    MeshAxisPlacement& into = result.axes[static_cast<size_t>(representative)];
    for (int axis = 0; axis < kNumMeshAxes; ++axis) {
      if ((bits >> static_cast<unsigned>(axis) & 1U) == 0) {
        continue;
      }
      const MeshAxisPlacement& from = placed.axes[static_cast<size_t>(axis)];
      into.ici_size *= from.ici_size;
      into.dcn_size *= from.dcn_size;
      into.portions.insert(into.portions.end(), from.portions.begin(), from.portions.end());
      into.split = into.split || from.split;
    }
  }
  return result;
}

}  // namespace tpusim
