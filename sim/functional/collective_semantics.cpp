// The transport-independent semantics of collectives (see communicator.h): group membership and
// the computation of one device's output from the inputs of its group, by global indices.
//
// Every member's shard, seen from the output shard, is a box (one interval per dim): the output
// positions whose global index the member holds. Copying collectives copy each member's box (the
// boxes must be disjoint and cover the output); reducing collectives check that every member holds
// the whole output and fold the members in group order, one member at a time over the whole box,
// which keeps the per-element order fixed (bitwise deterministic) and the inner loops contiguous.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ir/op_kind_traits.h"
#include "sim/functional/communicator.h"

namespace tpusim {
namespace {

struct Interval {
  int64_t lo = 0;
  int64_t hi = 0;  // exclusive
  bool empty() const { return hi <= lo; }
};

[[noreturn]] void fail(const Op& op, const std::string& message) {
  throw std::logic_error(std::string(op_kind_name(op.kind)) + " '" + op.name + "' (op " +
                         std::to_string(op.id) + "): " + message);
}

std::vector<int64_t> local_shape(const Tensor& tensor) {
  std::vector<int64_t> shape;
  shape.reserve(tensor.dims.size());
  for (const Dim& dim : tensor.dims) {
    shape.push_back(dim.size);
  }
  return shape;
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t dim = shape.size(); dim-- > 1;) {
    strides[dim - 1] = strides[dim] * shape[dim];
  }
  return strides;
}

// Global size of a dim: indices at or beyond it are padding (none when unknown).
int64_t global_extent(const Dim& dim) {
  return dim.global_size > 0 ? dim.global_size : std::numeric_limits<int64_t>::max();
}

std::string describe_shape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t dim = 0; dim < shape.size(); ++dim) {
    text += (dim == 0 ? "" : ",") + std::to_string(shape[dim]);
  }
  return text + "]";
}

// Calls fn(out_flat, in_flat, count) for each run of `count` consecutive output elements along the
// last dim of the box, where input position = output position + shift on every dim. A rank-0 box
// is one element.
template <typename Fn>
void for_each_row(const std::vector<Interval>& box, const std::vector<int64_t>& out_strides,
                  const std::vector<int64_t>& in_strides, const std::vector<int64_t>& shift,
                  Fn&& fn) {
  const size_t rank = box.size();
  if (rank == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  for (const Interval& interval : box) {
    if (interval.empty()) {
      return;
    }
  }
  const size_t last = rank - 1;
  const int64_t count = box[last].hi - box[last].lo;
  std::vector<int64_t> position(rank);
  for (size_t dim = 0; dim < rank; ++dim) {
    position[dim] = box[dim].lo;
  }
  while (true) {
    int64_t out_flat = 0;
    int64_t in_flat = 0;
    for (size_t dim = 0; dim < rank; ++dim) {
      out_flat += position[dim] * out_strides[dim];
      in_flat += (position[dim] + shift[dim]) * in_strides[dim];
    }
    fn(out_flat, in_flat, count);
    // Advance the odometer over all dims but the last.
    size_t dim = last;
    while (dim > 0) {
      --dim;
      if (++position[dim] < box[dim].hi) {
        break;
      }
      position[dim] = box[dim].lo;
      if (dim == 0) {
        return;
      }
    }
    if (last == 0) {
      return;
    }
  }
}

struct Layouts {
  const Tensor* input = nullptr;
  const Tensor* output = nullptr;
  std::vector<int64_t> input_shape;
  std::vector<int64_t> output_shape;
  std::vector<int64_t> input_strides;
  std::vector<int64_t> output_strides;
  std::vector<int64_t> output_offset;  // self's global offset per dim
  std::vector<int64_t> valid;          // output positions [0, valid) are not padding
};

Layouts make_layouts(const Graph& graph, const Op& op, const DeviceContext& self) {
  if (!is_collective(op.kind)) {
    fail(op, "not a collective");
  }
  if (op.inputs.size() != 1 || op.outputs.size() != 1) {
    fail(op, "a collective has one input and one output");
  }
  Layouts layouts;
  layouts.input = &graph.tensor(op.inputs[0]);
  layouts.output = &graph.tensor(op.outputs[0]);
  const std::vector<Dim>& in_dims = layouts.input->dims;
  const std::vector<Dim>& out_dims = layouts.output->dims;
  if (in_dims.size() != out_dims.size()) {
    fail(op, "input " + layouts.input->describe() + " and output " + layouts.output->describe() +
                 " differ in rank");
  }
  for (size_t dim = 0; dim < in_dims.size(); ++dim) {
    if (in_dims[dim].name != out_dims[dim].name) {
      fail(op, "input " + layouts.input->describe() + " and output " + layouts.output->describe() +
                   " differ in dim " + std::to_string(dim));
    }
  }
  layouts.input_shape = local_shape(*layouts.input);
  layouts.output_shape = local_shape(*layouts.output);
  layouts.input_strides = row_major_strides(layouts.input_shape);
  layouts.output_strides = row_major_strides(layouts.output_shape);
  for (const Dim& dim : out_dims) {
    const int64_t offset = self.offset(dim);
    layouts.output_offset.push_back(offset);
    layouts.valid.push_back(std::clamp<int64_t>(global_extent(dim) - offset, 0, dim.size));
  }
  return layouts;
}

// The output positions (of the valid part) whose global index `member` holds, and the shift from
// output position to the member's input position on each dim.
std::vector<Interval> member_box(const Layouts& layouts, const DeviceContext& member,
                                 std::vector<int64_t>& shift) {
  const std::vector<Dim>& in_dims = layouts.input->dims;
  std::vector<Interval> box(in_dims.size());
  shift.assign(in_dims.size(), 0);
  for (size_t dim = 0; dim < in_dims.size(); ++dim) {
    const int64_t start = member.offset(in_dims[dim]) - layouts.output_offset[dim];
    shift[dim] = -start;
    box[dim].lo = std::max<int64_t>(start, 0);
    box[dim].hi = std::min<int64_t>(start + in_dims[dim].size, layouts.valid[dim]);
  }
  return box;
}

bool overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  for (size_t dim = 0; dim < a.size(); ++dim) {
    if (std::max(a[dim].lo, b[dim].lo) >= std::min(a[dim].hi, b[dim].hi)) {
      return false;
    }
  }
  return true;
}

