// sim/plan/throughput_bound.h: the most tokens per second one chip of a kind can train, proven
// before any search, so that `tpusim plan` skips a slice that cannot beat its incumbent.
//
// A step computes at least MaxText's matmul FLOPs (model/flops_maxtext.h: causal attention
// halved, no remat recompute, so never more than the program computes), and the TensorCore runs
// no matmul faster than the chip's MXU peak x mxu_achievable_fraction x program_efficiency (the
// rate the explorer's own bounds charge, sim/explore/step_bounds.h). Hence, whatever the mesh,
// batch, remat or slice size:
//   tokens/s/chip <= devices_per_chip x that rate / (MaxText FLOPs per token),
// so time >= tokens x FLOPs/token / (chips x rate) and chip-hours >= tokens x FLOPs/token / rate,
// independent of the chip count. Models with experts get no bound (infinity): a capacity factor
// below 1 computes fewer FLOPs than MaxText counts.
//
// Example:
//   Config on_slice = config;  // compile_topology=tpu7x-256 ...
//   throughput_upper_bound(on_slice).tokens_per_s_per_chip;  // ~4.3e3 for llama3.1-70b, 8k
#pragma once

namespace tpusim {

class Config;

struct ThroughputBound {
  double tokens_per_s_per_chip = 0;  // infinity when no bound applies
  double flops_per_token = 0;        // MaxText's training FLOPs per token
  double flops_per_s_per_chip = 0;   // the rate charged
};

ThroughputBound throughput_upper_bound(const Config& config);

}  // namespace tpusim
