// sim/transport/in_process_communicator.h: collectives between simulated devices that are threads
// of one process.
//
// Each device of the mesh runs its per-device program on its own thread; when a device reaches a
// collective it calls run(), which meets the other members of its group at a rendezvous: every
// member deposits a pointer to its input shard, waits until all have arrived, computes its own
// output with combine_collective() (reading the others' inputs in place, in group order, so the
// result is bitwise identical whatever the scheduling), then waits at a second barrier so that no
// member returns, and frees or overwrites its input, while another may still be reading it.
//
// A rendezvous is identified by (op id, group leader, call count of that op on the device), so a
// repeated region that runs the same collective op many times meets at a new rendezvous each time.
// Requirements: every member of a group calls run() for the same op concurrently (each device on
// its own thread: a pool of fewer workers would deadlock here), and each device calls its
// collectives in the same order. With execution slots set (execution_slots.h), a device gives its
// slot back while it waits at either barrier, so a single slot suffices. A member that waits
// longer than `timeout` throws std::runtime_error naming the op and the devices that did not
// arrive; the rendezvous is then marked failed, so the other members (waiting or arriving later)
// throw too instead of hanging.
//
// Devices map to mesh coordinates row-major over the 12 mesh axes in mesh order (axis 0 major).
//
// Example (mesh data=2 x fsdp=4):
//   std::array<int, kNumMeshAxes> sizes;
//   sizes.fill(1);
//   sizes[mesh_axis_index("data")] = 2;
//   sizes[mesh_axis_index("fsdp")] = 4;
//   InProcessCommunicator communicator(sizes);
//   std::vector<std::thread> threads;
//   for (int d = 0; d < communicator.num_devices(); ++d) {
//     threads.emplace_back([&, d] {
//       const DeviceContext device = InProcessCommunicator::context_for(d, sizes);
//       communicator.run(graph, op, device, inputs[d], outputs[d]);
//     });
//   }
#pragma once

#include <array>
#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sim/functional/communicator.h"

namespace tpusim {

class InProcessCommunicator : public Communicator {
 public:
  explicit InProcessCommunicator(const std::array<int, kNumMeshAxes>& sizes,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~InProcessCommunicator() override;

  InProcessCommunicator(const InProcessCommunicator&) = delete;
  InProcessCommunicator& operator=(const InProcessCommunicator&) = delete;

  // Thread-safe; blocks until the whole group has computed its outputs (see above).
  void run(const Graph& graph, const Op& op, const DeviceContext& device, const TensorData& input,
           TensorData& output) override;
  int num_devices() const override { return num_devices_; }

  const std::array<int, kNumMeshAxes>& sizes() const { return sizes_; }
  // Device index of mesh coordinates (row-major, axis 0 major).
  int device_of(const std::array<int, kNumMeshAxes>& coordinates) const;
  // The context of `device` on a mesh of `sizes`: device, coordinates and sizes filled, the rest
  // default. Throws std::logic_error for a device outside the mesh or a size below 1.
  static DeviceContext context_for(int device, const std::array<int, kNumMeshAxes>& sizes);

 private:
  struct Rendezvous;
  struct Key {
    int op = -1;
    int leader = -1;
    int64_t call = 0;
    auto operator<=>(const Key&) const = default;
  };

  std::array<int, kNumMeshAxes> sizes_;
  std::array<int64_t, kNumMeshAxes> strides_{};
  int num_devices_ = 0;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // guards everything below and every Rendezvous
  std::map<Key, std::shared_ptr<Rendezvous>> rendezvous_;
  std::vector<std::unordered_map<int, int64_t>> calls_;  // per device: calls made, by op id
};

}  // namespace tpusim
