// sim/perf/step_simulator.h: the event scheduler that times one training step.
//
// The per-device program runs on per-device resources: the TensorCore (compute ops, in program
// order, as XLA's schedule fixes it), ICI and DCN (collectives), and the host link (offload).
// Like XLA's latency-hiding scheduler, collectives are asynchronous: each starts as soon as its
// input is ready and its link is free (filling gaps on the link's timeline), and only the ops
// that read its result wait for it. Weight preparation (the cast and FSDP all-gather of a layer's
// weights) depends only on parameters, so it is issued ahead: for scanned layers, one iteration
// ahead (prefetch of the next layer). Gradient reduce-scatters trail the backward pass; DCN
// reductions overlap what follows; tensor-parallel activation collectives sit on the critical
// path unless collective_matmul overlaps them with the matmul they feed. On v7x, SparseCores run
// all-gather / reduce-scatter / all-reduce (sparse_core_collective_offload): gathers on one queue,
// reductions on another at 1/sparsecore_reduce_scatter_time_factor of the ICI roofline; with the
// offload off, v7x's collectives run as continuation fusion: still asynchronous on the links, but
// the XLA fusions carrying their steps take continuation_fusion_tensorcore_share longer (Pallas
// kernels carry none; tensorcore_driven_collectives). On a GPU,
// NCCL collectives are kernels that hold some SMs (collective_compute_share): compute that
// overlaps one runs on the other SMs, and the breakdown charges the difference to
// compute_shared_with_collectives.
//
// A region repeated R times (scanned layers) is simulated for a few iterations until its period is
// steady, then extrapolated, so the cost of a step does not grow with layers or chips (one device
// stands for all: SPMD symmetry).
//
// Each op's duration (compute cost, collective or transfer time) is worked out once per call, not
// once per simulated iteration. A caller that only needs the times (a search over many configs)
// sets record_details = false: the step, microbatch and optimizer times and the hardware FLOPs
// are the same, but no trace, per-op profile or breakdown is built.
//
// Example:
//   StepTiming timing = simulate_step(program, options);
//   timing.step_seconds; timing.breakdown[BreakdownKey::exposed(LinkKind::kIci, {"fsdp"})];
//   options.record_details = false;   // ~10x faster: step_seconds etc. only
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sharding/step_program.h"
#include "sim/perf/op_cost.h"
#include "sim/perf/timing_labels.h"

