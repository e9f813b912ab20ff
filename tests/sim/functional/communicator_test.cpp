// Collectives of the functional engine: group order, the global-index semantics of every kind
// (on hand-made shards laid out like the partitioner's), and the in-process transport with real
// threads: independent groups, repeated calls, bitwise determinism under any scheduling, timeouts.
#include "sim/functional/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sim/functional/execution_slots.h"
#include "sim/transport/in_process_communicator.h"

namespace tpusim {
namespace {

using Sizes = std::array<int, kNumMeshAxes>;

Sizes mesh(const std::vector<std::pair<std::string, int>>& axes) {
  Sizes sizes;
  sizes.fill(1);
  for (const auto& [axis, size] : axes) {
    sizes[static_cast<size_t>(mesh_axis_index(axis))] = size;
  }
  return sizes;
}

int64_t shards(const Sizes& sizes, const std::vector<std::string>& axes) {
  int64_t product = 1;
  for (const std::string& axis : axes) {
    product *= sizes[static_cast<size_t>(mesh_axis_index(axis))];
  }
  return product;
}

// A dim as the partitioner makes it: local size rounded up, global size, mesh axes.
Dim dim(const std::string& name, int64_t global, const std::vector<std::string>& axes,
        const Sizes& sizes) {
  const int64_t split = shards(sizes, axes);
  Dim result{name, (global + split - 1) / split, ""};
  result.global_size = global;
  result.sharded_over.assign(axes.begin(), axes.end());
  return result;
}

struct Program {
  Graph graph;
  int op = -1;
  const Op& collective() const { return graph.ops()[static_cast<size_t>(op)]; }
  const Tensor& input() const { return graph.tensor(collective().inputs[0]); }
  const Tensor& output() const { return graph.tensor(collective().outputs[0]); }
};

Program make_program(OpKind kind, std::vector<Dim> input, std::vector<Dim> output,
                     const std::vector<std::string>& axes, const Sizes& sizes,
                     ReduceOp reduce = ReduceOp::kSum) {
  Program program;
  const int region = program.graph.add_region("r", 1, Phase::kForward);
  const TensorId in =
      program.graph.add_tensor("x", std::move(input), DType::kF32, TensorKind::kActivation, region);
  const TensorId out =
      program.graph.add_tensor("x/" + std::string(op_kind_name(kind)), std::move(output),
                               DType::kF32, TensorKind::kActivation, region);
  OpAttrs attrs;
  attrs.mesh_axes = axes;
  attrs.group_size = shards(sizes, axes);
  attrs.reduce = reduce;
  program.op = program.graph.add_op(kind, "x/" + std::string(op_kind_name(kind)), {in}, {out},
                                    attrs, region);
  return program;
}

int coordinate(const DeviceContext& device, const std::string& axis) {
  return device.coordinates[static_cast<size_t>(mesh_axis_index(axis))];
}

// Value of a global element as seen by a device.
using GlobalFn = std::function<float(const std::vector<int64_t>& global, const DeviceContext&)>;

// Calls fn(flat, global index, in padding) for every local element of `tensor` on `device`.
void for_each_element(const Tensor& tensor, const DeviceContext& device,
                      const std::function<void(size_t, const std::vector<int64_t>&, bool)>& fn) {
  const size_t rank = tensor.dims.size();
  int64_t count = 1;
  for (const Dim& d : tensor.dims) {
    count *= d.size;
  }
  std::vector<int64_t> global(rank);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat;
    bool padding = false;
    for (size_t axis = rank; axis-- > 0;) {
      const Dim& d = tensor.dims[axis];
      global[axis] = rest % d.size + device.offset(d);
      rest /= d.size;
      padding = padding || (d.global_size > 0 && global[axis] >= d.global_size);
    }
    fn(static_cast<size_t>(flat), global, padding);
  }
}

// A device's input: fn at each global index; padding holds a sentinel that must never be read.
TensorData fill(const Tensor& tensor, const DeviceContext& device, const GlobalFn& fn) {
  TensorData data = TensorData::zeros(tensor);
  for_each_element(tensor, device,
                   [&](size_t flat, const std::vector<int64_t>& global, bool padding) {
                     data.values[flat] = padding ? 1e30f : fn(global, device);
                   });
  return data;
}

void expect_values(const Tensor& tensor, const DeviceContext& device, const TensorData& data,
                   const GlobalFn& fn) {
  ASSERT_EQ(data.size(), TensorData::zeros(tensor).size());
  int mismatches = 0;
  for_each_element(tensor, device,
                   [&](size_t flat, const std::vector<int64_t>& global, bool padding) {
                     const float expected = padding ? 0.0f : fn(global, device);
                     if (data.values[flat] != expected && ++mismatches <= 5) {
                       ADD_FAILURE() << "device " << device.device << " element " << flat << ": "
                                     << data.values[flat] << " != " << expected;
                     }
                   });
}

struct Schedule {
  std::vector<int> start_order;  // thread creation order (default 0..n-1)
  std::vector<int> delay_us;     // per device, before calling run()
  std::vector<bool> absent;      // devices that never call run()
};

struct Results {
  std::vector<TensorData> outputs;
  std::vector<std::string> errors;  // "" when the device succeeded
};

// Runs the collective on one thread per device.
Results run_threads(Communicator& communicator, const Program& program, const Sizes& sizes,
                    const std::vector<TensorData>& inputs, const Schedule& schedule = {}) {
  const int count = communicator.num_devices();
  Results results;
  results.outputs.resize(static_cast<size_t>(count));
  results.errors.resize(static_cast<size_t>(count));
  std::vector<int> order = schedule.start_order;
  if (order.empty()) {
    for (int device = 0; device < count; ++device) {
      order.push_back(device);
    }
  }
  std::vector<std::thread> threads;
  for (const int device : order) {
    const size_t index = static_cast<size_t>(device);
    if (!schedule.absent.empty() && schedule.absent[index]) {
      continue;
    }
    threads.emplace_back([&, device, index] {
      if (!schedule.delay_us.empty()) {
        std::this_thread::sleep_for(std::chrono::microseconds(schedule.delay_us[index]));
      }
      const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
      try {
        communicator.run(program.graph, program.collective(), context, inputs[index],
                         results.outputs[index]);
      } catch (const std::exception& error) {
        results.errors[index] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  return results;
}

std::vector<TensorData> inputs_for(const Program& program, const Sizes& sizes, int count,
                                   const GlobalFn& fn) {
  std::vector<TensorData> inputs;
  for (int device = 0; device < count; ++device) {
    inputs.push_back(fill(program.input(), InProcessCommunicator::context_for(device, sizes), fn));
  }
  return inputs;
}

void expect_no_errors(const Results& results) {
  for (size_t device = 0; device < results.errors.size(); ++device) {
    EXPECT_EQ(results.errors[device], "") << "device " << device;
  }
}

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> values(count);
  for (float& value : values) {
    value = std::pow(10.0f, exponent(generator)) * (negative(generator) ? -1.0f : 1.0f);
  }
  return values;
}

// Inputs of random floats of widely different magnitudes (their sum depends on the order).
std::vector<TensorData> random_inputs(const Program& program, int count, uint32_t seed) {
  std::vector<TensorData> inputs;
  for (int device = 0; device < count; ++device) {
    TensorData data = TensorData::zeros(program.input());
    data.values = random_values(data.values.size(), seed + static_cast<uint32_t>(device));
    inputs.push_back(std::move(data));
  }
  return inputs;
}

TEST(CollectiveGroup, OrdersMembersByTheListedAxesFirstMajor) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const DeviceContext device = InProcessCommunicator::context_for(6, sizes);
  EXPECT_EQ(coordinate(device, "data"), 1);
  EXPECT_EQ(coordinate(device, "fsdp"), 2);
  InProcessCommunicator communicator(sizes);
  EXPECT_EQ(communicator.num_devices(), 8);
  const auto device_of = [&](const Sizes& coordinates) {
    return communicator.device_of(coordinates);
  };
  EXPECT_EQ(collective_group(device, {"fsdp"}, device_of), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(collective_group(device, {"data"}, device_of), (std::vector<int>{2, 6}));
  EXPECT_EQ(collective_group(device, {"data", "fsdp"}, device_of),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(collective_group(device, {"fsdp", "data"}, device_of),
            (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(collective_group(device, {}, device_of), (std::vector<int>{6}));
  EXPECT_THROW(collective_group(device, {"fsdp", "fsdp"}, device_of), std::logic_error);
}

TEST(InProcessCommunicator, MapsDevicesToCoordinatesRowMajor) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 3}, {"tensor", 2}});
  InProcessCommunicator communicator(sizes);
  ASSERT_EQ(communicator.num_devices(), 12);
  for (int device = 0; device < 12; ++device) {
    const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
    EXPECT_EQ(context.device, device);
    EXPECT_EQ(context.sizes, sizes);
    EXPECT_EQ(coordinate(context, "data"), device / 6);
    EXPECT_EQ(coordinate(context, "fsdp"), device / 2 % 3);
    EXPECT_EQ(coordinate(context, "tensor"), device % 2);
    EXPECT_EQ(communicator.device_of(context.coordinates), device);
  }
  EXPECT_THROW(InProcessCommunicator::context_for(12, sizes), std::logic_error);
}

// [batch:8@fsdp (32), embed:4] gathered over fsdp into [batch:32, embed:4]; the two data rows of
// the mesh are independent groups.
TEST(InProcessCommunicator, AllGatherOneDim) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(
      OpKind::kAllGather, {dim("batch", 32, {"fsdp"}, sizes), dim("embed", 4, {}, sizes)},
      {dim("batch", 32, {}, sizes), dim("embed", 4, {}, sizes)}, {"fsdp"}, sizes);
  const GlobalFn value = [](const std::vector<int64_t>& g, const DeviceContext& device) {
    return static_cast<float>(g[0] * 10 + g[1] + 1000 * coordinate(device, "data"));
  };
  InProcessCommunicator communicator(sizes);
  const Results results =
      run_threads(communicator, program, sizes, inputs_for(program, sizes, 8, value));
  expect_no_errors(results);
  for (int device = 0; device < 8; ++device) {
    expect_values(program.output(), InProcessCommunicator::context_for(device, sizes),
                  results.outputs[static_cast<size_t>(device)], value);
  }
}

// Two dims gathered at once over two mesh axes, one of which shards a dim with another axis
// (batch over (data, fsdp) major to minor): [batch:2@(data,fsdp) (8), embed:2@tensor (4)] ->
// [batch:4@data, embed:4] over {fsdp, tensor}; groups of 4, one per data coordinate.
TEST(InProcessCommunicator, AllGatherTwoDimsOverTwoAxes) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 2}, {"tensor", 2}});
  const Program program = make_program(
      OpKind::kAllGather,
      {dim("batch", 8, {"data", "fsdp"}, sizes), dim("embed", 4, {"tensor"}, sizes)},
      {dim("batch", 8, {"data"}, sizes), dim("embed", 4, {}, sizes)}, {"fsdp", "tensor"}, sizes);
  const GlobalFn value = [](const std::vector<int64_t>& g, const DeviceContext&) {
    return static_cast<float>(g[0] * 10 + g[1]);
  };
  InProcessCommunicator communicator(sizes);
  const Results results =
      run_threads(communicator, program, sizes, inputs_for(program, sizes, 8, value));
  expect_no_errors(results);
  for (int device = 0; device < 8; ++device) {
    const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
    expect_values(program.output(), context, results.outputs[static_cast<size_t>(device)], value);
    EXPECT_EQ(results.outputs[static_cast<size_t>(device)].values.front(),
              static_cast<float>(40 * coordinate(context, "data")));
  }
}

