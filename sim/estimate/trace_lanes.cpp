#include "sim/estimate/trace_lanes.h"

#include <algorithm>

namespace tpusim {

int lane_group(const std::string& lane) {
  auto starts = [&lane](const char* prefix) { return lane.rfind(prefix, 0) == 0; };
  if (starts("TensorCore") || starts("GPU") || starts("Stage")) {
    return 0;
  }
  if (starts("ICI") || starts("D2D") || starts("NVLink")) {
    return 1;
  }
  if (starts("SparseCore")) {
    return 2;
  }
  if (starts("DCN") || starts("InfiniBand")) {
    return 3;
  }
  return 4;
}

std::vector<std::string> ordered_lanes(const std::vector<TraceEvent>& trace) {
  std::vector<std::string> lanes;
  for (const TraceEvent& event : trace) {
    if (std::find(lanes.begin(), lanes.end(), event.resource) == lanes.end()) {
      lanes.push_back(event.resource);
    }
  }
  std::stable_sort(lanes.begin(), lanes.end(), [](const std::string& a, const std::string& b) {
    return lane_group(a) < lane_group(b);
  });
  return lanes;
}

}  // namespace tpusim
