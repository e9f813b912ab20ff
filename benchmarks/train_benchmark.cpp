// Speed of `tpusim train` (functional_precision=fast, the default): one training step of the
// issue-15 Llama (emb 256, 8 query / 4 kv heads of 32, mlp 1024, 4 layers, vocab 256; 8 sequences
// of 256 tokens) on 1 simulated device with 1 thread, and on 1 and on 8 devices (fsdp=4 x
// tensor=2) with every core, at the same global batch, in fp32 and with
// functional_dtype=bfloat16_matmul; and this machine's single-threaded GEMM rates (Eigen fp32,
// oneDNN fp32 and bf16: how the fast einsum's library was chosen), to report tokens/s, the einsum
// kernels' own FLOP rate (einsum FLOPs over the time spent inside them) against the GEMM rate,
// and the cost of simulating 8 devices over 1.
// The side-by-side comparison with PyTorch is benchmarks/train_vs_torch.py.
//
// Run: build/benchmarks/train_benchmark --benchmark_repetitions=5 (results: reports/performance.md)
#include <cstdint>
#include <sstream>
#include <vector>

// GCC 12's AVX-512 intrinsics (-march=native on an AVX-512 host) initialize a dummy register
// with itself, which -Wmaybe-uninitialized reports inside Eigen's GEMM packing: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#include <benchmark/benchmark.h>

#include "model/config.h"
#include "sim/functional/kernels/library_gemm.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

Config issue_llama(const std::string& threads, const std::vector<std::string>& mesh,
                   const std::string& dtype = "float32") {
  std::vector<std::string> overrides = {"model_name=tiny-llama",
                                        "override_model_config=true",
                                        "base_emb_dim=256",
                                        "base_num_query_heads=8",
                                        "base_num_kv_heads=4",
                                        "head_dim=32",
                                        "base_mlp_dim=1024",
                                        "base_num_decoder_layers=4",
                                        "vocab_size=256",
                                        "max_target_length=256",
                                        "steps=1",
                                        "num_threads=" + threads,
                                        "functional_dtype=" + dtype};
  overrides.insert(overrides.end(), mesh.begin(), mesh.end());
  return Config::load("", overrides);
}

constexpr int64_t kLength = 256;

void train_step(benchmark::State& state, const Config& config) {
  ShardedModel model(config);
  Dataset data = Dataset::from_config(config);
  const int64_t sequences = model.program().microbatch;
  DeviceContext::Optimizer optimizer;
  optimizer.learning_rate = 1e-3;
  double einsum_flops = 0;
  double einsum_seconds = 0;
  int64_t step = 0;
  for (auto _ : state) {
    const StepResult result = model.compute_gradients({data.train_batch(step++, 0, sequences)});
    model.apply_update(optimizer);
    einsum_flops = result.counters.einsum_flops;
    einsum_seconds += result.counters.einsum_seconds;
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(sequences * kLength), benchmark::Counter::kIsIterationInvariantRate);
  // Every device executes its own einsums: the machine's matmul work is devices x that.
  state.counters["matmul_flops_per_s"] = benchmark::Counter(
      einsum_flops * model.num_devices(), benchmark::Counter::kIsIterationInvariantRate);
  // The einsum kernels' own rate (device 0's FLOPs over its time inside them).
  state.counters["einsum_flops_per_s"] =
      einsum_seconds > 0 ? einsum_flops * static_cast<double>(state.iterations()) / einsum_seconds
                         : 0;
}

void one_device_1_thread(benchmark::State& state) {
  train_step(state, issue_llama("1", {"compile_topology=v5e-1", "per_device_batch_size=8"}));
}
void one_device_all_threads(benchmark::State& state) {
  train_step(state, issue_llama("0", {"compile_topology=v5e-1", "per_device_batch_size=8"}));
}
void eight_devices_all_threads(benchmark::State& state) {
  train_step(state, issue_llama("0", {"compile_topology=v5e-8", "per_device_batch_size=1",
                                      "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"}));
}
void one_device_1_thread_bf16(benchmark::State& state) {
  train_step(state, issue_llama("1", {"compile_topology=v5e-1", "per_device_batch_size=8"},
                                "bfloat16_matmul"));
}
BENCHMARK(one_device_1_thread)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(one_device_1_thread_bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(one_device_all_threads)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(eight_devices_all_threads)->Unit(benchmark::kMillisecond)->UseRealTime();

// Single-threaded fp32 GEMM, M x K times K x N: square, and the step's largest matmul (the MLP's
// 2048 tokens x 256 x 1024).
void eigen_gemm(benchmark::State& state) {
  const auto m = static_cast<Eigen::Index>(state.range(0));
  const auto k = static_cast<Eigen::Index>(state.range(1));
  const auto n = static_cast<Eigen::Index>(state.range(2));
  Eigen::setNbThreads(1);
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(m, k);
  const Eigen::MatrixXf b = Eigen::MatrixXf::Random(k, n);
  Eigen::MatrixXf c(m, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["flops_per_s"] = benchmark::Counter(2.0 * static_cast<double>(m * k * n),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(eigen_gemm)
    ->Args({512, 512, 512})
    ->Args({2048, 256, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same products through kernels/library_gemm.h (oneDNN), fp32 and bf16 inputs (converted
// once, outside the timed loop, as the fast einsum converts each operand once per op).
void library_gemm_rate(benchmark::State& state, kernels::GemmPrecision precision) {
  if (!kernels::library_gemm_available(precision)) {
    state.SkipWithError("no oneDNN JIT kernel for this type here");
    return;
  }
  const int64_t m = state.range(0);
  const int64_t k = state.range(1);
  const int64_t n = state.range(2);
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(m, k);  // column-major: (i, j) at i + j m
  const Eigen::MatrixXf b = Eigen::MatrixXf::Random(k, n);
  std::vector<float> c(static_cast<size_t>(m * n));
  std::vector<uint16_t> a16(static_cast<size_t>(m * k));
  std::vector<uint16_t> b16(static_cast<size_t>(k * n));
  kernels::to_bf16(a.data(), a16.data(), m * k);
  kernels::to_bf16(b.data(), b16.data(), k * n);
  const bool bf16 = precision == kernels::GemmPrecision::kBfloat16Inputs;
  const kernels::GemmOperand lhs{bf16 ? static_cast<const void*>(a16.data()) : a.data(), 1, m};
  const kernels::GemmOperand rhs{bf16 ? static_cast<const void*>(b16.data()) : b.data(), 1, k};
  for (auto _ : state) {
    if (!kernels::library_gemm(precision, m, n, k, lhs, rhs, {c.data(), n, 1})) {
      state.SkipWithError("oneDNN has no JIT kernel for this layout");
      break;
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["flops_per_s"] = benchmark::Counter(2.0 * static_cast<double>(m * k * n),
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(kernels::library_gemm_name(precision));
}
void onednn_fp32_gemm(benchmark::State& state) {
  library_gemm_rate(state, kernels::GemmPrecision::kFloat32);
}
void onednn_bf16_gemm(benchmark::State& state) {
  library_gemm_rate(state, kernels::GemmPrecision::kBfloat16Inputs);
}
BENCHMARK(onednn_fp32_gemm)
    ->Args({512, 512, 512})
    ->Args({2048, 256, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(onednn_bf16_gemm)
    ->Args({512, 512, 512})
    ->Args({2048, 256, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tpusim

BENCHMARK_MAIN();
