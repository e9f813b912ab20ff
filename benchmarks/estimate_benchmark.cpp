// Speed of `tpusim estimate`: one full estimate (config -> program -> memory -> step simulation)
// of llama3.1-405b on slices from 8 chips to a 9216-chip tpu7x-18432. SPMD symmetry (one device
// simulated) and scanned-layer extrapolation should keep the time flat in the chip count. The
// 18432 devices of tpu7x-18432 take ici_data_parallelism=9 (fsdp 2048): the 405b's embed dim
// (16384) does not split over fsdp=18432, which `tpusim estimate` refuses with exit 2 as JAX would.
//
// Run: build/benchmarks/estimate_benchmark --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true   (results: reports/performance.md)
#include <string>

#include <benchmark/benchmark.h>

#include "model/config.h"
#include "sim/estimate/estimate.h"

namespace tpusim {
namespace {

void estimate_405b(benchmark::State& state, const std::string& slice, int data_parallelism) {
  const Config config =
      Config::load("", {"model_name=llama3.1-405b", "compile_topology=" + slice,
                        "per_device_batch_size=1", "max_target_length=8192", "remat_policy=full",
                        "ici_data_parallelism=" + std::to_string(data_parallelism)});
  for (auto _ : state) {
    const Estimate estimate = estimate_config(config);
    benchmark::DoNotOptimize(estimate.step_seconds);
  }
}

BENCHMARK_CAPTURE(estimate_405b, tpu7x_16_8chips, std::string("tpu7x-16"), 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(estimate_405b, tpu7x_128_64chips, std::string("tpu7x-128"), 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(estimate_405b, tpu7x_2048_1024chips, std::string("tpu7x-2048"), 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(estimate_405b, tpu7x_18432_9216chips, std::string("tpu7x-18432"), 9)
    ->Unit(benchmark::kMillisecond);

void load_config_only(benchmark::State& state) {
  for (auto _ : state) {
    const Config config =
        Config::load("", {"model_name=llama3.1-405b", "compile_topology=tpu7x-18432"});
    benchmark::DoNotOptimize(config.keys().size());
  }
}
BENCHMARK(load_config_only)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tpusim

BENCHMARK_MAIN();