// Rows split over data stay split over data and also get split over fsdp:
// [rows:8@data (16), cols:3] -> [rows:2@(data,fsdp) (16), cols:3], partial sums over fsdp.
TEST(InProcessCommunicator, ReduceScatterSumsInGroupOrder) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(
      OpKind::kReduceScatter, {dim("rows", 16, {"data"}, sizes), dim("cols", 3, {}, sizes)},
      {dim("rows", 16, {"data", "fsdp"}, sizes), dim("cols", 3, {}, sizes)}, {"fsdp"}, sizes);
  const std::vector<TensorData> inputs = random_inputs(program, 8, 7);
  InProcessCommunicator communicator(sizes);
  const Results results = run_threads(communicator, program, sizes, inputs);
  expect_no_errors(results);
  for (int device = 0; device < 8; ++device) {
    const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
    const int data = coordinate(context, "data");
    const int fsdp = coordinate(context, "fsdp");
    const TensorData& output = results.outputs[static_cast<size_t>(device)];
    ASSERT_EQ(output.shape, (std::vector<int64_t>{2, 3}));
    for (int64_t row = 0; row < 2; ++row) {
      for (int64_t col = 0; col < 3; ++col) {
        const int64_t input_row = fsdp * 2 + row;  // local row of the data shard
        float sum = inputs[static_cast<size_t>(data * 4)].at({input_row, col});
        for (int member = 1; member < 4; ++member) {
          sum += inputs[static_cast<size_t>(data * 4 + member)].at({input_row, col});
        }
        EXPECT_EQ(output.at({row, col}), sum) << "device " << device;
      }
    }
  }
}

