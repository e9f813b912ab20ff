// MpiCommunicator: the in-rank rendezvous, and the two cross-rank exchanges (parts read, and the
// chunked all-reduce). See mpi_communicator.h.
#include "sim/transport/mpi_communicator.h"

#include <algorithm>
#include <exception>
#include <set>
#include <stdexcept>
#include <string>

#include "model/ir/op_kind_traits.h"
#include "sharding/partitioner.h"
#include "sim/transport/in_process_communicator.h"
#include "sim/transport/mpi_transport.h"

namespace tpusim {

struct MpiCommunicator::Meeting {
  std::vector<int> group;             // devices, in group order
  std::vector<int> rank_of;           // by group position
  std::vector<size_t> local;          // positions this rank executes, ascending
  std::vector<int> ranks;             // the group's ranks, ascending
  std::vector<DeviceContext> remote;  // by position; the contexts of other ranks' members
  std::vector<const DeviceContext*> contexts;
  std::vector<const TensorData*> inputs;
  std::vector<TensorData> received;  // by position: other ranks' members' inputs (parts read)
  TensorData reduced;                // the all-reduce's result, when reduced by chunks
  bool by_chunks = false;
  int64_t call = 0;
  std::string what;  // "collective all_reduce 'x' (op 12, call 3)"
  size_t arrived = 0;
  size_t departed = 0;
  bool exchanged = false;
  bool failed = false;
  std::string error;
};

namespace {

constexpr int kCallWindow = 8;  // calls of one group in flight can never be this far apart
constexpr int kPhases = 2;      // parts or chunks (0), folded chunks (1)

std::vector<int64_t> local_shape(const Tensor& tensor) {
  std::vector<int64_t> shape;
  for (const Dim& dim : tensor.dims) {
    shape.push_back(dim.size);
  }
  return shape;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t size : shape) {
    count *= size;
  }
  return count;
}

// Calls fn(flat, length) for each run of `box` along the last dim, in row-major order, where
// `flat` is the run's first position in a row-major array of `shape`.
template <typename Fn>
void for_each_box_row(const LocalBox& box, const std::vector<int64_t>& shape, Fn&& fn) {
  const size_t rank = shape.size();
  if (rank == 0) {
    fn(int64_t{0}, int64_t{1});
    return;
  }
  if (box.volume() == 0) {
    return;
  }
  std::vector<int64_t> strides(rank, 1);
  for (size_t dim = rank - 1; dim-- > 0;) {
    strides[dim] = strides[dim + 1] * shape[dim + 1];
  }
  std::vector<int64_t> position = box.lo;
  const int64_t length = box.hi[rank - 1] - box.lo[rank - 1];
  while (true) {
    int64_t flat = 0;
    for (size_t dim = 0; dim < rank; ++dim) {
      flat += position[dim] * strides[dim];
    }
    fn(flat, length);
    size_t dim = rank - 1;
    while (true) {
      if (dim == 0) {
        return;
      }
      --dim;
      if (++position[dim] < box.hi[dim]) {
        break;
      }
      position[dim] = box.lo[dim];
    }
  }
}

// The parts of `member`'s input that the members of `reader_rank` read, each part once.
std::vector<LocalBox> parts_read(const Graph& graph, const Op& op,
                                 const std::vector<const DeviceContext*>& contexts,
                                 const std::vector<int>& rank_of, size_t member, int reader_rank) {
  std::vector<LocalBox> parts;
  for (size_t reader = 0; reader < contexts.size(); ++reader) {
    if (rank_of[reader] != reader_rank) {
      continue;
    }
    LocalBox box = input_region_read(graph, op, *contexts[member], *contexts[reader]);
    if (box.volume() > 0 && std::find(parts.begin(), parts.end(), box) == parts.end()) {
      parts.push_back(std::move(box));
    }
  }
  return parts;
}

// The network model's traffic per device of a collective of `members` devices, as a fraction of
// V (sim/perf/collective_cost.h).
double model_fraction(OpKind kind, size_t members) {
  const double n = static_cast<double>(members);
  switch (op_kind_traits(kind).collective) {
    case Collective::kAllReduce:
      return 2 * (n - 1) / n;
    case Collective::kCollectivePermute:
      return 1;
    case Collective::kNone:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      break;
  }
  return (n - 1) / n;
}

struct Messages {
  std::vector<std::vector<float>> send;
  std::vector<std::vector<float>> receive;
};

void check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) {
    throw std::runtime_error(what + ": MPI error " + std::to_string(code) + " posting a message");
  }
}

