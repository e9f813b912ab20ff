// The MPI transport computes every collective bitwise like the in-process one. Run under mpirun
// (ctest does, with 2 and 4 ranks): every rank computes the reference of all 8 devices of a
// data=2 x fsdp=4 mesh with InProcessCommunicator, then runs its own devices through
// MpiCommunicator, with the devices given to the ranks in blocks and interleaved, and compares
// bits. Inputs are random floats of very different magnitudes (the reduction order shows), and
// padding elements hold garbage that must never reach an output. A group with one device per rank
// also checks the bytes sent against the network model's count.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sim/transport/in_process_communicator.h"
#include "sim/transport/mpi_transport.h"

namespace tpusim {
namespace {

MpiTransport* g_transport = nullptr;

using Sizes = std::array<int, kNumMeshAxes>;
constexpr int kDevices = 8;

Sizes mesh_sizes() {
  Sizes sizes;
  sizes.fill(1);
  sizes[static_cast<size_t>(mesh_axis_index("data"))] = 2;
  sizes[static_cast<size_t>(mesh_axis_index("fsdp"))] = 4;
  return sizes;
}

int64_t shards(const std::vector<std::string>& axes) {
  int64_t product = 1;
  for (const std::string& axis : axes) {
    product *= mesh_sizes()[static_cast<size_t>(mesh_axis_index(axis))];
  }
  return product;
}

Dim dim(const std::string& name, int64_t global, const std::vector<std::string>& axes) {
  const int64_t split = shards(axes);
  Dim result{name, (global + split - 1) / split, ""};
  result.global_size = global;
  result.sharded_over.assign(axes.begin(), axes.end());
  return result;
}

// Every case's op lives in one graph, so one communicator serves them all (distinct op ids).
struct Collectives {
  Graph graph;
  std::vector<int> ops;
  std::vector<std::string> names;
  int region = -1;