// A reduce-scatter over two axes, listed minor first: the group order (and so the order of the
// sum) follows the listed axes, and the output is split over them in dim order (data, fsdp).
TEST(InProcessCommunicator, ReduceScatterOverTwoAxes) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program =
      make_program(OpKind::kReduceScatter, {dim("rows", 16, {}, sizes)},
                   {dim("rows", 16, {"data", "fsdp"}, sizes)}, {"fsdp", "data"}, sizes);
  const std::vector<TensorData> inputs = random_inputs(program, 8, 11);
  InProcessCommunicator communicator(sizes);
  const Results results = run_threads(communicator, program, sizes, inputs);
  expect_no_errors(results);
  const std::vector<int> order = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int device = 0; device < 8; ++device) {
    const TensorData& output = results.outputs[static_cast<size_t>(device)];
    ASSERT_EQ(output.shape, (std::vector<int64_t>{2}));
    for (int64_t row = 0; row < 2; ++row) {
      const int64_t global = device * 2 + row;  // shard index (data, fsdp) = device
      float sum = inputs[static_cast<size_t>(order[0])].at({global});
      for (size_t member = 1; member < order.size(); ++member) {
        sum += inputs[static_cast<size_t>(order[member])].at({global});
      }
      EXPECT_EQ(output.at({row}), sum) << "device " << device;
    }
  }
}