namespace tpusim {

class Config;

struct PerfOptions {
  CostContext cost;
  bool sparse_core_offload = false;
  bool collective_matmul = false;
  int max_simulated_iterations = 4;
  // Also fill StepTiming's breakdown, trace and profile (false: only the times and FLOPs).
  bool record_details = true;
};

PerfOptions perf_options_from_config(const Config& config, const ChipSpec& chip);

// One op's place on the timeline, for traces. Its lane (an index into StepTiming::lanes) is the
// resource it occupies: the TensorCore (a GPU's SMs), a link with the mesh axes the collective
// runs over (ICI fsdp, D2D tensor, DCN data, NVLink fsdp, InfiniBand fsdp, SparseCore fsdp,
// SparseCore reduce fsdp), the host link, or a pipeline stage.
struct TraceEvent {
  std::string name;
  int lane = 0;
  std::string region;
  double start = 0;
  double duration = 0;
  std::string detail;  // compute: what bounds it (mxu, hbm, vpu, overhead); else the op kind
};

// An op that waited for a collective or host transfer: from the end of that one (on its lane) to
// the start of the op (on the compute lane), drawn as an arrow in traces.
struct TraceFlow {
  int from_lane = 0;  // in StepTiming::lanes
  double from_time = 0;
  int to_lane = 0;
  double to_time = 0;
};

// Where the TensorCore's time goes, per op of the program (all iterations, all microbatches).
struct OpProfile {
  std::string region;
  std::string op;
  std::string bound;  // mxu, hbm, vpu, overhead
  double seconds = 0;
  double calls = 0;
};

struct StepTiming {
  double step_seconds = 0;
  double microbatch_seconds = 0;  // forward + backward of one microbatch
  double optimizer_seconds = 0;
  // Seconds by category over the step (sim/perf/timing_labels.h): compute by what bounds it,
  // exposed collectives by link and mesh axes, host transfers, pipeline bubble, idle. The
  // breakdown, lanes, trace and profile are left empty unless PerfOptions::record_details.
  Breakdown breakdown;
  double hardware_matmul_flops = 0;  // executed per device per step
  std::vector<TraceLane> lanes;      // what TraceEvent::lane and TraceFlow's lanes index
  std::vector<TraceEvent> trace;     // the simulated iterations (not extrapolated ones)
  std::vector<TraceFlow> flows;      // the waits among them
  std::vector<OpProfile> profile;    // compute ops, most expensive first
};

StepTiming simulate_step(const StepProgram& program, const PerfOptions& options);

// One program timed under many options (explore's timing variants): what does not depend on the
// options (each region's ops, carries, weight-only ops, fusions) is worked out once, and each
// compute op's cost once per cost context. run(options) equals simulate_step(program, options).
// The program must outlive it; its mesh may change between runs (collective costs read it at
// each run), its graph may not.
//   StepSimulator simulator(program);
//   for (const PerfOptions& variant : variants) { simulator.run(variant).step_seconds; }
// What the collectives of a program alone force on its step, under one set of perf options:
//   tensorcore_driven_seconds: on v7x with the SparseCore offload off, the XLA fusions carry the
//     steps of the collectives (continuation fusion) and take continuation_fusion_tensorcore_share
//     of their time longer: these seconds (over the whole step) add to the compute ops' time; 0
//     on chips without that path, or with the offload on.
//   busiest_link_seconds: the busiest link's occupied seconds (ICI, DCN, each SparseCore queue,
//     the host link) over one microbatch and the optimizer; a link runs one collective or
//     transfer at a time, so the step takes at least this long.
struct CollectiveBounds {
  double tensorcore_driven_seconds = 0;
  double busiest_link_seconds = 0;
};

class StepSimulator {
 public:
  explicit StepSimulator(const StepProgram& program);
  ~StepSimulator();
  StepSimulator(const StepSimulator&) = delete;
  StepSimulator& operator=(const StepSimulator&) = delete;
  StepTiming run(const PerfOptions& options);
  // Lower bounds on the step from the collectives under `options` (the explorer's branch and
  // bound); see CollectiveBounds.
  CollectiveBounds collective_bounds(const PerfOptions& options);
  // A lower bound on run(options).step_seconds from the dependency chains alone: each region's
  // iteration on the TensorCore in program order, with every collective and transfer taking its
  // own time from the moment its input is ready (no link contention) and inputs from outside the
  // iteration ready at its start, x the region's repeat (x the accumulation steps for a
  // microbatch), plus the deferred gradient reductions. Covers the compute ops as run() costs
  // them, the collectives the TensorCore drives, and the collectives exposed on a chain (a
  // tensor-parallel activation all-gather between two matmuls).
  double chain_bound(const PerfOptions& options);
  // The same bound for every cost context of `contexts` at once (options.cost's own context is
  // not used): each compute op costs its least over them, and the chains are monotone in the
  // costs, so this is at most chain_bound under any one of them.
  double chain_bound(const PerfOptions& options, const std::vector<CostContext>& contexts);
  // The same bound with each compute op costing op_seconds[op id], which must not exceed what
  // run() charges it (the explorer's TensorCore bounds of a remat_policy=none program, which
  // charge fusible ops as fused, to bound other policies' programs).
  double chain_bound(const PerfOptions& options, const std::vector<double>& op_seconds);

  struct Analysis;

 private:
  const StepProgram& program_;
  std::unique_ptr<Analysis> analysis_;
};

}  // namespace tpusim