int64_t volume(const std::vector<Interval>& box) {
  int64_t count = 1;
  for (const Interval& interval : box) {
    count *= std::max<int64_t>(interval.hi - interval.lo, 0);
  }
  return count;
}

// Error path of a copying collective: names the first output element no member holds.
[[noreturn]] void fail_uncovered(const Op& op, const Layouts& layouts,
                                 const std::vector<std::vector<Interval>>& boxes,
                                 const DeviceContext& self) {
  const size_t rank = layouts.valid.size();
  std::vector<int64_t> position(rank, 0);
  // Enumerate the valid positions in row-major order (error path only: divisions are fine here).
  std::vector<Interval> valid(rank);
  for (size_t dim = 0; dim < rank; ++dim) {
    valid[dim] = {0, layouts.valid[dim]};
  }
  const int64_t count = volume(valid);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat;
    for (size_t dim = rank; dim-- > 0;) {
      position[dim] = rest % layouts.valid[dim];
      rest /= layouts.valid[dim];
    }
    bool held = false;
    for (const std::vector<Interval>& box : boxes) {
      bool inside = true;
      for (size_t dim = 0; dim < rank; ++dim) {
        inside = inside && position[dim] >= box[dim].lo && position[dim] < box[dim].hi;
      }
      held = held || inside;
    }
    if (!held) {
      std::string index;
      for (size_t dim = 0; dim < rank; ++dim) {
        index += (dim == 0 ? "" : ",") + layouts.output->dims[dim].name + "=" +
                 std::to_string(position[dim] + layouts.output_offset[dim]);
      }
      fail(op, "no group member holds global element [" + index + "] of device " +
                   std::to_string(self.device) + "'s output " + layouts.output->describe());
    }
  }
  fail(op, "group members do not cover device " + std::to_string(self.device) + "'s output");
}