// The requests of one exchange and the rank each waits on.
struct Posted {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
};

// Posts, under the MPI lock, a receive into messages.receive[i] and then a send of
// messages.send[i] for every rank ranks[i] other than `self` whose buffer is not empty; adds the
// bytes and messages sent to `bytes` and `sent`.
Posted post_exchange(MpiTransport& transport, const std::vector<int>& ranks, int self,
                     Messages& messages, int message_tag, const std::string& what, double& bytes,
                     int64_t& sent) {
  Posted posted;
  const std::lock_guard lock(transport.mpi_mutex());
  for (const bool receive : {true, false}) {
    for (size_t index = 0; index < ranks.size(); ++index) {
      std::vector<float>& buffer = receive ? messages.receive[index] : messages.send[index];
      if (ranks[index] == self || buffer.empty()) {
        continue;
      }
      posted.requests.push_back(MPI_REQUEST_NULL);
      posted.peers.push_back(ranks[index]);
      const int count = static_cast<int>(buffer.size());
      check(receive ? MPI_Irecv(buffer.data(), count, MPI_FLOAT, ranks[index], message_tag,
                                transport.collective_comm(), &posted.requests.back())
                    : MPI_Isend(buffer.data(), count, MPI_FLOAT, ranks[index], message_tag,
                                transport.collective_comm(), &posted.requests.back()),
            what);
      if (!receive) {
        bytes += static_cast<double>(buffer.size() * sizeof(float));
        ++sent;
      }
    }
  }
  return posted;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MpiTransport& transport,
                                 const std::array<int, kNumMeshAxes>& sizes, std::vector<int> owner,
                                 std::chrono::milliseconds timeout)
    : transport_(transport),
      sizes_(sizes),
      owner_(std::move(owner)),
      rank_(transport.rank()),
      timeout_(timeout) {
  int64_t total = 0;
  strides_ = mesh_strides(sizes, total);
  num_devices_ = static_cast<int>(total);
  if (static_cast<int64_t>(owner_.size()) != total) {
    throw std::logic_error("MpiCommunicator: " + std::to_string(owner_.size()) +
                           " device owners for " + std::to_string(total) + " devices");
  }
  for (const int rank : owner_) {
    if (rank < 0 || rank >= transport.num_ranks()) {
      throw std::logic_error("MpiCommunicator: a device is owned by rank " + std::to_string(rank));
    }
  }
  calls_.resize(static_cast<size_t>(num_devices_));
}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::device_of(const std::array<int, kNumMeshAxes>& coordinates) const {
  return mesh_device_index(coordinates, sizes_, strides_);
}

CrossProcessTraffic MpiCommunicator::traffic() const {
  const std::lock_guard lock(traffic_mutex_);
  return traffic_;
}

int MpiCommunicator::tag(const Op& op, const Meeting& meeting, int phase) const {
  const int64_t value =
      ((static_cast<int64_t>(op.id) * num_devices_ + meeting.group.front()) * kCallWindow +
       meeting.call % kCallWindow) *
          kPhases +
      phase;
  if (value > transport_.max_tag()) {
    throw std::logic_error(meeting.what + ": MPI tag " + std::to_string(value) +
                           " exceeds MPI_TAG_UB " + std::to_string(transport_.max_tag()));
  }
  return static_cast<int>(value);
}