TEST(InProcessCommunicator, AllReduceSumAndScalarLoss) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(OpKind::kAllReduce, {dim("x", 5, {}, sizes)},
                                       {dim("x", 5, {}, sizes)}, {"fsdp"}, sizes);
  const std::vector<TensorData> inputs = random_inputs(program, 8, 3);
  InProcessCommunicator communicator(sizes);
  const Results results = run_threads(communicator, program, sizes, inputs);
  expect_no_errors(results);
  for (int device = 0; device < 8; ++device) {
    const int first = device / 4 * 4;
    for (int64_t x = 0; x < 5; ++x) {
      float sum = inputs[static_cast<size_t>(first)].at({x});
      for (int member = 1; member < 4; ++member) {
        sum += inputs[static_cast<size_t>(first + member)].at({x});
      }
      EXPECT_EQ(results.outputs[static_cast<size_t>(device)].at({x}), sum);
    }
  }
  // The mean loss: a scalar (shape {}) summed over every token axis.
  const Program loss = make_program(OpKind::kAllReduce, {}, {}, {"data", "fsdp"}, sizes);
  std::vector<TensorData> parts;
  for (int device = 0; device < 8; ++device) {
    TensorData part = TensorData::zeros(std::vector<int64_t>{});
    part.values[0] = 0.125f * static_cast<float>(device + 1);
    parts.push_back(part);
  }
  const Results total = run_threads(communicator, loss, sizes, parts);
  expect_no_errors(total);
  for (const TensorData& output : total.outputs) {
    ASSERT_EQ(output.size(), 1);
    EXPECT_EQ(output.values[0], 4.5f);  // 0.125 * 36, exact in binary
  }
}