void copy_collective(const Op& op, const Layouts& layouts,
                     const std::vector<const DeviceContext*>& members,
                     const std::vector<const TensorData*>& member_inputs, const DeviceContext& self,
                     TensorData& output) {
  std::fill(output.values.begin(), output.values.end(), 0.0f);
  std::vector<std::vector<Interval>> boxes;
  std::vector<int64_t> shift;
  int64_t covered = 0;
  for (size_t member = 0; member < members.size(); ++member) {
    std::vector<Interval> box = member_box(layouts, *members[member], shift);
    if (volume(box) == 0) {
      continue;
    }
    for (size_t other = 0; other < boxes.size(); ++other) {
      if (overlap(boxes[other], box)) {
        fail(op, "devices " + std::to_string(members[other]->device) + " and " +
                     std::to_string(members[member]->device) + " both hold elements of device " +
                     std::to_string(self.device) + "'s output " + layouts.output->describe());
      }
    }
    const float* source = member_inputs[member]->values.data();
    float* target = output.values.data();
    for_each_row(box, layouts.output_strides, layouts.input_strides, shift,
                 [&](int64_t out_flat, int64_t in_flat, int64_t count) {
                   std::memcpy(target + out_flat, source + in_flat,
                               static_cast<size_t>(count) * sizeof(float));
                 });
    covered += volume(box);
    boxes.push_back(std::move(box));
  }
  std::vector<Interval> valid(layouts.valid.size());
  for (size_t dim = 0; dim < valid.size(); ++dim) {
    valid[dim] = {0, layouts.valid[dim]};
  }
  if (covered != volume(valid)) {
    fail_uncovered(op, layouts, boxes, self);
  }
}

void reduce_collective(const Op& op, const Layouts& layouts,
                       const std::vector<const DeviceContext*>& members,
                       const std::vector<const TensorData*>& member_inputs,
                       const DeviceContext& self, TensorData& output) {
  const size_t rank = layouts.valid.size();
  std::vector<Interval> valid(rank);
  bool padded = false;
  for (size_t dim = 0; dim < rank; ++dim) {
    valid[dim] = {0, layouts.valid[dim]};
    padded = padded || layouts.valid[dim] < layouts.output_shape[dim];
  }
  const bool log_sum_exp = op.attrs.reduce == ReduceOp::kLogSumExp;
  if (log_sum_exp && (rank == 0 || layouts.output_shape[rank - 1] != 3 ||
                      layouts.input_shape[rank - 1] != 3 || layouts.valid[rank - 1] != 3)) {
    fail(op,
         "a log-sum-exp reduction needs (max, sum, target) triples in an unsplit last dim, got " +
             layouts.input->describe());
  }
  // Every member must hold every (valid) output element, at its own input position.
  std::vector<std::vector<int64_t>> shifts(members.size());
  for (size_t member = 0; member < members.size(); ++member) {
    const std::vector<Interval> box = member_box(layouts, *members[member], shifts[member]);
    for (size_t dim = 0; dim < rank; ++dim) {
      if (valid[dim].empty()) {
        continue;
      }
      if (box[dim].lo != valid[dim].lo || box[dim].hi != valid[dim].hi) {
        const Dim& in_dim = layouts.input->dims[dim];
        const int64_t offset = members[member]->offset(in_dim);
        fail(op, "device " + std::to_string(members[member]->device) + " holds global [" +
                     std::to_string(offset) + ", " + std::to_string(offset + in_dim.size) +
                     ") of dim " + in_dim.name + " but device " + std::to_string(self.device) +
                     "'s output needs [" + std::to_string(layouts.output_offset[dim]) + ", " +
                     std::to_string(layouts.output_offset[dim] + layouts.valid[dim]) + ")");
      }
    }
  }
  if (padded) {
    std::fill(output.values.begin(), output.values.end(), 0.0f);
  }
  float* target = output.values.data();
  for (size_t member = 0; member < members.size(); ++member) {
    const float* source = member_inputs[member]->values.data();
    if (member == 0) {
      for_each_row(valid, layouts.output_strides, layouts.input_strides, shifts[member],
                   [&](int64_t out_flat, int64_t in_flat, int64_t count) {
                     std::memcpy(target + out_flat, source + in_flat,
                                 static_cast<size_t>(count) * sizeof(float));
                   });
    } else {
      for_each_row(valid, layouts.output_strides, layouts.input_strides, shifts[member],
                   [&](int64_t out_flat, int64_t in_flat, int64_t count) {
                     reduce_into(op.attrs.reduce, target + out_flat, source + in_flat, count);
                   });
    }
  }
}

}  // namespace

