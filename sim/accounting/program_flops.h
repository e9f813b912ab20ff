// sim/accounting/program_flops.h: the FLOPs one device executes in one optimizer step, summed over
// its program (repeated regions x repeat, microbatches x gradient_accumulation_steps).
//
// model_matmul counts forward and backward matmuls only: it equals MaxText's
// calculate_tflops_training_per_device (tests/sharding/program_flops_test.cpp). hardware_matmul
// adds remat recompute and the matmuls MaxText does not count (use_iota_embed's one-hot
// embedding): what the MXUs really run. vector is VPU work (elementwise, norms, softmax,
// optimizer), counted per element (model/ir/op_flops.h).
//
// Example:
//   ProgramFlops flops = program_flops(build_step_program(config));
//   flops.hardware_matmul / flops.model_matmul;   // 1.33 with full remat on a dense model
#pragma once

#include "sharding/step_program.h"

namespace tpusim {

struct ProgramFlops {
  double model_matmul = 0;
  double recompute_matmul = 0;
  double uncounted_matmul = 0;  // forward/backward matmuls outside MaxText's count
  double hardware_matmul = 0;   // model + recompute + uncounted
  double vector = 0;
};

ProgramFlops program_flops(const StepProgram& program);

}  // namespace tpusim
