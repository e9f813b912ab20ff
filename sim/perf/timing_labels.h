// sim/perf/timing_labels.h: the typed names of a step's timing results: the link a collective
// waits on, the breakdown's keys (where the step's seconds go) and the trace's lanes (the
// resources ops run on). The scheduler and the code that reads its results (the explorer's
// pipeline summary, the trace's lane order) work on these values; they become text in one place,
// the render functions below, where JSON, text, HTML and traces are written.
//
// Example:
//   const BreakdownKey key = BreakdownKey::exposed(LinkKind::kIci, {"fsdp"});
//   breakdown_name(key);                               // "exposed_ici_fsdp"
//   key.exposed_over("stage");                         // false
//   lane_name({LaneKind::kIci, {"fsdp", "tensor"}});   // "ICI fsdp+tensor"
//   rendered_breakdown(timing.breakdown);              // {"compute_mxu": 1.2, ...}
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sim/perf/op_cost.h"

namespace tpusim {

// The slowest part of a collective's path: the torus (ICI), the v7x chiplet pair (D2D) or the
// network between slices (DCN).
enum class LinkKind { kIci, kDcn, kD2d };

// "ici", "dcn", "d2d".
const char* link_kind_name(LinkKind link);

// What a share of the step's seconds was spent on.
enum class BreakdownKind {
  kCompute,                       // compute ops, by what bounds them: compute_mxu, ...
  kComputeSharedWithCollectives,  // compute slowed by collectives holding SMs (a GPU)
  kExposedCollective,             // the TensorCore waits for a collective: exposed_ici_fsdp
  kExposedGradientReduction,      // waits for the combined cross-slice gradient all-reduce
  kHostTransfers,                 // waits for host offload / load
  kPipelineBubble,                // a pipeline stage's iterations on no microbatch
  kIdle,                          // the rest of the step
};

// One key of StepTiming::breakdown. `bound` is read for kCompute, `link` and `axes` (the mesh
// axes of the collective, in its order) for kExposedCollective.
struct BreakdownKey {
  BreakdownKind kind = BreakdownKind::kIdle;
  CostCategory bound = CostCategory::kOverhead;
  LinkKind link = LinkKind::kIci;
  std::vector<std::string> axes;

  static BreakdownKey compute(CostCategory bound);
  static BreakdownKey exposed(LinkKind link, std::vector<std::string> axes);
  static BreakdownKey of(BreakdownKind kind);  // the kinds that carry nothing else

  // An exposed collective over the mesh axis `axis` alone (a pipeline's "stage" hand-over).
  bool exposed_over(const std::string& axis) const;

  bool operator==(const BreakdownKey&) const = default;
};

// The key's name in reports: compute_mxu, compute_shared_with_collectives, exposed_<link>_<axes
// joined by '+'>, exposed_dcn_gradient_reduction, host_transfers, pipeline_bubble, idle.
std::string breakdown_name(const BreakdownKey& key);

// The key for people (text tables and pages; JSON keeps breakdown_name): "compute, MXU-bound",
// "compute slowed by collectives", "waiting for ICI collectives over fsdp", "waiting for the DCN
// gradient all-reduce", "waiting for host transfers", "pipeline bubble", "idle".
std::string breakdown_label(const BreakdownKey& key);

// The resource the key's seconds are spent on, which gives its colour in every chart: the
// compute bound (mxu, hbm, vpu, overhead), the link (ici, dcn, d2d), host, shared, bubble, idle.
std::string breakdown_resource(const BreakdownKey& key);

// Breakdown keys ordered as their names are, so the breakdown is listed (and summed) in the same
// order as the reports that print it by name.
struct BreakdownKeyOrder {
  bool operator()(const BreakdownKey& a, const BreakdownKey& b) const;
};

// Seconds by breakdown key over the step.
using Breakdown = std::map<BreakdownKey, double, BreakdownKeyOrder>;

// The breakdown by name, as JSON, text and HTML print it.
std::map<std::string, double> rendered_breakdown(const Breakdown& breakdown);

// The resource a trace event occupies.
enum class LaneKind {
  kTensorCore,
  kGpuSms,            // a GPU's compute
  kStage,             // a pipeline stage's work per iteration
  kIci,               // a TPU's torus links
  kD2d,               // the v7x chiplet pair's link
  kNvLink,            // a GPU node's switch
  kSparseCore,        // v7x collectives offloaded to the SparseCores
  kSparseCoreReduce,  // the SparseCores' reduction queue
  kDcn,               // between TPU slices
  kInfiniBand,        // between GPU nodes
  kHost,              // host offload / load
};

// One lane of a step's trace: its kind, with the collective's mesh axes (sorted) on a link lane,
// the stage number on a stage lane, and `gradients` for the lane of the combined cross-slice
// gradient all-reduce.
struct TraceLane {
  LaneKind kind = LaneKind::kTensorCore;
  std::vector<std::string> axes;
  int64_t stage = 0;
  bool gradients = false;

  bool operator==(const TraceLane&) const = default;
};

// Its name in traces and pages: "TensorCore", "GPU SMs", "Stage 1", "ICI fsdp+tensor",
// "SparseCore reduce fsdp", "DCN gradients", "Host link", ...
std::string lane_name(const TraceLane& lane);

}  // namespace tpusim