// Cross-entropy statistics of a vocab split 4 ways: per token (max, sum of exp(x - max), target
// logit) of each shard, combined, equal the statistics of the whole vocab.
TEST(InProcessCommunicator, AllReduceLogSumExpMatchesTheWholeVocab) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  constexpr int kTokens = 4;
  constexpr int kVocab = 16;
  const Program program = make_program(
      OpKind::kAllReduce, {dim("batch", kTokens, {}, sizes), dim("statistics", 3, {}, sizes)},
      {dim("batch", kTokens, {}, sizes), dim("statistics", 3, {}, sizes)}, {"fsdp"}, sizes,
      ReduceOp::kLogSumExp);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  // logits[data][token][vocab]; token 3 is masked (-inf) everywhere but the last shard.
  std::mt19937 generator(5);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  std::vector<float> logits(2 * kTokens * kVocab);
  for (float& logit : logits) {
    logit = normal(generator);
  }
  const auto logit = [&](int data, int token, int vocab) -> float& {
    return logits[static_cast<size_t>((data * kTokens + token) * kVocab + vocab)];
  };
  for (int data = 0; data < 2; ++data) {
    for (int vocab = 0; vocab < 12; ++vocab) {
      logit(data, 3, vocab) = kNegInf;
    }
  }
  const auto target = [](int data, int token) {
    return token == 3 ? 13 + data : (5 * token + 3 * data + 1) % kVocab;
  };
  std::vector<TensorData> inputs;
  for (int device = 0; device < 8; ++device) {
    const int data = device / 4;
    const int shard = device % 4;
    TensorData stats = TensorData::zeros(program.input());
    for (int token = 0; token < kTokens; ++token) {
      float max = kNegInf;
      for (int vocab = shard * 4; vocab < shard * 4 + 4; ++vocab) {
        max = std::max(max, logit(data, token, vocab));
      }
      float sum = 0;
      for (int vocab = shard * 4; vocab < shard * 4 + 4; ++vocab) {
        sum += max == kNegInf ? 0.0f : std::exp(logit(data, token, vocab) - max);
      }
      const int t = target(data, token);
      stats.at({token, 0}) = max;
      stats.at({token, 1}) = sum;
      stats.at({token, 2}) = t / 4 == shard ? logit(data, token, t) : 0.0f;
    }
    inputs.push_back(stats);
  }
  InProcessCommunicator communicator(sizes);
  const Results results = run_threads(communicator, program, sizes, inputs);
  expect_no_errors(results);
  for (int device = 0; device < 8; ++device) {
    const int data = device / 4;
    const TensorData& output = results.outputs[static_cast<size_t>(device)];
    for (int token = 0; token < kTokens; ++token) {
      float max = kNegInf;
      for (int vocab = 0; vocab < kVocab; ++vocab) {
        max = std::max(max, logit(data, token, vocab));
      }
      double sum = 0;
      for (int vocab = 0; vocab < kVocab; ++vocab) {
        sum += std::exp(static_cast<double>(logit(data, token, vocab)) - max);
      }
      const int t = target(data, token);
      EXPECT_EQ(output.at({token, 0}), max);
      EXPECT_NEAR(output.at({token, 1}), sum, 1e-5 * sum) << "token " << token;
      EXPECT_EQ(output.at({token, 2}), logit(data, token, t));
      // The loss the kernel will take from it: logsumexp - target logit.
      const double loss = max + std::log(sum) - logit(data, token, t);
      EXPECT_NEAR(output.at({token, 0}) + std::log(output.at({token, 1})) - output.at({token, 2}),
                  loss, 1e-4 * std::max(1.0, std::abs(loss)));
    }
  }
}

// An expert-parallel style all-to-all: fsdp moves from batch to heads,
// [batch:2@fsdp (8), heads:8] -> [batch:8, heads:2@fsdp (8)].
TEST(InProcessCommunicator, AllToAllMovesAnAxisBetweenDims) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(
      OpKind::kAllToAll, {dim("batch", 8, {"fsdp"}, sizes), dim("heads", 8, {}, sizes)},
      {dim("batch", 8, {}, sizes), dim("heads", 8, {"fsdp"}, sizes)}, {"fsdp"}, sizes);
  const GlobalFn value = [](const std::vector<int64_t>& g, const DeviceContext& device) {
    return static_cast<float>(g[0] * 100 + g[1] + 10000 * coordinate(device, "data"));
  };
  InProcessCommunicator communicator(sizes);
  const Results results =
      run_threads(communicator, program, sizes, inputs_for(program, sizes, 8, value));
  expect_no_errors(results);
  for (int device = 0; device < 8; ++device) {
    const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
    ASSERT_EQ(results.outputs[static_cast<size_t>(device)].shape, (std::vector<int64_t>{8, 2}));
    expect_values(program.output(), context, results.outputs[static_cast<size_t>(device)], value);
  }
}

