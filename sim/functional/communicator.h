// sim/functional/communicator.h: how the functional engine executes the collectives of a
// per-device program.
//
// A Communicator runs ONE collective op (all-gather, reduce-scatter, all-reduce, all-to-all,
// collective permute) for ONE device: every device of the op's group calls run() for the same op,
// each with its own input shard, and each receives its own output shard. Transports differ in how
// the shards travel (threads of one process sharing memory, OpenMPI ranks, ...); all of them give
// the same results because they compute them with combine_collective() below, in the group order
// of collective_group().
//
// Semantics, by GLOBAL indices: the op's input and output are two local layouts of the same global
// tensor (same dims, in the same order; Dim::sharded_over and Dim::global_size say how each dim is
// split). Device d's shard of a dim covers the global indices [d.offset(dim), d.offset(dim) +
// dim.size). For every element of the output shard:
//   - all-gather, all-to-all, collective permute: the value of the unique group member whose input
//     shard holds that global element (an error when no member holds it);
//   - reduce-scatter, all-reduce: the combination of ALL members' values at that global index, in
//     group order: ReduceOp::kSum is a left-to-right float sum; ReduceOp::kLogSumExp combines the
//     (max, sum of exp(x - max), target) triples of the input's last dim pairwise:
//       m = max(m1, m2), s = s1 * exp(m1 - m) + s2 * exp(m2 - m), t = t1 + t2.
// Output elements whose global index lies in the padding of a dim (>= its global size, when the
// size does not divide evenly among the shards) are zero.
//
// Example (8 devices, mesh data=2 x fsdp=4, a [batch:8@fsdp (global 32), embed:4] shard gathered
// into [batch:32, embed:4] over fsdp: two independent groups {0,1,2,3} and {4,5,6,7}):
//   InProcessCommunicator communicator(sizes);             // see in_process_communicator.h
//   // on the thread of device d:
//   DeviceContext device = InProcessCommunicator::context_for(d, sizes);
//   TensorData gathered;
//   communicator.run(graph, op, device, shard, gathered);  // blocks until the group has arrived
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/ir/graph.h"
#include "sharding/mesh.h"
#include "sim/functional/device_context.h"
#include "sim/functional/execution_slots.h"
#include "sim/functional/tensor_data.h"

namespace tpusim {

// What a transport moved between processes for collectives, cumulative for this process.
struct CrossProcessTraffic {
  double bytes_sent = 0;  // payload this process sent (values travel as fp32)
  int64_t messages = 0;
  // The network model's traffic (sim/perf/collective_cost.h: (N-1)/N x V per device for
  // all-gather, reduce-scatter and all-to-all, 2 (N-1)/N x V for all-reduce, V for a permute) of
  // the collectives whose group spans processes, summed over this process's members: with V in
  // the IR's dtypes (what `tpusim program` prints), and with fp32 elements as the engine moves.
  double model_bytes = 0;
  double model_bytes_f32 = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Executes collective `op` (one input, one output) of the per-device program `graph` for
  // `device`. Every member of the device's group (collective_group over op.attrs.mesh_axes) must
  // call run() for the same op, and every device must call its collectives in the same order each
  // time. `output` is resized to the local shape of graph.tensor(op.outputs[0]) when its shape
  // differs, and must not alias `input`. Throws std::runtime_error when the group cannot complete
  // (a member never arrives) and std::logic_error when the op or the shards are inconsistent.
  virtual void run(const Graph& graph, const Op& op, const DeviceContext& device,
                   const TensorData& input, TensorData& output) = 0;

  // Devices this communicator connects (the product of the mesh axis sizes).
  virtual int num_devices() const = 0;

  // Traffic between processes so far (zero for a transport within one process).
  virtual CrossProcessTraffic traffic() const { return {}; }

  // The slots that bound how many devices compute at once (execution_slots.h): a device's thread
  // holds one when it calls run(), and run() gives it back while it waits for other devices.
  // nullptr (the default): no bound. Set before any run().
  void set_execution_slots(ExecutionSlots* slots) { slots_ = slots; }

