#include "sim/perf/timing_labels.h"

#include <algorithm>
#include <cctype>
#include <utility>

namespace tpusim {
namespace {

std::string join_axes(const std::vector<std::string>& axes) {
  std::string text;
  for (const std::string& axis : axes) {
    text += (text.empty() ? "" : "+") + axis;
  }
  return text;
}

const char* lane_kind_name(LaneKind kind) {
  switch (kind) {
    case LaneKind::kTensorCore:
      return "TensorCore";
    case LaneKind::kGpuSms:
      return "GPU SMs";
    case LaneKind::kStage:
      return "Stage";
    case LaneKind::kIci:
      return "ICI";
    case LaneKind::kD2d:
      return "D2D";
    case LaneKind::kNvLink:
      return "NVLink";
    case LaneKind::kSparseCore:
      return "SparseCore";
    case LaneKind::kSparseCoreReduce:
      return "SparseCore reduce";
    case LaneKind::kDcn:
      return "DCN";
    case LaneKind::kInfiniBand:
      return "InfiniBand";
    case LaneKind::kHost:
      return "Host link";
  }
  return "";
}

}  // namespace

const char* link_kind_name(LinkKind link) {
  switch (link) {
    case LinkKind::kIci:
      return "ici";
    case LinkKind::kDcn:
      return "dcn";
    case LinkKind::kD2d:
      return "d2d";
  }
  return "";
}

BreakdownKey BreakdownKey::compute(CostCategory bound) {
  BreakdownKey key;
  key.kind = BreakdownKind::kCompute;
  key.bound = bound;
  return key;
}

BreakdownKey BreakdownKey::exposed(LinkKind link, std::vector<std::string> axes) {
  BreakdownKey key;
  key.kind = BreakdownKind::kExposedCollective;
  key.link = link;
  key.axes = std::move(axes);
  return key;
}

BreakdownKey BreakdownKey::of(BreakdownKind kind) {
  BreakdownKey key;
  key.kind = kind;
  return key;
}

bool BreakdownKey::exposed_over(const std::string& axis) const {
  return kind == BreakdownKind::kExposedCollective && axes.size() == 1 && axes.front() == axis;
}

std::string breakdown_name(const BreakdownKey& key) {
  switch (key.kind) {
    case BreakdownKind::kCompute:
      return std::string("compute_") + cost_category_name(key.bound);
    case BreakdownKind::kComputeSharedWithCollectives:
      return "compute_shared_with_collectives";
    case BreakdownKind::kExposedCollective:
      return std::string("exposed_") + link_kind_name(key.link) + "_" + join_axes(key.axes);
    case BreakdownKind::kExposedGradientReduction:
      return "exposed_dcn_gradient_reduction";
    case BreakdownKind::kHostTransfers:
      return "host_transfers";
    case BreakdownKind::kPipelineBubble:
      return "pipeline_bubble";
    case BreakdownKind::kIdle:
      return "idle";
  }
  return "";
}

std::string breakdown_label(const BreakdownKey& key) {
  switch (key.kind) {
    case BreakdownKind::kCompute: {
      static const std::map<CostCategory, std::string> kBounds = {
          {CostCategory::kMxu, "compute, MXU-bound"},
          {CostCategory::kHbm, "compute, HBM-bound"},
          {CostCategory::kVpu, "compute, VPU-bound"},
          {CostCategory::kOverhead, "compute, per-op overhead"}};
      return kBounds.at(key.bound);
    }
    case BreakdownKind::kComputeSharedWithCollectives:
      return "compute slowed by collectives";
    case BreakdownKind::kExposedCollective: {
      std::string link = link_kind_name(key.link);
      std::transform(link.begin(), link.end(), link.begin(),
                     [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
      return "waiting for " + link + " collectives over " + join_axes(key.axes);
    }
    case BreakdownKind::kExposedGradientReduction:
      return "waiting for the DCN gradient all-reduce";
    case BreakdownKind::kHostTransfers:
      return "waiting for host transfers";
    case BreakdownKind::kPipelineBubble:
      return "pipeline bubble";
    case BreakdownKind::kIdle:
      return "idle";
  }
  return "";
}

std::string breakdown_resource(const BreakdownKey& key) {
  switch (key.kind) {
    case BreakdownKind::kCompute:
      return cost_category_name(key.bound);
    case BreakdownKind::kComputeSharedWithCollectives:
      return "shared";
    case BreakdownKind::kExposedCollective:
      return link_kind_name(key.link);
    case BreakdownKind::kExposedGradientReduction:
      return "dcn";
    case BreakdownKind::kHostTransfers:
      return "host";
    case BreakdownKind::kPipelineBubble:
      return "bubble";
    case BreakdownKind::kIdle:
      return "idle";
  }
  return "";
}

bool BreakdownKeyOrder::operator()(const BreakdownKey& a, const BreakdownKey& b) const {
  return breakdown_name(a) < breakdown_name(b);
}

std::map<std::string, double> rendered_breakdown(const Breakdown& breakdown) {
  std::map<std::string, double> named;
  for (const auto& [key, seconds] : breakdown) {
    named[breakdown_name(key)] = seconds;
  }
  return named;
}

std::string lane_name(const TraceLane& lane) {
  std::string name = lane_kind_name(lane.kind);
  switch (lane.kind) {
    case LaneKind::kTensorCore:
    case LaneKind::kGpuSms:
    case LaneKind::kHost:
      return name;
    case LaneKind::kStage:
      return name + " " + std::to_string(lane.stage);
    case LaneKind::kIci:
    case LaneKind::kD2d:
    case LaneKind::kNvLink:
    case LaneKind::kSparseCore:
    case LaneKind::kSparseCoreReduce:
    case LaneKind::kDcn:
    case LaneKind::kInfiniBand:
      return name + " " + (lane.gradients ? std::string("gradients") : join_axes(lane.axes));
  }
  return name;
}

}  // namespace tpusim