  int add(const std::string& name, OpKind kind, std::vector<Dim> input, std::vector<Dim> output,
          const std::vector<std::string>& axes, ReduceOp reduce = ReduceOp::kSum) {
    if (region < 0) {
      region = graph.add_region("r", 1, Phase::kForward);
    }
    const TensorId in = graph.add_tensor(name + "/in", std::move(input), DType::kF32,
                                         TensorKind::kActivation, region);
    const TensorId out = graph.add_tensor(name + "/out", std::move(output), DType::kF32,
                                          TensorKind::kActivation, region);
    OpAttrs attrs;
    attrs.mesh_axes = axes;
    attrs.group_size = shards(axes);
    attrs.reduce = reduce;
    const int op = graph.add_op(kind, name, {in}, {out}, attrs, region);
    ops.push_back(op);
    names.push_back(name);
    return op;
  }
  const Op& op(size_t index) const { return graph.ops()[static_cast<size_t>(ops[index])]; }
};

const Collectives& collectives() {
  static const Collectives all = [] {
    Collectives c;
    // Gathers, one with padding (30 rows in shards of 8) and one over both axes.
    c.add("gather_padded", OpKind::kAllGather, {dim("rows", 30, {"fsdp"}), dim("cols", 3, {})},
          {dim("rows", 30, {}), dim("cols", 3, {})}, {"fsdp"});
    c.add("gather_two_axes", OpKind::kAllGather, {dim("rows", 30, {"data", "fsdp"})},
          {dim("rows", 30, {})}, {"data", "fsdp"});
    c.add("gather_over_data", OpKind::kAllGather, {dim("rows", 64, {"data"}), dim("cols", 5, {})},
          {dim("rows", 64, {}), dim("cols", 5, {})}, {"data"});
    // Reduce-scatters, one padded, over one and two axes.
    c.add("scatter_data", OpKind::kReduceScatter, {dim("rows", 16, {}), dim("cols", 5, {})},
          {dim("rows", 16, {"data"}), dim("cols", 5, {})}, {"data"});
    c.add("scatter_padded", OpKind::kReduceScatter, {dim("rows", 30, {})},
          {dim("rows", 30, {"data", "fsdp"})}, {"data", "fsdp"});
    // All-reduces: a length no rank count divides, over both axes, with padding of a dim split
    // over another axis, log-sum-exp triples, and a scalar.
    c.add("reduce_data", OpKind::kAllReduce, {dim("x", 257, {})}, {dim("x", 257, {})}, {"data"});
    c.add("reduce_all", OpKind::kAllReduce, {dim("x", 1000, {})}, {dim("x", 1000, {})},
          {"data", "fsdp"});
    c.add("reduce_padded", OpKind::kAllReduce, {dim("rows", 30, {"fsdp"}), dim("cols", 7, {})},
          {dim("rows", 30, {"fsdp"}), dim("cols", 7, {})}, {"data"});
    c.add("reduce_log_sum_exp", OpKind::kAllReduce, {dim("batch", 5, {}), dim("statistics", 3, {})},
          {dim("batch", 5, {}), dim("statistics", 3, {})}, {"data", "fsdp"}, ReduceOp::kLogSumExp);
    c.add("reduce_scalar", OpKind::kAllReduce, {}, {}, {"data", "fsdp"});
    // All-to-all moving the whole mesh between dims; a permute swapping the shard order.
    c.add("all_to_all", OpKind::kAllToAll, {dim("batch", 8, {"data", "fsdp"}), dim("heads", 8, {})},
          {dim("batch", 8, {}), dim("heads", 8, {"data", "fsdp"})}, {"data", "fsdp"});
    c.add("permute", OpKind::kCollectivePermute, {dim("x", 16, {"data", "fsdp"})},
          {dim("x", 16, {"fsdp", "data"})}, {"data", "fsdp"});
    return c;
  }();
  return all;
}

// Random values over many magnitudes (order-sensitive sums); padding gets garbage too.
TensorData random_input(const Tensor& tensor, int device, int salt) {
  TensorData data = TensorData::zeros(tensor);
  std::mt19937 generator(static_cast<uint32_t>(1000 * salt + device));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (float& value : data.values) {
    value = std::ldexp(mantissa(generator), exponent(generator));
  }
  return data;
}

std::vector<int> owners(bool interleaved) {
  const int ranks = g_transport->num_ranks();
  std::vector<int> owner(kDevices);
  for (int device = 0; device < kDevices; ++device) {
    owner[static_cast<size_t>(device)] = interleaved ? device % ranks : device / (kDevices / ranks);
  }
  return owner;
}

// Runs `ops` (indices into collectives()) in order, `rounds` times, on the given devices (one
// thread each); returns the outputs by [device][round * ops + op].
using Outputs = std::vector<std::vector<TensorData>>;
Outputs run_devices(Communicator& communicator, const std::vector<int>& devices,
                    const std::vector<size_t>& ops, int rounds) {
  const Collectives& c = collectives();
  Outputs outputs(kDevices);
  std::vector<std::string> errors(kDevices);
  std::vector<std::thread> threads;
  threads.reserve(devices.size());
  for (const int device : devices) {
    threads.emplace_back([&, device] {
      const DeviceContext context = InProcessCommunicator::context_for(device, mesh_sizes());
      try {
        for (int round = 0; round < rounds; ++round) {
          for (const size_t index : ops) {
            const Op& op = c.op(index);
            const TensorData input = random_input(c.graph.tensor(op.inputs[0]), device,
                                                  static_cast<int>(index) + 100 * round);
            TensorData output;
            communicator.run(c.graph, op, context, input, output);
            outputs[static_cast<size_t>(device)].push_back(std::move(output));
          }
        }
      } catch (const std::exception& error) {
        errors[static_cast<size_t>(device)] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (const int device : devices) {
    EXPECT_EQ(errors[static_cast<size_t>(device)], "") << "device " << device;
  }
  return outputs;
}

void expect_bitwise_equal(const Outputs& actual, const Outputs& expected,
                          const std::vector<int>& devices, const std::vector<size_t>& ops) {
  const Collectives& c = collectives();
  for (const int device : devices) {
    const auto& got = actual[static_cast<size_t>(device)];
    const auto& want = expected[static_cast<size_t>(device)];
    ASSERT_EQ(got.size(), want.size()) << "device " << device;
    for (size_t call = 0; call < got.size(); ++call) {
      const std::string& name = c.names[ops[call % ops.size()]];
      ASSERT_EQ(got[call].shape, want[call].shape) << name << " device " << device;
      ASSERT_EQ(got[call].values.size(), want[call].values.size()) << name;
      EXPECT_EQ(std::memcmp(got[call].values.data(), want[call].values.data(),
                            want[call].values.size() * sizeof(float)),
                0)
          << name << " device " << device << " call " << call;
    }
  }
}

std::vector<int> devices_of(const std::vector<int>& owner, int rank) {
  std::vector<int> devices;
  for (int device = 0; device < kDevices; ++device) {
    if (owner[static_cast<size_t>(device)] == rank) {
      devices.push_back(device);
    }
  }
  return devices;
}

std::vector<int> all_devices() {
  std::vector<int> devices(kDevices);
  for (int device = 0; device < kDevices; ++device) {
    devices[static_cast<size_t>(device)] = device;
  }
  return devices;
}

// Each collective alone, then all of them in sequence for several rounds (different groups of
// different ops in flight at once between the same ranks), for block and interleaved owners.
TEST(MpiCommunicator, BitwiseLikeInProcessForEveryCollective) {
  const Collectives& c = collectives();
  std::vector<size_t> every(c.ops.size());
  for (size_t index = 0; index < every.size(); ++index) {
    every[index] = index;
  }
  for (const bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved owners" : "block owners");
    const std::vector<int> owner = owners(interleaved);
    const std::vector<int> mine = devices_of(owner, g_transport->rank());
    auto communicator =
        g_transport->make_communicator(mesh_sizes(), owner, std::chrono::seconds(30));
    for (size_t index = 0; index < c.ops.size(); ++index) {
      SCOPED_TRACE(c.names[index]);
      InProcessCommunicator reference(mesh_sizes());
      const Outputs expected = run_devices(reference, all_devices(), {index}, 1);
      const Outputs actual = run_devices(*communicator, mine, {index}, 1);
      expect_bitwise_equal(actual, expected, mine, {index});
    }
    InProcessCommunicator reference(mesh_sizes());
    const Outputs expected = run_devices(reference, all_devices(), every, 3);
    const Outputs actual = run_devices(*communicator, mine, every, 3);
    expect_bitwise_equal(actual, expected, mine, every);
  }
}

// A group with one device per rank sends exactly the network model's traffic: an all-gather
// (N-1)/N of the gathered array per device, an all-reduce 2 (N-1)/N (each rank folds its chunk,
// then sends it back), a reduce-scatter (N-1)/N of its input. The data groups have one device
// per rank with 2 ranks, so ctest runs this test only there (tests/CMakeLists.txt).
TEST(MpiCommunicator, OneDevicePerRankSendsTheModelsBytes) {
  ASSERT_EQ(g_transport->num_ranks(), 2) << "run with mpirun -np 2";
  const Collectives& c = collectives();
  const std::vector<int> owner = owners(false);  // rank = data coordinate
  const std::vector<int> mine = devices_of(owner, g_transport->rank());
  for (const std::string name : {"gather_over_data", "reduce_data", "scatter_data"}) {
    SCOPED_TRACE(name);
    const size_t index =
        static_cast<size_t>(std::find(c.names.begin(), c.names.end(), name) - c.names.begin());
    auto communicator =
        g_transport->make_communicator(mesh_sizes(), owner, std::chrono::seconds(30));
    run_devices(*communicator, mine, {index}, 1);
    const CrossProcessTraffic traffic = communicator->traffic();
    const Op& op = c.op(index);
    const Tensor& array =
        c.graph.tensor(op.kind == OpKind::kAllGather ? op.outputs[0] : op.inputs[0]);
    int64_t elements = 1;
    for (const Dim& d : array.dims) {
      elements *= d.size;
    }
    const double per_device = (op.kind == OpKind::kAllReduce ? 2.0 : 1.0) * 0.5 *
                              static_cast<double>(elements) * sizeof(float);
    EXPECT_EQ(traffic.bytes_sent, per_device * static_cast<double>(mine.size()));
    EXPECT_EQ(traffic.model_bytes_f32, traffic.bytes_sent);
  }
}

}  // namespace
}  // namespace tpusim

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tpusim::MpiTransport transport;
  tpusim::g_transport = &transport;
  const int result = RUN_ALL_TESTS();
  // Fail on every rank when any rank failed.
  int worst = result;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
