// sim/transport/mpi_communicator.h: collectives between simulated devices on different MPI
// ranks. Built only with TPUSIM_WITH_MPI.
//
// Each rank executes a block of the mesh's devices on its own threads (transport.h). A collective
// call first meets the group's members on this rank in memory, as InProcessCommunicator does; the
// last of them to arrive then exchanges with the group's other ranks, one message per pair of
// ranks and direction, carrying only what the receiving rank's members read:
//   - all-gather, all-to-all, collective permute, reduce-scatter: for each member here, the parts
//     of its input that the outputs of the other rank's members read (input_region_read), a part
//     needed by several of them sent once. Every member then computes its own output with
//     combine_collective over ALL members' inputs in group order (the received parts placed in
//     full-size buffers), exactly as in one process;
//   - all-reduce (when the members' inputs line up element for element, as they do): the array is
//     cut into one chunk per rank of the group; each rank receives the other ranks' members'
//     values of its own chunk, folds ALL members in group order (reduce_into, the arithmetic of
//     combine_collective) and sends the folded chunk to every other rank: 2 (R-1)/R of the array
//     per rank and direction, like a ring all-reduce.
// So the results are bitwise identical to InProcessCommunicator's for any split into ranks. Devices
// of one rank never exchange through MPI; a group within one rank never touches MPI.
//
// Messages are nonblocking and tagged by (op id, group leader, call count mod 8, phase): the
// collectives of different groups between the same ranks never mix, and calls of one group follow
// each other in order (MPI does not overtake messages of one tag). Waits poll against
// `timeout`, giving the execution slot back (execution_slots.h); a timeout throws
// std::runtime_error "rank R: collective <kind> '<op>' (op N, call C) timed out after X s waiting
// for rank(s) ...", and every other wait of the process then gives up too.
//
// Example (through the transport):
//   MpiTransport transport;
//   std::unique_ptr<Communicator> communicator = transport.make_communicator(sizes, owner,
//   timeout);
//   // on the thread of each device this rank owns:
//   communicator->run(graph, op, device, input, output);
#pragma once

#include <array>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sim/functional/communicator.h"

namespace tpusim {

class MpiTransport;

class MpiCommunicator final : public Communicator {
 public:
  // `owner[d]`: the rank executing mesh device d (row-major device numbering, as
  // InProcessCommunicator's).
  MpiCommunicator(MpiTransport& transport, const std::array<int, kNumMeshAxes>& sizes,
                  std::vector<int> owner, std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // For devices this rank owns; thread-safe.
  void run(const Graph& graph, const Op& op, const DeviceContext& device, const TensorData& input,
           TensorData& output) override;
  int num_devices() const override { return num_devices_; }
  CrossProcessTraffic traffic() const override;

 private:
  struct Meeting;
  struct Key {
    int op = -1;
    int leader = -1;
    int64_t call = 0;
    auto operator<=>(const Key&) const = default;
  };

  int device_of(const std::array<int, kNumMeshAxes>& coordinates) const;
  int tag(const Op& op, const Meeting& meeting, int phase) const;
  // std::logic_error unless `device` is a device of this mesh that this rank runs.
  void check_device(const Op& op, const DeviceContext& device) const;
  // Sets up the rendezvous of `group` for `op`'s call `call`: which members this rank holds, and
  // the contexts of the members other ranks hold.
  void open_meeting(Meeting& meeting, const Op& op, const std::vector<int>& group,
                    int64_t call) const;
  // The MPI part of a call, done by the last local member to arrive.
  void exchange(const Graph& graph, const Op& op, Meeting& meeting);
  // Throws unless every member on this rank holds an input of `shape` (the op's local shape).
  static void check_local_inputs(const Graph& graph, const Op& op, const Meeting& meeting,
                                 const std::vector<int64_t>& shape);
  void exchange_parts(const Graph& graph, const Op& op, Meeting& meeting);
  void all_reduce_by_chunks(const Graph& graph, const Op& op, Meeting& meeting);
  bool reduces_element_for_element(const Graph& graph, const Op& op, const Meeting& meeting) const;

  MpiTransport& transport_;
  std::array<int, kNumMeshAxes> sizes_;
  std::array<int64_t, kNumMeshAxes> strides_{};
  int num_devices_ = 0;
  std::vector<int> owner_;
  int rank_ = 0;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // guards the members below and every Meeting
  std::condition_variable changed_;
  std::map<Key, std::shared_ptr<Meeting>> meetings_;
  std::vector<std::unordered_map<int, int64_t>> calls_;  // per device: calls made, by op id
  mutable std::mutex traffic_mutex_;
  CrossProcessTraffic traffic_;
};

}  // namespace tpusim