std::vector<int> collective_group(
    const DeviceContext& device, const std::vector<std::string>& mesh_axes,
    const std::function<int(const std::array<int, kNumMeshAxes>&)>& device_of_coordinates) {
  std::vector<size_t> axes;
  int64_t count = 1;
  for (const std::string& name : mesh_axes) {
    const size_t axis = static_cast<size_t>(mesh_axis_index(name));
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) {
      throw std::logic_error("collective group: mesh axis " + name + " listed twice");
    }
    if (device.sizes[axis] < 1) {
      throw std::logic_error("collective group: mesh axis " + name + " has size " +
                             std::to_string(device.sizes[axis]));
    }
    axes.push_back(axis);
    count *= device.sizes[axis];
  }
  std::vector<int> group;
  group.reserve(static_cast<size_t>(count));
  std::array<int, kNumMeshAxes> coordinates = device.coordinates;
  for (int64_t rank = 0; rank < count; ++rank) {
    int64_t rest = rank;
    for (size_t index = axes.size(); index-- > 0;) {
      const int size = device.sizes[axes[index]];
      coordinates[axes[index]] = static_cast<int>(rest % size);
      rest /= size;
    }
    group.push_back(device_of_coordinates(coordinates));
  }
  return group;
}

void combine_collective(const Graph& graph, const Op& op,
                        const std::vector<const DeviceContext*>& members,
                        const std::vector<const TensorData*>& member_inputs,
                        const DeviceContext& self, TensorData& output) {
  const Layouts layouts = make_layouts(graph, op, self);
  if (members.empty() || members.size() != member_inputs.size()) {
    fail(op, std::to_string(members.size()) + " group members with " +
                 std::to_string(member_inputs.size()) + " inputs");
  }
  if (op.attrs.group_size > 1 && static_cast<size_t>(op.attrs.group_size) != members.size()) {
    fail(op, "group of " + std::to_string(members.size()) + " devices, the op expects " +
                 std::to_string(op.attrs.group_size));
  }
  int64_t input_count = 1;
  for (const int64_t size : layouts.input_shape) {
    input_count *= size;
  }
  for (size_t member = 0; member < members.size(); ++member) {
    const TensorData* input = member_inputs[member];
    if (members[member] == nullptr || input == nullptr) {
      fail(op, "missing input of group member " + std::to_string(member));
    }
    if (input == &output) {
      fail(op, "the output aliases device " + std::to_string(members[member]->device) + "'s input");
    }
    if (input->shape != layouts.input_shape || input->size() != input_count) {
      fail(op, "device " + std::to_string(members[member]->device) + "'s input has shape " +
                   describe_shape(input->shape) + ", expected " +
                   describe_shape(layouts.input_shape) + " of " + layouts.input->describe());
    }
  }
  int64_t output_count = 1;
  for (const int64_t size : layouts.output_shape) {
    output_count *= size;
  }
  // (A default TensorData has the shape of a scalar but no value.)
  if (output.shape != layouts.output_shape || output.size() != output_count) {
    output = TensorData::zeros(layouts.output_shape);
  }
  if (op.kind == OpKind::kCollectivePermute && op.attrs.ring_shift != 0) {
    // Around the ring: the member ring_shift positions before this one sends its whole input.
    const auto size = static_cast<int64_t>(members.size());
    int64_t position = -1;
    for (int64_t member = 0; member < size; ++member) {
      if (members[static_cast<size_t>(member)]->device == self.device) {
        position = member;
      }
    }
    if (position < 0 || layouts.input_shape != layouts.output_shape) {
      fail(op, "a ring permute needs the device in its group and equal input and output shapes");
    }
    const int64_t source = ((position - op.attrs.ring_shift) % size + size) % size;
    output.values = member_inputs[static_cast<size_t>(source)]->values;
    return;
  }
  switch (op_kind_traits(op.kind).collective) {
    case Collective::kAllGather:
    case Collective::kAllToAll:
    case Collective::kCollectivePermute:
      copy_collective(op, layouts, members, member_inputs, self, output);
      return;
    case Collective::kReduceScatter:
    case Collective::kAllReduce:
      reduce_collective(op, layouts, members, member_inputs, self, output);
      return;
    case Collective::kNone:
      break;
  }
  fail(op, "not a collective");
}

