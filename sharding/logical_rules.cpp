#include "sharding/logical_rules.h"

#include <algorithm>
#include <set>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {

LogicalAxisRules LogicalAxisRules::from_rules(std::vector<LogicalRule> rules) {
  for (const LogicalRule& rule : rules) {
    for (const std::string& axis : rule.mesh_axes) {
      try {
        mesh_axis_index(axis);
      } catch (const UserError& error) {
        throw UserError("logical_axis_rules: rule '" + rule.logical + "' names " + error.what());
      }
    }
  }
  LogicalAxisRules result;
  result.rules_ = std::move(rules);
  return result;
}

LogicalAxisRules LogicalAxisRules::from_config(const Config& config) {
  const YAML::Node node = config.get_node("logical_axis_rules");
  std::vector<LogicalRule> rules;
  for (const YAML::Node& entry : node) {
    if (!entry.IsSequence() || entry.size() != 2 || !entry[0].IsScalar()) {
      throw UserError(
          "logical_axis_rules: each rule must be [logical_name, [mesh axes]], got an "
          "entry with " +
          std::to_string(entry.size()) + " item(s)");
    }
    LogicalRule rule;
    rule.logical = entry[0].Scalar();
    const YAML::Node axes = entry[1];
    if (axes.IsScalar()) {
      rule.mesh_axes.push_back(axes.Scalar());
    } else if (axes.IsSequence()) {
      for (const YAML::Node& axis : axes) {
        if (!axis.IsScalar()) {
          throw UserError("logical_axis_rules: rule '" + rule.logical +
                          "' must list mesh axis names");
        }
        rule.mesh_axes.push_back(axis.Scalar());
      }
    } else if (!axes.IsNull()) {
      throw UserError("logical_axis_rules: rule '" + rule.logical + "' must list mesh axis names");
    }
    rules.push_back(std::move(rule));
  }
  return from_rules(std::move(rules));
}

std::vector<std::vector<int>> LogicalAxisRules::shard_dims(const std::vector<Dim>& tensor_dims,
                                                           const MeshShape& mesh) const {
  // A merged dim ("activation_batch_no_exp+activation_length") resolves each part as its own
  // dim, then takes the union of their axes.
  std::vector<Dim> dims;
  std::vector<size_t> owner;
  for (size_t index = 0; index < tensor_dims.size(); ++index) {
    const std::string& logical = tensor_dims[index].logical;
    size_t start = 0;
    while (true) {
      const size_t plus = logical.find('+', start);
      Dim part = tensor_dims[index];
      part.logical =
          logical.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
      dims.push_back(part);
      owner.push_back(index);
      if (plus == std::string::npos) {
        break;
      }
      start = plus + 1;
    }
  }
  std::vector<std::vector<std::string>> assigned(dims.size());
  std::vector<bool> done(dims.size(), false);
  std::set<std::string> used;
  for (const LogicalRule& rule : rules_) {
    size_t target = dims.size();
    for (size_t index = 0; index < dims.size(); ++index) {
      if (!done[index] && dims[index].logical == rule.logical) {
        target = index;
        break;
      }
    }
    if (target == dims.size()) {
      continue;
    }
    const bool conflict = std::any_of(rule.mesh_axes.begin(), rule.mesh_axes.end(),
                                      [&](const std::string& axis) { return used.contains(axis); });
    if (conflict) {
      continue;
    }
    assigned[target] = rule.mesh_axes;
    done[target] = true;
    used.insert(rule.mesh_axes.begin(), rule.mesh_axes.end());
  }
  std::vector<std::vector<int>> result(tensor_dims.size());
  for (size_t index = 0; index < dims.size(); ++index) {
    for (const std::string& axis : assigned[index]) {
      const int axis_index = mesh_axis_index(axis);
      if (mesh.size(axis_index) > 1) {
        result[owner[index]].push_back(axis_index);
      }
    }
  }
  return result;
}

}  // namespace tpusim
