// The two interpreters of one per-device program check each other: what the functional engine
// really executes, moves and allocates against what the performance and memory models charge.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "model/config.h"
#include "model/ir/op_flops.h"
#include "sharding/partitioner.h"
#include "sim/accounting/program_flops.h"
#include "sim/memory/memory_model.h"
#include "sim/train/trainer.h"

namespace tpusim {
namespace {

Config config_for(const std::vector<std::string>& mesh) {
  std::vector<std::string> overrides = {"model_name=tiny-llama", "max_target_length=64",
                                        "per_device_batch_size=2", "steps=1"};
  overrides.insert(overrides.end(), mesh.begin(), mesh.end());
  return Config::load("", overrides);
}

TEST(InterpretersAgree, FlopsBytesAndPeakMemory) {
  for (const auto& mesh : std::vector<std::vector<std::string>>{
           {"compile_topology=v5e-1"},
           {"compile_topology=v5e-4", "ici_fsdp_parallelism=4"},
           {"compile_topology=v5e-4", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"},
           {"compile_topology=v5e-4", "ici_fsdp_parallelism=2", "ici_context_parallelism=2"},
           // A chunked head (num_vocab_tiling): the head and its backward run once per chunk.
           {"compile_topology=v5e-4", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2",
            "num_vocab_tiling=4"}}) {
    SCOPED_TRACE(mesh.back());
    const Config config = config_for(mesh);
    Trainer trainer(config);
    std::ostringstream quiet;
    const std::vector<StepMetrics> curve =
        trainer.run({.verify = false, .progress = false, .dump_directory = ""}, quiet);
    const ExecutionCounters& executed = curve.front().counters;
    const StepProgram program = build_step_program(config);
    // Einsum FLOPs executed per device (forward, recompute, backward) = the program's count.
    const ProgramFlops flops = program_flops(program);
    double program_einsums = 0;
    for (const Op& op : program.program.graph.ops()) {
      if (op.kind == OpKind::kEinsum && op.phase != Phase::kOptimizer) {
        program_einsums += static_cast<double>(program.program.graph.region(op.region).repeat) *
                           op_flops(program.program.graph, op).matmul;
      }
    }
    EXPECT_DOUBLE_EQ(executed.einsum_flops, program_einsums);
    EXPECT_LE(program_einsums, flops.hardware_matmul);
    // Bytes handed to collectives = what the network model times.
    double program_bytes = 0;
    for (const Op& op : program.program.graph.ops()) {
      if (is_collective(op.kind) && op.phase != Phase::kOptimizer) {
        program_bytes += static_cast<double>(program.program.graph.region(op.region).repeat) *
                         static_cast<double>(collective_bytes(program.program.graph, op));
      }
    }
    EXPECT_DOUBLE_EQ(executed.collective_bytes, program_bytes);
    // Peak bytes allocated by the functional run within 10% of the memory model.
    const MemoryEstimate memory = estimate_memory(program);
    std::cout << "  peak bytes: executed " << executed.peak_bytes << " memory model "
              << memory.peak_bytes << "  " << mesh.back() << "\n";
    EXPECT_NEAR(static_cast<double>(executed.peak_bytes) / memory.peak_bytes, 1.0, 0.10)
        << "executed " << executed.peak_bytes << " model " << memory.peak_bytes;
  }
}

}  // namespace
}  // namespace tpusim
