#include "sim/estimate/trace_lanes.h"

#include <algorithm>

namespace tpusim {

int lane_group(const TraceLane& lane) {
  switch (lane.kind) {
    case LaneKind::kTensorCore:
    case LaneKind::kGpuSms:
    case LaneKind::kStage:
      return 0;
    case LaneKind::kIci:
    case LaneKind::kD2d:
    case LaneKind::kNvLink:
      return 1;
    case LaneKind::kSparseCore:
    case LaneKind::kSparseCoreReduce:
      return 2;
    case LaneKind::kDcn:
    case LaneKind::kInfiniBand:
      return 3;
    case LaneKind::kHost:
      return 4;
  }
  return 4;
}

std::vector<int> ordered_lanes(const StepTiming& timing) {
  std::vector<int> lanes;
  for (const TraceEvent& event : timing.trace) {
    if (std::find(lanes.begin(), lanes.end(), event.lane) == lanes.end()) {
      lanes.push_back(event.lane);
    }
  }
  std::stable_sort(lanes.begin(), lanes.end(), [&timing](int a, int b) {
    return lane_group(timing.lanes[static_cast<size_t>(a)]) <
           lane_group(timing.lanes[static_cast<size_t>(b)]);
  });
  return lanes;
}

std::vector<int> lane_rows(const StepTiming& timing, const std::vector<int>& ordered) {
  std::vector<int> rows(timing.lanes.size(), 0);
  for (size_t row = 0; row < ordered.size(); ++row) {
    rows[static_cast<size_t>(ordered[row])] = static_cast<int>(row);
  }
  return rows;
}

std::string event_resource(const TraceLane& lane, const std::string& detail) {
  switch (lane.kind) {
    case LaneKind::kTensorCore:
    case LaneKind::kGpuSms:
      for (const CostCategory bound :
           {CostCategory::kMxu, CostCategory::kHbm, CostCategory::kVpu, CostCategory::kOverhead}) {
        if (detail == cost_category_name(bound)) {
          return detail;
        }
      }
      return "shared";
    case LaneKind::kStage:
      return detail == "bubble" ? "bubble" : "stage";
    case LaneKind::kIci:
      return "ici";
    case LaneKind::kD2d:
      return "d2d";
    case LaneKind::kNvLink:
      return "nvlink";
    case LaneKind::kSparseCore:
    case LaneKind::kSparseCoreReduce:
      return "sparsecore";
    case LaneKind::kDcn:
      return "dcn";
    case LaneKind::kInfiniBand:
      return "infiniband";
    case LaneKind::kHost:
      return "host";
  }
  return "overhead";
}

}  // namespace tpusim