void MpiCommunicator::check_device(const Op& op, const DeviceContext& device) const {
  if (device.sizes != sizes_ || device.device < 0 || device.device >= num_devices_ ||
      device_of(device.coordinates) != device.device) {
    throw std::logic_error(std::string(op_kind_name(op.kind)) + " '" + op.name + "': device " +
                           std::to_string(device.device) + " does not match the mesh");
  }
  if (owner_[static_cast<size_t>(device.device)] != rank_) {
    throw std::logic_error("rank " + std::to_string(rank_) + " runs device " +
                           std::to_string(device.device) + ", which rank " +
                           std::to_string(owner_[static_cast<size_t>(device.device)]) + " owns");
  }
}

void MpiCommunicator::open_meeting(Meeting& meeting, const Op& op, const std::vector<int>& group,
                                   int64_t call) const {
  meeting.group = group;
  meeting.call = call;
  meeting.what = "collective " + std::string(op_kind_name(op.kind)) + " '" + op.name + "' (op " +
                 std::to_string(op.id) + ", call " + std::to_string(call) + ")";
  meeting.remote.resize(group.size());
  meeting.contexts.assign(group.size(), nullptr);
  meeting.inputs.assign(group.size(), nullptr);
  meeting.received.resize(group.size());
  std::set<int> ranks;
  for (size_t member = 0; member < group.size(); ++member) {
    const int rank = owner_[static_cast<size_t>(group[member])];
    meeting.rank_of.push_back(rank);
    ranks.insert(rank);
    if (rank == rank_) {
      meeting.local.push_back(member);
    } else {
      meeting.remote[member] = InProcessCommunicator::context_for(group[member], sizes_);
      meeting.contexts[member] = &meeting.remote[member];
    }
  }
  meeting.ranks.assign(ranks.begin(), ranks.end());
}