// A global size that does not divide: 30 rows over fsdp=4 are shards of 8, the last with 2 rows of
// padding, which a gather never reads and a reduce-scatter leaves zero.
TEST(InProcessCommunicator, PaddedShards) {
  const Sizes sizes = mesh({{"fsdp", 4}});
  InProcessCommunicator communicator(sizes);
  const GlobalFn value = [](const std::vector<int64_t>& g, const DeviceContext&) {
    return static_cast<float>(g[0] + 1);
  };
  const Program gather = make_program(OpKind::kAllGather, {dim("rows", 30, {"fsdp"}, sizes)},
                                      {dim("rows", 30, {}, sizes)}, {"fsdp"}, sizes);
  const Results gathered =
      run_threads(communicator, gather, sizes, inputs_for(gather, sizes, 4, value));
  expect_no_errors(gathered);
  for (int device = 0; device < 4; ++device) {
    expect_values(gather.output(), InProcessCommunicator::context_for(device, sizes),
                  gathered.outputs[static_cast<size_t>(device)], value);
  }
  const Program scatter = make_program(OpKind::kReduceScatter, {dim("rows", 30, {}, sizes)},
                                       {dim("rows", 30, {"fsdp"}, sizes)}, {"fsdp"}, sizes);
  const Results scattered =
      run_threads(communicator, scatter, sizes, inputs_for(scatter, sizes, 4, value));
  expect_no_errors(scattered);
  const GlobalFn four_times = [&](const std::vector<int64_t>& g, const DeviceContext& device) {
    return 4 * value(g, device);
  };
  for (int device = 0; device < 4; ++device) {
    expect_values(scatter.output(), InProcessCommunicator::context_for(device, sizes),
                  scattered.outputs[static_cast<size_t>(device)], four_times);
  }
  EXPECT_EQ(scattered.outputs[3].values, (std::vector<float>{100, 104, 108, 112, 116, 120, 0, 0}));
}

// The same all-reduce of random floats of very different magnitudes, 20 times with different
// thread start orders and delays: identical bits every time, equal to the sum in group order.
TEST(InProcessCommunicator, AllReduceIsBitwiseDeterministic) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(OpKind::kAllReduce, {dim("x", 257, {}, sizes)},
                                       {dim("x", 257, {}, sizes)}, {"data", "fsdp"}, sizes);
  const std::vector<TensorData> inputs = random_inputs(program, 8, 42);
  std::vector<float> expected(257);
  std::vector<float> reversed(257);
  for (size_t x = 0; x < expected.size(); ++x) {
    expected[x] = inputs[0].values[x];
    reversed[x] = inputs[7].values[x];
    for (size_t device = 1; device < 8; ++device) {
      expected[x] += inputs[device].values[x];
      reversed[x] += inputs[7 - device].values[x];
    }
  }
  // The order matters for these values, so matching `expected` is meaningful.
  ASSERT_NE(std::memcmp(expected.data(), reversed.data(), expected.size() * sizeof(float)), 0);
  InProcessCommunicator communicator(sizes);
  std::mt19937 generator(2024);
  for (int run = 0; run < 20; ++run) {
    Schedule schedule;
    schedule.start_order = {0, 1, 2, 3, 4, 5, 6, 7};
    std::shuffle(schedule.start_order.begin(), schedule.start_order.end(), generator);
    std::uniform_int_distribution<int> delay(0, 2000);
    for (int device = 0; device < 8; ++device) {
      schedule.delay_us.push_back(run % 2 == 0 ? delay(generator) : 0);
    }
    const Results results = run_threads(communicator, program, sizes, inputs, schedule);
    expect_no_errors(results);
    for (size_t device = 0; device < 8; ++device) {
      ASSERT_EQ(results.outputs[device].values.size(), expected.size());
      EXPECT_EQ(std::memcmp(results.outputs[device].values.data(), expected.data(),
                            expected.size() * sizeof(float)),
                0)
          << "run " << run << " device " << device;
    }
  }
}

