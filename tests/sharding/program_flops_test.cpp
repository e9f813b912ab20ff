// The per-device program's matmul FLOPs without remat recompute equal MaxText's per-device count,
// for every preset and several meshes: the partitioner neither loses nor duplicates work.
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "model/ir/op_flops.h"
#include "sharding/step_program.h"

namespace tpusim {
namespace {

double program_model_matmul_flops(const StepProgram& built) {
  const Graph& graph = built.program.graph;
  double total = 0;
  for (const Op& op : graph.ops()) {
    if (op.phase == Phase::kForward || op.phase == Phase::kBackward) {
      total += static_cast<double>(graph.region(op.region).repeat) * op_flops(graph, op).matmul;
    }
  }
  return total * static_cast<double>(built.accumulation_steps);
}

TEST(ProgramFlops, EqualMaxTextForEveryPresetAndSeveralMeshes) {
  const std::vector<std::vector<std::string>> meshes = {
      {"compile_topology=v5p-8"},
      {"compile_topology=v5p-16", "ici_tensor_parallelism=2"},
      {"compile_topology=v5p-16", "ici_context_parallelism=2"},
      {"compile_topology=v5p-8", "compile_topology_num_slices=2"},
      {"compile_topology=tpu7x-16", "ici_tensor_parallelism=2", "gradient_accumulation_steps=2"},
  };
  for (const std::string& name : available_model_presets("")) {
    for (const auto& mesh : meshes) {
      std::vector<std::string> overrides = {"model_name=" + name, "per_device_batch_size=2",
                                            "max_target_length=512"};
      overrides.insert(overrides.end(), mesh.begin(), mesh.end());
      SCOPED_TRACE(name + " " + mesh.front() + (mesh.size() > 1 ? " " + mesh[1] : ""));
      const Config config = Config::load("", overrides);
      const StepProgram built = build_step_program(config);
      if (!built.program.padding.empty()) {
        continue;  // padded dims do extra (wasted) work by design
      }
      const double expected = maxtext_training_flops_per_device(config).total_tflops() * 1e12;
      EXPECT_NEAR(program_model_matmul_flops(built) / expected, 1.0, 1e-9);
    }
  }
}

// Dropless expert parallelism exchanges worst-case buffers (4x the balanced rows here) but counts
// the routed rows; with ragged_buffer_factor=1 the buffers are the balanced rows.
TEST(ProgramFlops, ExpertParallelMoe) {
  for (const std::string buffer : {"ragged_buffer_factor=-1", "ragged_buffer_factor=1.0"}) {
    SCOPED_TRACE(buffer);
    const Config config =
        Config::load("", {"model_name=mixtral-8x7b", "compile_topology=v5p-16",
                          "per_device_batch_size=2", "max_target_length=512",
                          "ici_expert_parallelism=8", "ici_fsdp_parallelism=-1", buffer});
    const StepProgram built = build_step_program(config);
    ASSERT_TRUE(built.program.padding.empty());
    const double expected = maxtext_training_flops_per_device(config).total_tflops() * 1e12;
    EXPECT_NEAR(program_model_matmul_flops(built) / expected, 1.0, 1e-9);
  }
}

}  // namespace
}  // namespace tpusim
