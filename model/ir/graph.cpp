#include "model/ir/graph.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace tpusim {

int Graph::add_region(const std::string& name, int64_t repeat, Phase phase, int forward_region,
                      bool shared_parameters) {
  if (repeat < 1) {
    throw std::logic_error("region '" + name + "' must repeat at least once");
  }
  regions_.push_back(Region{name, repeat, phase, forward_region, shared_parameters, {}});
  return static_cast<int>(regions_.size()) - 1;
}

TensorId Graph::add_tensor(std::string name, std::vector<Dim> dims, DType dtype, TensorKind kind,
                           int region, std::string remat_name) {
  Tensor& tensor = append_tensor(dtype, kind, region);
  tensor.name = std::move(name);
  tensor.dims = std::move(dims);
  tensor.remat_name = std::move(remat_name);
  return tensor.id;
}

int Graph::add_op(OpKind kind, std::string name, std::vector<TensorId> inputs,
                  std::vector<TensorId> outputs, OpAttrs attrs, int region) {
  Op& op = append_op(kind, inputs, outputs, region);
  op.name = std::move(name);
  op.attrs = std::move(attrs);
  return op.id;
}

TensorId Graph::add_tensor_copy(std::string_view name, std::span<const Dim> dims, DType dtype,
                                TensorKind kind, int region, std::string_view remat_name) {
  Tensor& tensor = append_tensor(dtype, kind, region);
  tensor.name.assign(name);
  tensor.dims.assign(dims.begin(), dims.end());
  tensor.remat_name.assign(remat_name);
  return tensor.id;
}

Tensor& Graph::append_tensor(DType dtype, TensorKind kind, int region) {
  Tensor& tensor = tensors_.emplace_back();
  tensor.id = static_cast<TensorId>(tensors_.size()) - 1;
  tensor.dtype = dtype;
  tensor.kind = kind;
  tensor.region = region;
  producer_.push_back(-1);
  return tensor;
}

int Graph::add_op_copy(OpKind kind, std::string_view name, std::span<const TensorId> inputs,
                       std::span<const TensorId> outputs, const OpAttrs& attrs, int region) {
  Op& op = append_op(kind, inputs, outputs, region);
  op.name.assign(name);
  op.attrs = attrs;
  return op.id;
}

Op& Graph::append_op(OpKind kind, std::span<const TensorId> inputs,
                     std::span<const TensorId> outputs, int region) {
  const int id = static_cast<int>(ops_.size());
  const Phase phase = regions_.at(static_cast<size_t>(region)).phase;
  set_producer(outputs, id);
  // Built in place: an Op is 400 bytes, and programs add thousands of them.
  Op& op = ops_.emplace_back();
  op.id = id;
  op.kind = kind;
  op.inputs.assign(inputs.begin(), inputs.end());
  op.outputs.assign(outputs.begin(), outputs.end());
  op.region = region;
  op.phase = phase;
  return op;
}

void Graph::set_producer(std::span<const TensorId> outputs, int id) {
  for (const TensorId output : outputs) {
    if (producer_.at(static_cast<size_t>(output)) >= 0) {
      throw std::logic_error("tensor '" + tensor(output).name + "' is written by two ops");
    }
    producer_[static_cast<size_t>(output)] = id;
  }
}

void Graph::replace_ops(Ops ops) {
  ops_ = std::move(ops);
  std::fill(producer_.begin(), producer_.end(), -1);
  for (size_t index = 0; index < ops_.size(); ++index) {
    Op& op = ops_[index];
    op.id = static_cast<int>(index);
    if (static_cast<size_t>(op.region) >= regions_.size()) {
      throw std::logic_error("op '" + op.name + "' is in no region of the graph");
    }
    set_producer({op.outputs.data(), op.outputs.size()}, op.id);
  }
}

int Graph::producer(TensorId id) const {
  return producer_.at(static_cast<size_t>(id));
}

std::string Graph::to_text(int only_region) const {
  std::ostringstream out;
  for (size_t region_id = 0; region_id < regions_.size(); ++region_id) {
    if (only_region >= 0 && static_cast<int>(region_id) != only_region) {
      continue;
    }
    const Region& region = regions_[region_id];
    out << "region " << region.name << " x" << region.repeat << " (" << phase_name(region.phase)
        << ")\n";
    for (const Op& op : ops_) {
      if (op.region != static_cast<int>(region_id)) {
        continue;
      }
      out << "  " << op_kind_name(op.kind);
      if (op.kind == OpKind::kElementwise) {
        out << "." << elementwise_name(op.attrs.function);
      }
      out << " " << op.name << " (";
      for (size_t index = 0; index < op.inputs.size(); ++index) {
        out << (index == 0 ? "" : ", ") << tensor(op.inputs[index]).describe();
      }
      out << ") -> ";
      for (size_t index = 0; index < op.outputs.size(); ++index) {
        out << (index == 0 ? "" : ", ") << tensor(op.outputs[index]).describe();
      }
      if (!op.attrs.contracted.empty()) {
        out << " contract {";
        for (size_t index = 0; index < op.attrs.contracted.size(); ++index) {
          out << (index == 0 ? "" : ",") << op.attrs.contracted[index];
        }
        out << "}";
      }
      if (!op.attrs.mesh_axes.empty()) {
        out << " over {";
        for (size_t index = 0; index < op.attrs.mesh_axes.size(); ++index) {
          out << (index == 0 ? "" : ",") << op.attrs.mesh_axes[index];
        }
        // The per-device array the collective gathers into or reduces (V of the cost formulas).
        const TensorId measured = op.kind == OpKind::kAllGather ? op.outputs[0] : op.inputs[0];
        out << "} group " << op.attrs.group_size << " bytes " << tensor(measured).bytes();
      }
      if (op.attrs.routed_fraction < 1) {
        // Ragged (dropless MoE): FLOPs and bytes count this fraction of the rows.
        out << " routed " << op.attrs.routed_fraction;
      }
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace tpusim