// A repeated region runs the same collective op many times: each call meets its own rendezvous,
// even when devices race ahead to later iterations.
TEST(InProcessCommunicator, RepeatedCallsOfOneOp) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(OpKind::kAllReduce, {dim("x", 3, {}, sizes)},
                                       {dim("x", 3, {}, sizes)}, {"fsdp"}, sizes);
  constexpr int kIterations = 200;
  InProcessCommunicator communicator(sizes);
  std::vector<std::string> errors(8);
  std::vector<std::thread> threads;
  for (int device = 0; device < 8; ++device) {
    threads.emplace_back([&, device] {
      const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
      std::mt19937 generator(static_cast<uint32_t>(device));
      std::uniform_int_distribution<int> delay(0, 50);
      TensorData input = TensorData::zeros(program.input());
      TensorData output;
      for (int iteration = 0; iteration < kIterations; ++iteration) {
        input.values = {static_cast<float>(iteration), static_cast<float>(device), 1.0f};
        if (delay(generator) < 5) {
          std::this_thread::sleep_for(std::chrono::microseconds(delay(generator)));
        }
        try {
          communicator.run(program.graph, program.collective(), context, input, output);
        } catch (const std::exception& error) {
          errors[static_cast<size_t>(device)] = error.what();
          return;
        }
        const float group_devices = device < 4 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7;
        if (output.values !=
            std::vector<float>{4.0f * static_cast<float>(iteration), group_devices, 4.0f}) {
          errors[static_cast<size_t>(device)] =
              "wrong result at iteration " + std::to_string(iteration);
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (const std::string& error : errors) {
    EXPECT_EQ(error, "");
  }
}

// Execution slots bound how many devices compute at once, and a device waiting in a collective
// gives its slot back: with fewer slots than devices (even one), every group still completes,
// and never more devices than slots are between collectives at the same time.
TEST(ExecutionSlots, BoundComputeAndNeverDeadlockCollectives) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program fsdp = make_program(OpKind::kAllReduce, {dim("x", 3, {}, sizes)},
                                    {dim("x", 3, {}, sizes)}, {"fsdp"}, sizes);
  const Program data = make_program(OpKind::kAllReduce, {dim("x", 3, {}, sizes)},
                                    {dim("x", 3, {}, sizes)}, {"data"}, sizes);
  constexpr int kIterations = 50;
  for (const int count : {1, 3}) {
    SCOPED_TRACE(std::to_string(count) + " slots");
    ExecutionSlots slots(count);
    InProcessCommunicator communicator(sizes, std::chrono::seconds(20));
    communicator.set_execution_slots(&slots);
    std::atomic<int> computing = 0;
    std::atomic<int> most = 0;
    std::vector<std::string> errors(8);
    std::vector<std::thread> threads;
    for (int device = 0; device < 8; ++device) {
      threads.emplace_back([&, device] {
        const ExecutionSlots::Hold hold(slots);
        const DeviceContext context = InProcessCommunicator::context_for(device, sizes);
        TensorData input = TensorData::zeros(fsdp.input());
        TensorData output;
        for (int iteration = 0; iteration < kIterations; ++iteration) {
          const int now = ++computing;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(std::chrono::microseconds(100));  // "compute"
          --computing;
          input.values = {static_cast<float>(iteration), static_cast<float>(device), 1.0f};
          const Program& program = iteration % 2 == 0 ? fsdp : data;
          try {
            communicator.run(program.graph, program.collective(), context, input, output);
          } catch (const std::exception& error) {
            errors[static_cast<size_t>(device)] = error.what();
            return;
          }
          const float members = iteration % 2 == 0 ? 4.0f : 2.0f;
          if (output.values[0] != members * static_cast<float>(iteration)) {
            errors[static_cast<size_t>(device)] =
                "wrong sum at iteration " + std::to_string(iteration);
            return;
          }
        }
      });
    }
    for (std::thread& thread : threads) {
      thread.join();
    }
    for (const std::string& error : errors) {
      EXPECT_EQ(error, "");
    }
    EXPECT_LE(most.load(), count);
    EXPECT_GE(most.load(), 1);
    EXPECT_EQ(slots.available(), count);  // every slot given back
  }
}

// A slot given back while another device waits for one reaches it, however the hand-overs
// interleave: two devices on one slot pass it back and forth, each waiting while the other
// holds it (the pattern of a device leaving a collective while another enters one). With
// libstdc++ 12's std::counting_semaphore a release that lands between the waiter's spin and its
// sleep could be lost (execution_slots.h); a lost hand-over here would stall until the watchdog.
TEST(ExecutionSlots, EveryReleaseReachesAWaitingDevice) {
  ExecutionSlots slots(1);
  constexpr int kHandOvers = 20000;
  std::atomic<int> turns = 0;
  std::atomic<bool> stalled = false;
  std::vector<std::thread> devices;
  for (int device = 0; device < 2; ++device) {
    devices.emplace_back([&] {
      for (int turn = 0; turn < kHandOvers && !stalled; ++turn) {
        const ExecutionSlots::Hold hold(slots);
        ++turns;
      }
    });
  }
  // A watchdog, not a speed bound: 20,000 hand-overs take milliseconds; a lost one never ends.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (turns.load() < 2 * kHandOvers && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stalled = turns.load() < 2 * kHandOvers;
  for (std::thread& device : devices) {
    device.join();
  }
  EXPECT_FALSE(stalled) << turns.load() << " of " << 2 * kHandOvers << " turns";
  EXPECT_EQ(slots.available(), 1);
}

TEST(ExecutionSlots, NumThreadsZeroSharesTheHostAmongItsRanks) {
  EXPECT_EQ(resolve_num_threads(3), 3);
  EXPECT_EQ(resolve_num_threads(3, 4), 3);  // an explicit value is per process
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(resolve_num_threads(0), hardware);
  EXPECT_EQ(resolve_num_threads(0, 2), std::max(1, hardware / 2));
  EXPECT_EQ(resolve_num_threads(0, 1000), 1);
  EXPECT_THROW(ExecutionSlots(0), std::logic_error);
}

// Device 3 never arrives: the other members of its group fail after the timeout with an error
// naming the op and the missing device; the other group is unaffected; a late arrival fails too.
TEST(InProcessCommunicator, TimeoutNamesTheOpAndTheMissingDevice) {
  const Sizes sizes = mesh({{"data", 2}, {"fsdp", 4}});
  const Program program = make_program(OpKind::kAllReduce, {dim("x", 2, {}, sizes)},
                                       {dim("x", 2, {}, sizes)}, {"fsdp"}, sizes);
  InProcessCommunicator communicator(sizes, std::chrono::milliseconds(200));
  const std::vector<TensorData> inputs = random_inputs(program, 8, 1);
  Schedule schedule;
  schedule.absent.assign(8, false);
  schedule.absent[3] = true;
  const auto start = std::chrono::steady_clock::now();
  const Results results = run_threads(communicator, program, sizes, inputs, schedule);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (size_t device = 0; device < 3; ++device) {
    EXPECT_NE(results.errors[device].find("x/all_reduce"), std::string::npos)
        << results.errors[device];
    EXPECT_NE(results.errors[device].find("device(s) 3 "), std::string::npos)
        << results.errors[device];
  }
  for (size_t device = 4; device < 8; ++device) {
    EXPECT_EQ(results.errors[device], "");
  }
  TensorData output;
  EXPECT_THROW(communicator.run(program.graph, program.collective(),
                                InProcessCommunicator::context_for(3, sizes), inputs[3], output),
               std::runtime_error);
}

// The semantics reject shards that do not fit the op.
TEST(CombineCollective, RejectsInconsistentShards) {
  const Sizes sizes = mesh({{"fsdp", 4}});
  Program program = make_program(OpKind::kAllGather, {dim("rows", 8, {"fsdp"}, sizes)},
                                 {dim("rows", 8, {}, sizes)}, {"fsdp"}, sizes);
  program.graph.mutable_op(program.op).attrs.group_size = 1;  // unchecked
  std::vector<DeviceContext> contexts;
  std::vector<TensorData> inputs;
  for (int device = 0; device < 4; ++device) {
    contexts.push_back(InProcessCommunicator::context_for(device, sizes));
    inputs.push_back(TensorData::zeros(program.input()));
  }
  TensorData output;
  // Three of the four members: rows 6 and 7 have no holder.
  try {
    combine_collective(program.graph, program.collective(),
                       {&contexts[0], &contexts[1], &contexts[2]},
                       {&inputs[0], &inputs[1], &inputs[2]}, contexts[0], output);
    ADD_FAILURE() << "no error";
  } catch (const std::logic_error& error) {
    EXPECT_NE(std::string(error.what()).find("no group member holds global element [rows=6]"),
              std::string::npos)
        << error.what();
  }
  // A shard of the wrong shape.
  TensorData wrong = TensorData::zeros(std::vector<int64_t>{3});
  EXPECT_THROW(
      combine_collective(program.graph, program.collective(),
                         {&contexts[0], &contexts[1], &contexts[2], &contexts[3]},
                         {&inputs[0], &wrong, &inputs[2], &inputs[3]}, contexts[0], output),
      std::logic_error);
  // All four: fine.
  combine_collective(program.graph, program.collective(),
                     {&contexts[0], &contexts[1], &contexts[2], &contexts[3]},
                     {&inputs[0], &inputs[1], &inputs[2], &inputs[3]}, contexts[0], output);
  EXPECT_EQ(output.shape, (std::vector<int64_t>{8}));
}

}  // namespace
}  // namespace tpusim