 protected:
  // Transports call these around every wait for other devices: leave_slot() before waiting,
  // reenter_slot() after, never while holding a lock another device needs to make progress.
  void leave_slot() const {
    if (slots_ != nullptr) {
      slots_->release();
    }
  }
  void reenter_slot() const {
    if (slots_ != nullptr) {
      slots_->acquire();
    }
  }
  // Runs `wait` (which takes no lock other devices need) out of this device's slot, back in it
  // afterwards whether it returns or throws.
  template <typename Wait>
  void outside_slot(const Wait& wait) const {
    leave_slot();
    try {
      wait();
    } catch (...) {
      reenter_slot();
      throw;
    }
    reenter_slot();
  }

 private:
  ExecutionSlots* slots_ = nullptr;
};

// Row-major device numbering of a mesh (axis 0 major), shared by every transport: the stride of
// each axis, with the device count in `total`. Throws std::logic_error for a size below 1.
std::array<int64_t, kNumMeshAxes> mesh_strides(const std::array<int, kNumMeshAxes>& sizes,
                                               int64_t& total);
// The device at `coordinates` under that numbering; std::logic_error outside the mesh.
int mesh_device_index(const std::array<int, kNumMeshAxes>& coordinates,
                      const std::array<int, kNumMeshAxes>& sizes,
                      const std::array<int64_t, kNumMeshAxes>& strides);

// The devices of `device`'s group over `mesh_axes`: those sharing all of its coordinates except on
// `mesh_axes`, ordered by their coordinates on `mesh_axes` (the first listed axis major). This
// order is THE reduction order of every transport. `device_of_coordinates` maps a full coordinate
// array to a device index. Throws std::logic_error for a repeated axis (unknown axes: UserError
// from mesh_axis_index).
std::vector<int> collective_group(
    const DeviceContext& device, const std::vector<std::string>& mesh_axes,
    const std::function<int(const std::array<int, kNumMeshAxes>&)>& device_of_coordinates);

// Computes `self`'s output of collective `op` from the inputs of every group member, given in
// group order (`members[i]` is the context of the device whose input is `member_inputs[i]`).
// Writes `output` (resized to the local shape of graph.tensor(op.outputs[0]) if needed). Throws
// std::logic_error when an input has the wrong shape, when an element has no holder (or, for the
// copying collectives, several), or when a member does not hold a reduced element.
void combine_collective(const Graph& graph, const Op& op,
                        const std::vector<const DeviceContext*>& members,
                        const std::vector<const TensorData*>& member_inputs,
                        const DeviceContext& self, TensorData& output);

// --- For transports that move only what each device needs (mpi_communicator.h). ---

// A box of local positions of a tensor: positions [lo[d], hi[d]) on each dim d.
struct LocalBox {
  std::vector<int64_t> lo;
  std::vector<int64_t> hi;
  int64_t volume() const;  // 0 when any dim is empty; 1 for a rank-0 box
  bool operator==(const LocalBox&) const = default;
};

// The positions of `member`'s input of collective `op` that combine_collective reads to compute
// `reader`'s output; every other input element is never read for that output, so a transport may
// leave it unset (volume 0: the reader needs nothing from the member).
LocalBox input_region_read(const Graph& graph, const Op& op, const DeviceContext& member,
                           const DeviceContext& reader);

// One step of a reducing collective's fold, the very arithmetic combine_collective applies member
// by member in group order: accumulator[i] = accumulator[i] (+) values[i] for `count` elements
// (kSum: float addition; kLogSumExp: the triple combination above, `count` a multiple of 3).
void reduce_into(ReduceOp reduce, float* accumulator, const float* values, int64_t count);

// Zeroes the positions of `self`'s output of `op` in the padding of a dim (global index >= the
// dim's global size), as combine_collective leaves them. `output` has the output's local shape.
void zero_output_padding(const Graph& graph, const Op& op, const DeviceContext& self,
                         TensorData& output);

}  // namespace tpusim
