// sharding/logical_rules.h: MaxText's logical_axis_rules, which give every tensor dim its mesh
// axes.
//
// The rules are an ordered list of [logical_name, [mesh axes...]]; a name may appear more than once
// (fallbacks). As in flax's logical_to_mesh_axes, rules are applied in list order: a rule shards
// the first still-unassigned dim with its logical name over its mesh axes, unless one of those
// mesh axes already shards another dim of the same tensor, in which case the next rule for that
// name is tried. Dims no rule assigns are replicated. Mesh axes of size 1 are dropped from the
// result (they do not split anything). A dim that merges several logical axes names them joined
// by '+' ("activation_batch_no_exp+activation_length" for MoE tokens grouped per expert) and is
// split over the union of their axes.
//
// Example (default rules, mesh fsdp=16 tensor=4):
//   wi[embed @embed, mlp @mlp] -> embed over {fsdp}, mlp over {tensor}
//     ('mlp' -> [fsdp_transpose, tensor, ...] comes first; 'embed' then falls back to the rule
//      without fsdp_transpose)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/ir/tensor.h"
#include "sharding/mesh.h"

namespace tpusim {

class Config;

struct LogicalRule {
  std::string logical;
  std::vector<std::string> mesh_axes;

  bool operator==(const LogicalRule&) const = default;
};

class LogicalAxisRules {
 public:
  // Parses and checks logical_axis_rules (UserError naming an unknown mesh axis or a bad entry).
  static LogicalAxisRules from_config(const Config& config);
  static LogicalAxisRules from_rules(std::vector<LogicalRule> rules);

  // Mesh axis indices sharding each dim (outer list: dims; inner: mesh axes, major to minor).
  std::vector<std::vector<int>> shard_dims(const std::vector<Dim>& dims,
                                           const MeshShape& mesh) const;
  // shard_dims on a mesh where every axis splits (ICI axes of 2): every axis the rules give each
  // dim. A real mesh keeps a subset of these (its axes of size 1 split nothing), in this order.
  std::vector<std::vector<int>> shard_dims_on_every_axis(const std::vector<Dim>& dims) const;

  const std::vector<LogicalRule>& rules() const { return rules_; }

 private:
  std::vector<LogicalRule> rules_;
  // Per rule, resolved once: its mesh axis indices and their bit set (1 << index).
  std::vector<std::vector<int>> rule_axes_;
  std::vector<uint32_t> rule_axis_bits_;
};

// The dims' logical names joined ("activation_batch\0activation_embed\0"): tensors with the same
// key split the same way on every mesh, so a key's layout is resolved once.
std::string logical_names_key(const std::vector<Dim>& dims);

}  // namespace tpusim
