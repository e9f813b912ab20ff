// sharding/step_program.h: config -> slice -> mesh -> training step -> per-device program.
//
// The one pipeline every command uses, so `estimate`, `program`, `explore` and `train` all read
// the same program for the same config. The graph holds one microbatch (per_device_batch_size x
// devices sequences); an optimizer step runs gradient_accumulation_steps of them, as in MaxText.
//
// Example:
//   StepProgram program = build_step_program(Config::load("", {"model_name=llama2-7b",
//                                                              "compile_topology=v5p-128"}));
//   program.program.graph.to_text();
#pragma once

#include <cstdint>
#include <memory>

#include "common/mechanisms.h"
#include "hw/slice.h"
#include "model/autodiff/training_step.h"
#include "sharding/partitioner.h"

namespace tpusim {

class Config;

struct StepProgram {
  Slice slice;
  DeviceMesh mesh;
  // The global step (before partitioning); shared, so that programs of many meshes (explore) can
  // reuse one step without copying its graph.
  std::shared_ptr<const TrainingStep> step;
  PartitionedProgram program;  // one device's program
  int64_t global_batch = 0;    // sequences per optimizer step
  int64_t microbatch = 0;      // sequences per microbatch (the graph's batch)
  int64_t accumulation_steps = 1;
  // attention=dot_product: each attention op materializes its [batch, heads, q, kv] scores in HBM
  // (MaxText apply_attention_dot), which the memory model counts; flash tiles them in VMEM.
  bool attention_scores_in_hbm = false;
  // hbm_headroom_fraction: the share of usable HBM held back (a compiler/runtime reserve) before
  // the memory model decides the program fits.
  double hbm_headroom_fraction = 0;
};

// The slice a config names (compile_topology, compile_topology_num_slices; -1 = 1 slice).
Slice slice_from_config(const Config& config);

// UserError when a mesh axis does not split a parameter, the inputs' length or the loaded batch
// evenly (sharding/divisibility.h: the check explore prunes by).
// `mechanisms` go to the partitioner (all on unless given); `order` groups the decoder layers
// (model/builder/layer_plan.h: train builds train_layer_order's, the others kByKind).
StepProgram build_step_program(const Config& config,
                               const MechanismSet& mechanisms = MechanismSet(),
                               LayerOrder order = LayerOrder::kByKind);

}  // namespace tpusim
