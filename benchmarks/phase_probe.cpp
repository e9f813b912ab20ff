// What one estimate costs, phase by phase: llama3.1-405b on tpu7x-18432 (9216 chips, 18432
// devices; ici_data_parallelism=9, so fsdp 2048 splits the embed dim), per_device_batch_size=1,
// max_target_length=8192, remat_policy=full. `tpusim explore` runs these phases for every
// candidate config, so each one is timed alone, on inputs built once outside the timed loop:
//   slice_from_config    compile_topology -> Slice (chip catalog lookup, torus shape)
//   place_mesh           the ici_*/dcn_* mesh resolved and placed on the torus
//   build_training_step  forward graph, autodiff with remat, optimizer
//   partition            logical axis rules -> the per-device program with collectives
//   program_flops        model and hardware FLOPs of the program
//   estimate_memory      liveness over the program -> peak HBM per device
//   simulate_step        the step scheduler, with breakdown, trace and profile (tpusim estimate)
//   simulate_step_lean   the same with record_details = false (times and FLOPs only: explore)
//   maxtext_flops        MaxText's calculate_tflops_training_per_device
//
// Each benchmark is named phase_<function>.
//
// Run: build/benchmarks/phase_probe --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true   (results: reports/performance.md)
#include <benchmark/benchmark.h>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "sharding/logical_rules.h"
#include "sharding/step_program.h"
#include "sim/accounting/program_flops.h"
#include "sim/memory/memory_model.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {
namespace {

// The config and one full pipeline run, built once and shared by every benchmark.
struct Fixture {
  Config config;
  StepProgram program;
  LogicalAxisRules rules;
  PerfOptions options;

  Fixture()
      : config(Config::load("", {"model_name=llama3.1-405b", "compile_topology=tpu7x-18432",
                                 "per_device_batch_size=1", "max_target_length=8192",
                                 "remat_policy=full", "ici_data_parallelism=9"})),
        program(build_step_program(config)),
        rules(LogicalAxisRules::from_config(config)),
        options(perf_options_from_config(config, *program.slice.chip)) {}
};

const Fixture& fixture() {
  static const Fixture shared;
  return shared;
}

void phase_slice_from_config(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const Slice slice = slice_from_config(f.config);
    benchmark::DoNotOptimize(slice.chips);
  }
}
BENCHMARK(phase_slice_from_config)->Unit(benchmark::kMicrosecond);

void phase_place_mesh(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const DeviceMesh mesh = place_mesh(resolve_mesh(f.config, f.program.slice), f.program.slice);
    benchmark::DoNotOptimize(mesh.axes.size());
  }
}
BENCHMARK(phase_place_mesh)->Unit(benchmark::kMicrosecond);

void phase_build_training_step(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const TrainingStep step = build_training_step(f.config, f.program.microbatch);
    benchmark::DoNotOptimize(step.graph.ops().size());
  }
}
BENCHMARK(phase_build_training_step)->Unit(benchmark::kMicrosecond);

void phase_partition(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const PartitionedProgram program = partition(*f.program.step, f.rules, f.program.mesh);
    benchmark::DoNotOptimize(program.graph.ops().size());
  }
}
BENCHMARK(phase_partition)->Unit(benchmark::kMicrosecond);

void phase_program_flops(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const ProgramFlops flops = program_flops(f.program);
    benchmark::DoNotOptimize(flops.hardware_matmul);
  }
}
BENCHMARK(phase_program_flops)->Unit(benchmark::kMicrosecond);

void phase_estimate_memory(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const MemoryEstimate memory = estimate_memory(f.program);
    benchmark::DoNotOptimize(memory.peak_bytes);
  }
}
BENCHMARK(phase_estimate_memory)->Unit(benchmark::kMicrosecond);

void phase_simulate_step(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    const StepTiming timing = simulate_step(f.program, f.options);
    benchmark::DoNotOptimize(timing.step_seconds);
  }
}
BENCHMARK(phase_simulate_step)->Unit(benchmark::kMicrosecond);

void phase_simulate_step_lean(benchmark::State& state) {
  const Fixture& f = fixture();
  PerfOptions options = f.options;
  options.record_details = false;
  for (auto _ : state) {
    const StepTiming timing = simulate_step(f.program, options);
    benchmark::DoNotOptimize(timing.step_seconds);
  }
}
BENCHMARK(phase_simulate_step_lean)->Unit(benchmark::kMicrosecond);

void phase_maxtext_flops(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    benchmark::DoNotOptimize(maxtext_training_flops_per_device(f.config));
  }
}
BENCHMARK(phase_maxtext_flops)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tpusim

BENCHMARK_MAIN();
