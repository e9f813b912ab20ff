// sim/transport/transport.h: how the simulated devices of one run are spread over processes,
// and the few exchanges the processes need besides the program's collectives.
//
// A run has num_ranks() processes ("ranks"); each executes a block of the mesh's devices (see
// assign_devices_to_ranks) on its own threads. Within one process the program's collectives meet
// in memory; between processes they go through the transport: LocalTransport is the one-process
// run (an InProcessCommunicator), MpiTransport (mpi_transport.h, built with OpenMPI) the run
// under `mpirun -np R`. Both give bitwise the same results: every transport computes a device's
// output with combine_collective's fixed group order.
//
// The training loop also needs process-level exchanges (ProcessGroup, process_group.h): the step's
// per-device results on every rank (all_gather), the sharded state on rank 0 for checkpoints and
// verification (gather_to_root), and a checkpoint read by rank 0 on every rank
// (broadcast_from_root).
//
// Example:
//   LocalTransport local;                            // or MpiTransport under mpirun
//   std::vector<int> owner = assign_devices_to_ranks(physical, local.num_ranks(), "v5e-8");
//   auto communicator = local.make_communicator(sizes, owner, std::chrono::seconds(60));
//   std::vector<std::vector<double>> all = local.all_gather({loss});  // one entry per rank
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sharding/mesh.h"
#include "sim/functional/communicator.h"
#include "sim/transport/process_group.h"

namespace tpusim {

// The processes of a run (process_group.h) and the communicator their devices' collectives meet in.
class Transport : public ProcessGroup {
 public:
  // The communicator of a mesh of `sizes` whose device d is executed by rank owner[d]; collectives
  // wait at most `timeout` for the rest of their group.
  virtual std::unique_ptr<Communicator> make_communicator(
      const std::array<int, kNumMeshAxes>& sizes, const std::vector<int>& owner,
      std::chrono::milliseconds timeout) = 0;
};

// One process runs every device.
class LocalTransport final : public Transport {
 public:
  int rank() const override { return 0; }
  int num_ranks() const override { return 1; }
  int ranks_on_host() const override { return 1; }
  bool distributed() const override { return false; }
  std::unique_ptr<Communicator> make_communicator(const std::array<int, kNumMeshAxes>& sizes,
                                                  const std::vector<int>& owner,
                                                  std::chrono::milliseconds timeout) override;
  std::vector<std::vector<double>> all_gather(const std::vector<double>& mine) override {
    return {mine};
  }
  std::vector<std::vector<float>> gather_to_root(const std::vector<float>& mine) override {
    return {mine};
  }
  std::string broadcast_from_root(const std::string& bytes) override { return bytes; }
};

// The rank that executes each mesh device: `ranks` contiguous blocks of the physical device order
// (physical_devices_of_mesh), so a rank owns whole hosts' chips, or consecutive chips of one host,
// as the slice's hosts own them. UserError (exit 2) naming the rank count and `slice_name` when
// `ranks` does not divide the devices.
std::vector<int> assign_devices_to_ranks(const std::vector<int>& physical_of_mesh_device, int ranks,
                                         const std::string& slice_name);

}  // namespace tpusim
