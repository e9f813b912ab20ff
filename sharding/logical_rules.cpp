#include "sharding/logical_rules.h"

#include <algorithm>
#include <string_view>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {

LogicalAxisRules LogicalAxisRules::from_rules(std::vector<LogicalRule> rules) {
  LogicalAxisRules result;
  for (const LogicalRule& rule : rules) {
    std::vector<int> axes;
    for (const std::string& axis : rule.mesh_axes) {
      try {
        axes.push_back(mesh_axis_index(axis));
      } catch (const UserError& error) {
        throw UserError("logical_axis_rules: rule '" + rule.logical + "' names " + error.what());
      }
    }
    result.rule_axis_bits_.push_back(mesh_axis_bits(axes));
    result.rule_axes_.push_back(std::move(axes));
  }
  result.rules_ = std::move(rules);
  return result;
}

LogicalAxisRules LogicalAxisRules::from_config(const Config& config) {
  std::vector<LogicalRule> rules;
  for (auto& [logical, mesh_axes] : config.get_named_lists("logical_axis_rules")) {
    LogicalRule rule;
    rule.logical = std::move(logical);
    rule.mesh_axes = std::move(mesh_axes);
    rules.push_back(std::move(rule));
  }
  return from_rules(std::move(rules));
}

std::vector<std::vector<int>> LogicalAxisRules::shard_dims(const std::vector<Dim>& tensor_dims,
                                                           const MeshShape& mesh) const {
  // A merged dim ("activation_batch_no_exp+activation_length") resolves each part as its own
  // dim, then takes the union of their axes.
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Part {
    std::string_view logical;
    size_t owner = 0;     // index of the tensor dim
    size_t rule = kNone;  // the rule that shards it
  };
  std::vector<Part> parts;
  parts.reserve(tensor_dims.size());
  for (size_t index = 0; index < tensor_dims.size(); ++index) {
    const std::string_view logical = tensor_dims[index].logical;
    size_t start = 0;
    while (true) {
      const size_t plus = logical.find('+', start);
      parts.push_back({logical.substr(start, plus == std::string_view::npos ? std::string_view::npos
                                                                            : plus - start),
                       index});
      if (plus == std::string_view::npos) {
        break;
      }
      start = plus + 1;
    }
  }
  uint32_t used = 0;  // mesh axes that already shard a dim (bit per axis index)
  for (size_t rule = 0; rule < rules_.size(); ++rule) {
    const auto target = std::find_if(parts.begin(), parts.end(), [&](const Part& part) {
      return part.rule == kNone && part.logical == rules_[rule].logical;
    });
    if (target == parts.end() || (rule_axis_bits_[rule] & used) != 0) {
      continue;
    }
    target->rule = rule;
    used |= rule_axis_bits_[rule];
  }
  std::vector<std::vector<int>> result(tensor_dims.size());
  for (const Part& part : parts) {
    if (part.rule == kNone) {
      continue;
    }
    for (const int axis : rule_axes_[part.rule]) {
      if (mesh.size(axis) > 1) {
        result[part.owner].push_back(axis);
      }
    }
  }
  return result;
}

std::vector<std::vector<int>> LogicalAxisRules::shard_dims_on_every_axis(
    const std::vector<Dim>& dims) const {
  MeshShape every_axis;
  every_axis.ici.fill(2);
  every_axis.dcn.fill(1);
  return shard_dims(dims, every_axis);
}

std::string logical_names_key(const std::vector<Dim>& dims) {
  std::string key;
  for (const Dim& dim : dims) {
    key += dim.logical;
    key += '\0';
  }
  return key;
}

}  // namespace tpusim