int64_t LocalBox::volume() const {
  int64_t count = 1;
  for (size_t dim = 0; dim < lo.size(); ++dim) {
    count *= std::max<int64_t>(hi[dim] - lo[dim], 0);
  }
  return count;
}

LocalBox input_region_read(const Graph& graph, const Op& op, const DeviceContext& member,
                           const DeviceContext& reader) {
  const Layouts layouts = make_layouts(graph, op, reader);
  std::vector<int64_t> shift;
  const std::vector<Interval> box = member_box(layouts, member, shift);
  LocalBox region;
  bool empty = false;
  for (size_t dim = 0; dim < box.size(); ++dim) {
    empty = empty || box[dim].empty();
    region.lo.push_back(box[dim].lo + shift[dim]);
    region.hi.push_back(box[dim].hi + shift[dim]);
  }
  if (empty) {
    for (size_t dim = 0; dim < box.size(); ++dim) {
      region.hi[dim] = region.lo[dim];
    }
  }
  return region;
}

void reduce_into(ReduceOp reduce, float* accumulator, const float* values, int64_t count) {
  if (reduce != ReduceOp::kLogSumExp) {
    for (int64_t index = 0; index < count; ++index) {
      accumulator[index] += values[index];
    }
    return;
  }
  for (int64_t index = 0; index + 3 <= count; index += 3) {
    float* out = accumulator + index;
    const float* in = values + index;
    const float m1 = out[0];
    const float m2 = in[0];
    const float m = std::max(m1, m2);
    // Equal maxima (also both -inf) weigh 1: exp(-inf - -inf) would be NaN.
    const float w1 = m1 == m ? 1.0f : std::exp(m1 - m);
    const float w2 = m2 == m ? 1.0f : std::exp(m2 - m);
    out[0] = m;
    out[1] = out[1] * w1 + in[1] * w2;
    out[2] = out[2] + in[2];
  }
}

void zero_output_padding(const Graph& graph, const Op& op, const DeviceContext& self,
                         TensorData& output) {
  const Layouts layouts = make_layouts(graph, op, self);
  const size_t rank = layouts.valid.size();
  bool padded = false;
  for (size_t dim = 0; dim < rank; ++dim) {
    padded = padded || layouts.valid[dim] < layouts.output_shape[dim];
  }
  if (!padded) {
    return;
  }
  // Keep the valid box, zero the rest.
  std::vector<float> kept(output.values.size(), 0.0f);
  std::vector<Interval> valid(rank);
  for (size_t dim = 0; dim < rank; ++dim) {
    valid[dim] = {0, layouts.valid[dim]};
  }
  const std::vector<int64_t> no_shift(rank, 0);
  for_each_row(valid, layouts.output_strides, layouts.output_strides, no_shift,
               [&](int64_t out_flat, int64_t in_flat, int64_t count) {
                 std::memcpy(kept.data() + out_flat, output.values.data() + in_flat,
                             static_cast<size_t>(count) * sizeof(float));
               });
  output.values = std::move(kept);
}

std::array<int64_t, kNumMeshAxes> mesh_strides(const std::array<int, kNumMeshAxes>& sizes,
                                               int64_t& total) {
  std::array<int64_t, kNumMeshAxes> strides{};
  total = 1;
  for (size_t axis = kNumMeshAxes; axis-- > 0;) {
    if (sizes[axis] < 1) {
      throw std::logic_error("mesh axis " + mesh_axis_names()[axis] + " has size " +
                             std::to_string(sizes[axis]));
    }
    strides[axis] = total;
    total *= sizes[axis];
  }
  return strides;
}

int mesh_device_index(const std::array<int, kNumMeshAxes>& coordinates,
                      const std::array<int, kNumMeshAxes>& sizes,
                      const std::array<int64_t, kNumMeshAxes>& strides) {
  int64_t device = 0;
  for (size_t axis = 0; axis < kNumMeshAxes; ++axis) {
    if (coordinates[axis] < 0 || coordinates[axis] >= sizes[axis]) {
      throw std::logic_error("coordinate " + std::to_string(coordinates[axis]) + " on mesh axis " +
                             mesh_axis_names()[axis] + " of size " + std::to_string(sizes[axis]));
    }
    device += coordinates[axis] * strides[axis];
  }
  return static_cast<int>(device);
}

}  // namespace tpusim
