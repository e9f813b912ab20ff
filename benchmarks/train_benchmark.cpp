// Speed of `tpusim train`: one training step of tiny-llama on 1 simulated device and on 8
// (the same global batch of 16 sequences of 128 tokens), and this machine's Eigen GEMM rate, to
// report tokens/s, the fraction of GEMM throughput a step reaches, and the cost of simulating 8
// devices over 1.
//
// Run: build/benchmarks/train_benchmark --benchmark_repetitions=5 (results: reports/performance.md)
#include <sstream>

// GCC 12's AVX-512 intrinsics (-march=native on an AVX-512 host) initialize a dummy register
// with itself, which -Wmaybe-uninitialized reports inside Eigen's GEMM packing: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#include <benchmark/benchmark.h>

#include "model/config.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

Config tiny_llama(const std::string& slice, const std::string& per_device_batch,
                  const std::vector<std::string>& mesh) {
  std::vector<std::string> overrides = {"model_name=tiny-llama", "compile_topology=" + slice,
                                        "per_device_batch_size=" + per_device_batch,
                                        "max_target_length=128", "steps=1"};
  overrides.insert(overrides.end(), mesh.begin(), mesh.end());
  return Config::load("", overrides);
}

void train_step(benchmark::State& state, const Config& config) {
  ShardedModel model(config);
  Dataset data = Dataset::from_config(config);
  const int64_t sequences = model.program().microbatch;
  DeviceContext::Optimizer optimizer;
  optimizer.learning_rate = 1e-3;
  double einsum_flops = 0;
  int64_t step = 0;
  for (auto _ : state) {
    const StepResult result = model.compute_gradients({data.train_batch(step++, 0, sequences)});
    model.apply_update(optimizer);
    einsum_flops = result.counters.einsum_flops;
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(sequences * 128), benchmark::Counter::kIsIterationInvariantRate);
  // Every device executes its own einsums: the machine's matmul work is devices x that.
  state.counters["matmul_flops_per_s"] = benchmark::Counter(
      einsum_flops * model.num_devices(), benchmark::Counter::kIsIterationInvariantRate);
}

void tiny_llama_1_device(benchmark::State& state) {
  train_step(state, tiny_llama("v5e-1", "16", {}));
}
void tiny_llama_8_devices(benchmark::State& state) {
  train_step(state,
             tiny_llama("v5e-8", "2", {"ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"}));
}
BENCHMARK(tiny_llama_1_device)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(tiny_llama_8_devices)->Unit(benchmark::kMillisecond)->UseRealTime();

// Single-threaded fp32 GEMM at the sizes of the step's largest matmuls.
void eigen_gemm(benchmark::State& state) {
  const auto size = static_cast<Eigen::Index>(state.range(0));
  Eigen::setNbThreads(1);
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(size, size);
  const Eigen::MatrixXf b = Eigen::MatrixXf::Random(size, size);
  Eigen::MatrixXf c(size, size);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["flops_per_s"] = benchmark::Counter(2.0 * static_cast<double>(size * size * size),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(eigen_gemm)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tpusim

BENCHMARK_MAIN();
