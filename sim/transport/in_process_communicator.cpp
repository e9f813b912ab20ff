#include "sim/transport/in_process_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <stdexcept>
#include <string>

namespace tpusim {

struct InProcessCommunicator::Rendezvous {
  explicit Rendezvous(std::vector<int> group_devices)
      : group(std::move(group_devices)),
        contexts(group.size(), nullptr),
        inputs(group.size(), nullptr) {}

  std::vector<int> group;
  std::vector<const DeviceContext*> contexts;  // by group position; null until arrived
  std::vector<const TensorData*> inputs;
  size_t arrived = 0;
  size_t departed = 0;
  bool failed = false;
  std::string error;
  std::condition_variable changed;
};

namespace {

std::string describe_timeout(std::chrono::milliseconds timeout) {
  const auto count = timeout.count();
  return count % 1000 == 0 ? std::to_string(count / 1000) + " s" : std::to_string(count) + " ms";
}

std::string describe_op(const Op& op) {
  return std::string(op_kind_name(op.kind)) + " '" + op.name + "' (op " + std::to_string(op.id) +
         ")";
}

std::string list(const std::vector<int>& devices) {
  std::string text;
  for (size_t index = 0; index < devices.size(); ++index) {
    text += (index == 0 ? "" : ", ") + std::to_string(devices[index]);
  }
  return text;
}

}  // namespace

InProcessCommunicator::InProcessCommunicator(const std::array<int, kNumMeshAxes>& sizes,
                                             std::chrono::milliseconds timeout)
    : sizes_(sizes), timeout_(timeout) {
  int64_t total = 0;
  strides_ = mesh_strides(sizes, total);
  num_devices_ = static_cast<int>(total);
  calls_.resize(static_cast<size_t>(num_devices_));
}

InProcessCommunicator::~InProcessCommunicator() = default;

int InProcessCommunicator::device_of(const std::array<int, kNumMeshAxes>& coordinates) const {
  return mesh_device_index(coordinates, sizes_, strides_);
}

DeviceContext InProcessCommunicator::context_for(int device,
                                                 const std::array<int, kNumMeshAxes>& sizes) {
  int64_t total = 0;
  const std::array<int64_t, kNumMeshAxes> strides = mesh_strides(sizes, total);
  if (device < 0 || device >= total) {
    throw std::logic_error("device " + std::to_string(device) + " outside a mesh of " +
                           std::to_string(total) + " devices");
  }
  DeviceContext context;
  context.device = device;
  context.sizes = sizes;
  for (size_t axis = 0; axis < kNumMeshAxes; ++axis) {
    context.coordinates[axis] = static_cast<int>((device / strides[axis]) % sizes[axis]);
  }
  return context;
}

void InProcessCommunicator::run(const Graph& graph, const Op& op, const DeviceContext& device,
                                const TensorData& input, TensorData& output) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (device.sizes != sizes_) {
    throw std::logic_error(describe_op(op) + ": device " + std::to_string(device.device) +
                           " has mesh sizes different from the communicator's");
  }
  if (device.device < 0 || device.device >= num_devices_ ||
      device_of(device.coordinates) != device.device) {
    throw std::logic_error(describe_op(op) + ": device " + std::to_string(device.device) +
                           " does not match its mesh coordinates");
  }
  std::vector<int> group = collective_group(
      device, op.attrs.mesh_axes,
      [this](const std::array<int, kNumMeshAxes>& coordinates) { return device_of(coordinates); });
  const size_t position =
      static_cast<size_t>(std::find(group.begin(), group.end(), device.device) - group.begin());
  const size_t size = group.size();

  std::unique_lock lock(mutex_);
  const int64_t call = calls_[static_cast<size_t>(device.device)][op.id]++;
  const Key key{op.id, group.front(), call};
  std::shared_ptr<Rendezvous>& slot = rendezvous_[key];
  if (!slot) {
    slot = std::make_shared<Rendezvous>(group);
  }
  const std::shared_ptr<Rendezvous> meeting = slot;
  if (meeting->failed) {
    throw std::runtime_error(meeting->error);
  }
  if (meeting->group != group || meeting->contexts[position] != nullptr) {
    throw std::logic_error(describe_op(op) + ": device " + std::to_string(device.device) +
                           " joined an inconsistent rendezvous (call " + std::to_string(call) +
                           ")");
  }
  meeting->contexts[position] = &device;
  meeting->inputs[position] = &input;
  if (++meeting->arrived == size) {
    meeting->changed.notify_all();
    lock.unlock();
  } else {
    leave_slot();  // other devices may compute while this one waits
    const bool complete = meeting->changed.wait_until(
        lock, deadline, [&] { return meeting->arrived == size || meeting->failed; });
    if (!complete && !meeting->failed) {
      std::vector<int> missing;
      for (size_t member = 0; member < size; ++member) {
        if (meeting->contexts[member] == nullptr) {
          missing.push_back(group[member]);
        }
      }
      // Later arrivals and the members still waiting fail too; the entry stays for them.
      meeting->failed = true;
      meeting->error = "collective " + describe_op(op) + ", call " + std::to_string(call) +
                       ": device " + std::to_string(device.device) + " waited " +
                       describe_timeout(timeout_) + " for device(s) " + list(missing) +
                       " of its group {" + list(group) + "}, which never arrived";
      meeting->changed.notify_all();
    }
    const std::string failure = meeting->failed ? meeting->error : "";
    lock.unlock();
    reenter_slot();  // never under the lock: slot holders may need it to arrive
    if (!failure.empty()) {
      throw std::runtime_error(failure);
    }
  }

  std::exception_ptr error;
  try {
    combine_collective(graph, op, meeting->contexts, meeting->inputs, device, output);
  } catch (...) {
    error = std::current_exception();
  }

  // Nobody leaves (and frees its input) before everyone has read the inputs.
  lock.lock();
  if (++meeting->departed == size) {
    rendezvous_.erase(key);
    meeting->changed.notify_all();
    lock.unlock();
  } else {
    leave_slot();
    meeting->changed.wait(lock, [&] { return meeting->departed == size; });
    lock.unlock();
    reenter_slot();
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

}  // namespace tpusim
