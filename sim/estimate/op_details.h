// sim/estimate/op_details.h: per compute op of an estimate's program, what a performance engineer
// reads in xprof's op profile: FLOPs and HBM bytes per call, operand and result shapes, what bounds
// it and whether it is recomputed (remat), with its time per call and per step from the step's
// profile; the achieved rates follow (FLOPs or bytes over the time per call).
//
// FLOPs and bytes come from the op's cost (sim/perf/op_cost.h) under the estimate's cost context:
// MXU FLOPs as costed, VPU FLOPs and HBM bytes read back from the VPU and HBM seconds at the rates
// op_cost charges (vpu_tflops_per_chip; hbm_bandwidth_gbps x hbm_achievable_fraction, per device;
// both times the program efficiency). An elementwise op fused into its producer moves fewer bytes:
// of its fused and unfused costs, the one whose time matches the profile's time per call is used.
//
// Example:
//   for (const OpDetail& op : op_details(estimate)) { op.flops / op.seconds_per_call; }
#pragma once

#include <string>
#include <vector>

#include "sim/estimate/estimate.h"

namespace tpusim {

struct OpDetail {
  std::string region;
  std::string op;      // its kind and name, as the profile lists it: "einsum mlp/wi_0"
  std::string name;    // its name, as trace events carry it: "mlp/wi_0"
  std::string bound;   // mxu, hbm, vpu, overhead
  double calls = 0;    // per step
  double seconds = 0;  // per step, all calls
  double seconds_per_call = 0;
  double flops = 0;      // per call: MXU and VPU
  double hbm_bytes = 0;  // per call
  std::string shapes;    // "bf16[8,2048,8192] x bf16[8192,28672] -> bf16[8,2048,28672]"
  bool recomputed = false;
};

// Every op of the step's profile (compute ops, most time first).
std::vector<OpDetail> op_details(const Estimate& estimate);

}  // namespace tpusim
