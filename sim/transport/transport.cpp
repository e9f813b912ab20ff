#include "sim/transport/transport.h"

#include <stdexcept>

#include "common/error.h"
#include "sim/transport/in_process_communicator.h"

namespace tpusim {

std::unique_ptr<Communicator> LocalTransport::make_communicator(
    const std::array<int, kNumMeshAxes>& sizes, const std::vector<int>& owner,
    std::chrono::milliseconds timeout) {
  for (const int rank : owner) {
    if (rank != 0) {
      throw std::logic_error("LocalTransport: a device is owned by rank " + std::to_string(rank));
    }
  }
  return std::make_unique<InProcessCommunicator>(sizes, timeout);
}

std::vector<int> assign_devices_to_ranks(const std::vector<int>& physical_of_mesh_device, int ranks,
                                         const std::string& slice_name) {
  const int devices = static_cast<int>(physical_of_mesh_device.size());
  if (ranks < 1 || devices % ranks != 0) {
    std::string divisors;
    for (int count = 1; count <= devices; ++count) {
      if (devices % count == 0) {
        divisors += (divisors.empty() ? "" : ", ") + std::to_string(count);
      }
    }
    throw UserError("mpirun -np " + std::to_string(ranks) + ": the " + std::to_string(devices) +
                    " simulated devices of " + slice_name + " do not divide among " +
                    std::to_string(ranks) + " ranks (use " + divisors + ")");
  }
  const int per_rank = devices / ranks;
  std::vector<int> owner(physical_of_mesh_device.size());
  for (size_t device = 0; device < owner.size(); ++device) {
    owner[device] = physical_of_mesh_device[device] / per_rank;
  }
  return owner;
}

}  // namespace tpusim
