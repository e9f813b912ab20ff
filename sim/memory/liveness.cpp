#include "sim/memory/liveness.h"

#include <algorithm>

namespace tpusim {

Liveness::Liveness(const Graph& graph, const std::vector<TensorId>& final_gradients)
    : graph_(graph) {
  const size_t tensors = graph.tensors().size();
  state_.assign(tensors, false);
  for (const Tensor& tensor : graph.tensors()) {
    state_[index(tensor.id)] =
        graph.producer(tensor.id) < 0 &&
        (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kOptimizerState);
  }
  final_gradient_.assign(tensors, false);
  for (const TensorId grad : final_gradients) {
    final_gradient_[index(grad)] = true;
  }
  carry_source_.assign(tensors, false);
  carry_end_.assign(tensors, false);
  for (const Graph::Carry& carry : graph.carries()) {
    carry_source_[index(carry.from)] = true;
    carry_end_[index(carry.from)] = true;
    carry_end_[index(carry.to)] = true;
  }
  last_reader_.assign(tensors, kNone);
  region_ops_.resize(graph.regions().size());
  for (const Op& op : graph.ops()) {
    region_ops_[static_cast<size_t>(op.region)].push_back(&op);
    for (const TensorId input : op.inputs) {
      last_reader_[index(input)] = op.id;
    }
  }
  // Region by region, the last position reading each tensor (a scratch array by tensor id), then
  // grouped by tensor: a count per tensor, its offsets, and the reads in region order.
  std::vector<std::pair<TensorId, RegionRead>> found;
  std::vector<int> last_in_region(tensors, kNone);
  for (size_t region = 0; region < region_ops_.size(); ++region) {
    const std::vector<const Op*>& ops = region_ops_[region];
    for (size_t position = 0; position < ops.size(); ++position) {
      for (const TensorId input : ops[position]->inputs) {
        last_in_region[index(input)] = static_cast<int>(position);
      }
    }
    for (const Op* op : ops) {
      for (const TensorId input : op->inputs) {
        int& last = last_in_region[index(input)];
        if (last != kNone) {
          found.push_back({input, {static_cast<int>(region), last}});
          last = kNone;
        }
      }
    }
  }
  reads_begin_.assign(tensors + 1, 0);
  for (const auto& [tensor, read] : found) {
    ++reads_begin_[index(tensor) + 1];
  }
  for (size_t tensor = 0; tensor < tensors; ++tensor) {
    reads_begin_[tensor + 1] += reads_begin_[tensor];
  }
  reads_.resize(found.size());
  std::vector<size_t> next(reads_begin_.begin(), reads_begin_.end() - 1);
  for (const auto& [tensor, read] : found) {
    reads_[next[index(tensor)]++] = read;
  }
}

bool Liveness::read_outside_own_region(TensorId id) const {
  const int own = graph_.tensor(id).region;
  return std::any_of(reads_.begin() + static_cast<std::ptrdiff_t>(reads_begin_[index(id)]),
                     reads_.begin() + static_cast<std::ptrdiff_t>(reads_begin_[index(id) + 1]),
                     [own](const RegionRead& read) { return read.region != own; });
}

int Liveness::dies_after(TensorId id) const {
  const int reader = last_reader(id);
  return reader != kNone ? reader : graph_.producer(id);
}

int Liveness::last_use_in_region(TensorId id, int region) const {
  for (size_t read = reads_begin_[index(id)]; read < reads_begin_[index(id) + 1]; ++read) {
    if (reads_[read].region == region) {
      return reads_[read].last_position;
    }
  }
  return kNone;
}

int Liveness::dies_after_in_region(TensorId id, int region, int touched_at) const {
  const int last_use = last_use_in_region(id, region);
  if (last_use != kNone) {
    return std::max(touched_at, last_use);
  }
  return is_carry_source(id) ? kNone : touched_at;
}

std::vector<std::pair<TensorId, TensorId>> local_parameter_grads(const StepProgram& program) {
  const std::vector<TensorId>& local = program.program.local_of_global;
  std::vector<std::pair<TensorId, TensorId>> pairs;
  for (const auto& [parameter, grad] : program.step->parameter_grads) {
    pairs.emplace_back(local[static_cast<size_t>(parameter)], local[static_cast<size_t>(grad)]);
  }
  return pairs;
}

std::vector<TensorId> router_bias_loads(const Graph& graph) {
  constexpr size_t kLoadInput = 4;
  std::vector<TensorId> loads;
  for (const Op& op : graph.ops()) {
    if (op.kind == OpKind::kAdamUpdate && op.inputs.size() > kLoadInput) {
      loads.push_back(op.inputs[kLoadInput]);
    }
  }
  return loads;
}

Liveness program_liveness(const StepProgram& program) {
  std::vector<TensorId> final_gradients;
  for (const auto& [parameter, grad] : local_parameter_grads(program)) {
    final_gradients.push_back(grad);
  }
  for (const TensorId load : router_bias_loads(program.program.graph)) {
    final_gradients.push_back(load);
  }
  return Liveness(program.program.graph, final_gradients);
}

}  // namespace tpusim