void MpiCommunicator::run(const Graph& graph, const Op& op, const DeviceContext& device,
                          const TensorData& input, TensorData& output) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  check_device(op, device);
  const std::vector<int> group = collective_group(
      device, op.attrs.mesh_axes,
      [this](const std::array<int, kNumMeshAxes>& coordinates) { return device_of(coordinates); });
  const size_t position =
      static_cast<size_t>(std::find(group.begin(), group.end(), device.device) - group.begin());

  std::unique_lock lock(mutex_);
  if (transport_.failed()) {
    throw std::runtime_error("rank " + std::to_string(rank_) + ": collective '" + op.name +
                             "' abandoned after an earlier failure on this rank");
  }
  const int64_t call = calls_[static_cast<size_t>(device.device)][op.id]++;
  const Key key{op.id, group.front(), call};
  std::shared_ptr<Meeting>& slot = meetings_[key];
  if (!slot) {
    slot = std::make_shared<Meeting>();
    open_meeting(*slot, op, group, call);
  }
  const std::shared_ptr<Meeting> meeting = slot;
  if (meeting->failed) {
    throw std::runtime_error(meeting->error);
  }
  if (meeting->group != group || meeting->contexts[position] != nullptr) {
    throw std::logic_error(meeting->what + ": device " + std::to_string(device.device) +
                           " joined an inconsistent rendezvous");
  }
  meeting->contexts[position] = &device;
  meeting->inputs[position] = &input;
  const size_t local = meeting->local.size();
  if (++meeting->arrived == local) {
    // The last member here to arrive does the MPI part for all of them.
    lock.unlock();
    try {
      if (meeting->ranks.size() > 1) {
        exchange(graph, op, *meeting);
      }
    } catch (const std::exception& error) {
      transport_.note_failure(error.what());
      lock.lock();
      meeting->failed = true;
      meeting->error = error.what();
      changed_.notify_all();
      throw;
    }
    lock.lock();
    meeting->exchanged = true;
    changed_.notify_all();
    lock.unlock();
  } else {
    leave_slot();  // other devices may compute while this one waits
    const bool arrived = changed_.wait_until(lock, deadline, [&] {
      return meeting->arrived == local || meeting->failed || transport_.failed();
    });
    if (!arrived && !meeting->failed) {
      std::string missing;
      for (const size_t member : meeting->local) {
        if (meeting->contexts[member] == nullptr) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(group[member]);
        }
      }
      meeting->failed = true;
      meeting->error = "rank " + std::to_string(rank_) + ": " + meeting->what + ": device " +
                       std::to_string(device.device) + " waited " +
                       std::to_string(static_cast<double>(timeout_.count()) / 1000) +
                       " s for device(s) " + missing + " of this rank, which never arrived";
      changed_.notify_all();
    }
    // Then the MPI part, which has its own deadline.
    changed_.wait(lock,
                  [&] { return meeting->exchanged || meeting->failed || transport_.failed(); });
    std::string failure;
    if (meeting->failed) {
      failure = meeting->error;
    } else if (!meeting->exchanged) {
      failure = "rank " + std::to_string(rank_) + ": " + meeting->what +
                " abandoned after an earlier failure on this rank";
    }
    lock.unlock();
    reenter_slot();  // never under the lock
    if (!failure.empty()) {
      throw std::runtime_error(failure);
    }
  }

  std::exception_ptr error;
  try {
    if (meeting->by_chunks) {
      output = meeting->reduced;
    } else {
      combine_collective(graph, op, meeting->contexts, meeting->inputs, device, output);
    }
  } catch (...) {
    error = std::current_exception();
  }

  // Nobody leaves (and frees its input) before every member here has read the inputs.
  lock.lock();
  if (++meeting->departed == local) {
    meetings_.erase(key);
    changed_.notify_all();
    lock.unlock();
  } else {
    leave_slot();
    changed_.wait(lock, [&] { return meeting->departed == local; });
    lock.unlock();
    reenter_slot();
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

void MpiCommunicator::exchange(const Graph& graph, const Op& op, Meeting& meeting) {
  if (reduces_element_for_element(graph, op, meeting)) {
    all_reduce_by_chunks(graph, op, meeting);
  } else {
    exchange_parts(graph, op, meeting);
  }
  const double bytes = static_cast<double>(collective_bytes(graph, op));
  const Tensor& array = graph.tensor(op.kind == OpKind::kAllGather ? op.outputs[0] : op.inputs[0]);
  const double elements = static_cast<double>(element_count(local_shape(array)));
  const double share =
      model_fraction(op.kind, meeting.group.size()) * static_cast<double>(meeting.local.size());
  const std::lock_guard lock(traffic_mutex_);
  traffic_.model_bytes += share * bytes;
  traffic_.model_bytes_f32 += share * elements * static_cast<double>(sizeof(float));
}

bool MpiCommunicator::reduces_element_for_element(const Graph& graph, const Op& op,
                                                  const Meeting& meeting) const {
  if (op.kind != OpKind::kAllReduce || op.inputs.size() != 1 || op.outputs.size() != 1) {
    return false;
  }
  if (op.attrs.group_size > 1 && static_cast<size_t>(op.attrs.group_size) != meeting.group.size()) {
    return false;  // combine_collective reports it
  }
  const std::vector<Dim>& in = graph.tensor(op.inputs[0]).dims;
  const std::vector<Dim>& out = graph.tensor(op.outputs[0]).dims;
  if (in.size() != out.size()) {
    return false;
  }
  for (size_t dim = 0; dim < in.size(); ++dim) {
    if (in[dim].name != out[dim].name || in[dim].size != out[dim].size) {
      return false;
    }
    const int64_t offset = meeting.contexts.front()->offset(in[dim]);
    for (const DeviceContext* member : meeting.contexts) {
      if (member->offset(in[dim]) != offset || member->offset(out[dim]) != offset) {
        return false;
      }
    }
  }
  if (op.attrs.reduce == ReduceOp::kLogSumExp &&
      (in.empty() || in.back().size != 3 || !in.back().sharded_over.empty())) {
    return false;
  }
  return true;
}

// Every member on this rank holds an input of the op's local shape.
void MpiCommunicator::check_local_inputs(const Graph& graph, const Op& op, const Meeting& meeting,
                                         const std::vector<int64_t>& shape) {
  const int64_t count = element_count(shape);
  for (const size_t member : meeting.local) {
    if (meeting.inputs[member]->shape != shape || meeting.inputs[member]->size() != count) {
      throw std::logic_error(meeting.what + ": device " + std::to_string(meeting.group[member]) +
                             "'s input does not have the local shape of '" +
                             graph.tensor(op.inputs[0]).name + "'");
    }
  }
}

void MpiCommunicator::exchange_parts(const Graph& graph, const Op& op, Meeting& meeting) {
  const std::vector<int64_t> shape = local_shape(graph.tensor(op.inputs[0]));
  check_local_inputs(graph, op, meeting, shape);
  const size_t members = meeting.group.size();
  // What each other rank's member sends here: the parts that members here read.
  std::vector<std::vector<LocalBox>> incoming(members);
  for (size_t member = 0; member < members; ++member) {
    if (meeting.rank_of[member] != rank_) {
      incoming[member] = parts_read(graph, op, meeting.contexts, meeting.rank_of, member, rank_);
    }
  }
  auto messages = std::make_shared<Messages>();
  messages->send.resize(meeting.ranks.size());
  messages->receive.resize(meeting.ranks.size());
  double bytes = 0;
  int64_t sent = 0;
  for (size_t index = 0; index < meeting.ranks.size(); ++index) {
    const int peer = meeting.ranks[index];
    if (peer == rank_) {
      continue;
    }
    std::vector<float>& out = messages->send[index];
    for (const size_t member : meeting.local) {
      const float* source = meeting.inputs[member]->values.data();
      for (const LocalBox& box :
           parts_read(graph, op, meeting.contexts, meeting.rank_of, member, peer)) {
        for_each_box_row(box, shape, [&](int64_t flat, int64_t length) {
          out.insert(out.end(), source + flat, source + flat + length);
        });
      }
    }
    int64_t expected = 0;
    for (size_t member = 0; member < members; ++member) {
      if (meeting.rank_of[member] == peer) {
        for (const LocalBox& box : incoming[member]) {
          expected += box.volume();
        }
      }
    }
    messages->receive[index].resize(static_cast<size_t>(expected));
  }
  Posted posted = post_exchange(transport_, meeting.ranks, rank_, *messages, tag(op, meeting, 0),
                                meeting.what, bytes, sent);
  outside_slot([&] {
    transport_.wait_all(posted.requests, posted.peers, timeout_, meeting.what, messages);
  });
  // Place the parts received into full-size inputs (elements no member here reads stay zero).
  for (size_t index = 0; index < meeting.ranks.size(); ++index) {
    const int peer = meeting.ranks[index];
    if (peer == rank_) {
      continue;
    }
    const float* cursor = messages->receive[index].data();
    for (size_t member = 0; member < members; ++member) {
      if (meeting.rank_of[member] != peer) {
        continue;
      }
      TensorData& data = meeting.received[member];
      data = TensorData::zeros(shape);
      for (const LocalBox& box : incoming[member]) {
        for_each_box_row(box, shape, [&](int64_t flat, int64_t length) {
          std::copy(cursor, cursor + length, data.values.begin() + flat);
          cursor += length;
        });
      }
      meeting.inputs[member] = &data;
    }
  }
  const std::lock_guard lock(traffic_mutex_);
  traffic_.bytes_sent += bytes;
  traffic_.messages += sent;
}

void MpiCommunicator::all_reduce_by_chunks(const Graph& graph, const Op& op, Meeting& meeting) {
  const std::vector<int64_t> shape = local_shape(graph.tensor(op.inputs[0]));
  const int64_t count = element_count(shape);
  check_local_inputs(graph, op, meeting, shape);
  // One chunk per rank of the group, whole (max, sum, target) triples for log-sum-exp.
  const int64_t unit = op.attrs.reduce == ReduceOp::kLogSumExp ? 3 : 1;
  const int64_t units = count / unit;
  const auto chunks = static_cast<int64_t>(meeting.ranks.size());
  const auto chunk_begin = [&](size_t index) {
    return static_cast<int64_t>(index) * units / chunks * unit;
  };
  const auto chunk_end = [&](size_t index) { return chunk_begin(index + 1); };
  const size_t mine = static_cast<size_t>(
      std::find(meeting.ranks.begin(), meeting.ranks.end(), rank_) - meeting.ranks.begin());
  const int64_t my_begin = chunk_begin(mine);
  const int64_t my_length = chunk_end(mine) - my_begin;
  const size_t members = meeting.group.size();

  // Phase 0: the values of every member here for each other rank's chunk; theirs for mine.
  auto messages = std::make_shared<Messages>();
  messages->send.resize(meeting.ranks.size());
  messages->receive.resize(meeting.ranks.size());
  double bytes = 0;
  int64_t sent = 0;
  const auto post = [&](int phase) {
    return post_exchange(transport_, meeting.ranks, rank_, *messages, tag(op, meeting, phase),
                         meeting.what, bytes, sent);
  };
  const auto wait = [&](Posted& posted) {
    outside_slot([&] {
      transport_.wait_all(posted.requests, posted.peers, timeout_, meeting.what, messages);
    });
  };
  for (size_t index = 0; index < meeting.ranks.size(); ++index) {
    if (index == mine) {
      continue;
    }
    const int64_t begin = chunk_begin(index);
    const int64_t end = chunk_end(index);
    for (const size_t member : meeting.local) {
      const float* source = meeting.inputs[member]->values.data();
      messages->send[index].insert(messages->send[index].end(), source + begin, source + end);
    }
    int64_t theirs = 0;
    for (size_t member = 0; member < members; ++member) {
      theirs += meeting.rank_of[member] == meeting.ranks[index] ? 1 : 0;
    }
    messages->receive[index].resize(static_cast<size_t>(theirs * my_length));
  }
  auto posted = post(0);
  wait(posted);

  // Fold my chunk over all members in group order.
  std::vector<size_t> received_so_far(meeting.ranks.size(), 0);
  std::vector<float> folded(static_cast<size_t>(my_length));
  for (size_t member = 0; member < members; ++member) {
    const float* values = nullptr;
    if (meeting.rank_of[member] == rank_) {
      values = meeting.inputs[member]->values.data() + my_begin;
    } else {
      const size_t index = static_cast<size_t>(
          std::find(meeting.ranks.begin(), meeting.ranks.end(), meeting.rank_of[member]) -
          meeting.ranks.begin());
      values = messages->receive[index].data() +
               static_cast<int64_t>(received_so_far[index]++) * my_length;
    }
    if (member == 0) {
      std::copy(values, values + my_length, folded.begin());
    } else {
      reduce_into(op.attrs.reduce, folded.data(), values, my_length);
    }
  }

  // Phase 1: my folded chunk to every other rank; theirs to me.
  for (size_t index = 0; index < meeting.ranks.size(); ++index) {
    messages->send[index].clear();
    messages->receive[index].clear();
    if (index != mine) {
      messages->send[index] = folded;
      messages->receive[index].resize(static_cast<size_t>(chunk_end(index) - chunk_begin(index)));
    }
  }
  posted = post(1);
  wait(posted);
  meeting.reduced = TensorData::zeros(shape);
  for (size_t index = 0; index < meeting.ranks.size(); ++index) {
    const std::vector<float>& chunk = index == mine ? folded : messages->receive[index];
    std::copy(chunk.begin(), chunk.end(), meeting.reduced.values.begin() + chunk_begin(index));
  }
  zero_output_padding(graph, op, *meeting.contexts[meeting.local.front()], meeting.reduced);
  meeting.by_chunks = true;
  const std::lock_guard lock(traffic_mutex_);
  traffic_.bytes_sent += bytes;
  traffic_.messages += sent;
}

}  // namespace tpusim
