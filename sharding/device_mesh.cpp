#include "sharding/device_mesh.h"

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {
namespace {

struct PhysicalAxis {
  int index = 0;  // torus dim or kChipletAxis
  int remaining = 1;
  int full = 1;
};

// Finds whole free axes whose sizes multiply to `size`, preferring fewer axes (the first such set
// in mask order among the fewest). Masks, not vectors, per set tried: the explorer places every
// mesh under every placement choice, and a vector per mask was most of place_mesh's allocations.
std::vector<size_t> whole_axes_for(const std::vector<PhysicalAxis>& axes, int size) {
  const size_t count = axes.size();
  unsigned best = 0;
  int best_count = 0;
  for (unsigned mask = 1; mask < (1u << count); ++mask) {
    long long product = 1;
    int chosen = 0;
    bool usable = true;
    for (size_t bit = 0; bit < count; ++bit) {
      if ((mask & (1u << bit)) == 0) {
        continue;
      }
      if (axes[bit].remaining != axes[bit].full || axes[bit].full == 1) {
        usable = false;
        break;
      }
      product *= axes[bit].full;
      ++chosen;
    }
    if (usable && product == size && (best == 0 || chosen < best_count)) {
      best = mask;
      best_count = chosen;
    }
  }
  std::vector<size_t> whole;
  for (size_t bit = 0; bit < count; ++bit) {
    if ((best & (1u << bit)) != 0) {
      whole.push_back(bit);
    }
  }
  return whole;
}

}  // namespace

bool MeshAxisPlacement::uses_chiplets() const {
  return std::any_of(portions.begin(), portions.end(), [](const PhysicalPortion& portion) {
    return portion.physical_axis == kChipletAxis;
  });
}

bool MeshAxisPlacement::wraps(const Slice& slice) const {
  bool any_torus = false;
  for (const PhysicalPortion& portion : portions) {
    if (portion.physical_axis == kChipletAxis) {
      continue;
    }
    any_torus = true;
    if (!portion.whole_axis || !slice.wraparound[static_cast<size_t>(portion.physical_axis)]) {
      return false;
    }
  }
  return any_torus;
}

std::string MeshAxisPlacement::describe(const Slice& slice) const {
  static const char* const kNames[] = {"x", "y", "z"};
  std::string text;
  for (const PhysicalPortion& portion : portions) {
    text += text.empty() ? "" : " + ";
    if (portion.physical_axis == kChipletAxis) {
      text += "chiplet pair (D2D)";
      continue;
    }
    if (slice.switched) {
      text += "NVSwitch (" + std::to_string(portion.size) + " of " +
              std::to_string(slice.shape.front()) + " GPUs)";
      continue;
    }
    text +=
        std::string("torus ") + kNames[portion.physical_axis] + " (" + std::to_string(portion.size);
    if (!portion.whole_axis) {
      text += " of " + std::to_string(slice.shape[static_cast<size_t>(portion.physical_axis)]);
    }
    text += portion.whole_axis && slice.wraparound[static_cast<size_t>(portion.physical_axis)]
                ? ", wraps)"
                : ")";
  }
  if (dcn_size > 1) {
    text += (text.empty() ? "" : " + ") + std::string("DCN x") + std::to_string(dcn_size);
  }
  return text.empty() ? "-" : text;
}

const MeshAxisPlacement& DeviceMesh::axis(const std::string& name) const {
  return axes.at(static_cast<size_t>(mesh_axis_index(name)));
}

DeviceMesh place_mesh(const MeshShape& shape, const Slice& slice,
                      const std::vector<int>& placed_first) {
  DeviceMesh mesh;
  mesh.shape = shape;
  mesh.placement_order.reserve(kNumMeshAxes);
  mesh.placement_order = placed_first;
  for (int axis = kNumMeshAxes - 1; axis >= 0; --axis) {
    if (std::find(placed_first.begin(), placed_first.end(), axis) == placed_first.end()) {
      mesh.placement_order.push_back(axis);
    }
  }
  std::vector<PhysicalAxis> physical;
  physical.reserve(slice.shape.size() + 1);
  if (slice.devices_per_chip == 2) {
    physical.push_back({kChipletAxis, 2, 2});
  }
  for (size_t dim = 0; dim < slice.shape.size(); ++dim) {
    physical.push_back({static_cast<int>(dim), slice.shape[dim], slice.shape[dim]});
  }
  mesh.axes.resize(kNumMeshAxes);
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    mesh.axes[static_cast<size_t>(axis)].mesh_axis = axis;
    mesh.axes[static_cast<size_t>(axis)].ici_size = shape.ici[static_cast<size_t>(axis)];
    mesh.axes[static_cast<size_t>(axis)].dcn_size = shape.dcn[static_cast<size_t>(axis)];
  }
  for (const int axis : mesh.placement_order) {
    MeshAxisPlacement& placement = mesh.axes[static_cast<size_t>(axis)];
    int needed = placement.ici_size;
    if (needed == 1) {
      continue;
    }
    // 1. One whole free axis of exactly this size (the chiplet pair is first in the list).
    auto exact = std::find_if(physical.begin(), physical.end(), [&](const PhysicalAxis& candidate) {
      return candidate.remaining == candidate.full && candidate.full == needed;
    });
    if (exact != physical.end()) {
      placement.portions.push_back({exact->index, needed, true});
      exact->remaining = 1;
      continue;
    }
    // 2. Several whole free axes.
    const std::vector<size_t> whole = whole_axes_for(physical, needed);
    if (!whole.empty()) {
      for (const size_t index : whole) {
        placement.portions.push_back({physical[index].index, physical[index].full, true});
        physical[index].remaining = 1;
      }
      continue;
    }
    // 3. Parts of axes, minor first: take what divides.
    placement.split = true;
    for (PhysicalAxis& candidate : physical) {
      if (needed == 1) {
        break;
      }
      int take = std::gcd(candidate.remaining, needed);
      if (take <= 1) {
        continue;
      }
      placement.portions.push_back({candidate.index, take, take == candidate.full});
      candidate.remaining /= take;
      needed /= take;
    }
    if (needed != 1) {
      throw UserError(mesh_axis_key(false, mesh_axis_names()[static_cast<size_t>(axis)]) + "=" +
                      std::to_string(placement.ici_size) + " cannot be laid onto the " +
                      shape_to_text(slice.shape) + " devices of " + slice.name);
    }
  }
  return mesh;
}

bool same_layout(const DeviceMesh& a, const DeviceMesh& b) {
  if (a.shape.ici != b.shape.ici || a.shape.dcn != b.shape.dcn || a.axes.size() != b.axes.size()) {
    return false;
  }
  for (size_t axis = 0; axis < a.axes.size(); ++axis) {
    const std::vector<PhysicalPortion>& left = a.axes[axis].portions;
    const std::vector<PhysicalPortion>& right = b.axes[axis].portions;
    if (a.axes[axis].split != b.axes[axis].split || left.size() != right.size()) {
      return false;
    }
    for (size_t portion = 0; portion < left.size(); ++portion) {
      if (left[portion].physical_axis != right[portion].physical_axis ||
          left[portion].size != right[portion].size ||
          left[portion].whole_axis != right[portion].whole_axis) {
        return false;
      }
    }
  }
  return true;
}

std::vector<int> placement_from_config(const Config& config) {
  std::vector<int> axes;
  const std::string text = config.get_string("mesh_placement_first");
  if (!text.empty() && text.back() == ',') {
    throw UserError("mesh_placement_first: '" + text + "' ends with a comma");
  }
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    end = end == std::string::npos ? text.size() : end;
    const std::string name = text.substr(begin, end - begin);
    int axis = 0;
    try {
      axis = mesh_axis_index(name);
    } catch (const UserError& error) {
      throw UserError("mesh_placement_first: " + std::string(error.what()));
    }
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) {
      throw UserError("mesh_placement_first: axis '" + name + "' is listed twice");
    }
    axes.push_back(axis);
    begin = end + 1;
  }
  return axes;
}

std::vector<int> physical_devices_of_mesh(const DeviceMesh& mesh, const Slice& slice) {
  // Replay the placement order to find each portion's stride on its physical axis: earlier
  // portions of the same physical axis are faster.
  struct Stride {
    int physical_axis = 0;
    int size = 1;
    int stride = 1;
  };
  std::vector<std::vector<Stride>> strides(kNumMeshAxes);
  // Positions on the physical axes: [0] the chiplet, [1 + d] torus axis d.
  const auto slot = [](int physical_axis) {
    return physical_axis == kChipletAxis ? size_t{0} : static_cast<size_t>(physical_axis) + 1;
  };
  std::vector<int> taken(slice.shape.size() + 1, 1);
  for (const int axis : mesh.placement_order) {
    for (const PhysicalPortion& portion : mesh.axes[static_cast<size_t>(axis)].portions) {
      int& used = taken[slot(portion.physical_axis)];
      strides[static_cast<size_t>(axis)].push_back({portion.physical_axis, portion.size, used});
      used *= portion.size;
    }
  }
  const int devices = mesh.shape.num_devices();
  std::vector<int> physical(static_cast<size_t>(devices));
  for (int device = 0; device < devices; ++device) {
    // Mesh coordinates, row-major with axis 0 major.
    std::array<int, kNumMeshAxes> coordinate{};
    int rest = device;
    for (int axis = kNumMeshAxes - 1; axis >= 0; --axis) {
      coordinate[static_cast<size_t>(axis)] = rest % mesh.shape.size(axis);
      rest /= mesh.shape.size(axis);
    }
    std::vector<int> position(slice.shape.size() + 1, 0);
    int slice_index = 0;
    for (int axis = 0; axis < kNumMeshAxes; ++axis) {
      const int ici = mesh.shape.ici[static_cast<size_t>(axis)];
      const int dcn = mesh.shape.dcn[static_cast<size_t>(axis)];
      const int value = coordinate[static_cast<size_t>(axis)];
      slice_index = slice_index * dcn + value / ici;
      int ici_value = value % ici;
      for (const Stride& portion : strides[static_cast<size_t>(axis)]) {
        position[slot(portion.physical_axis)] += ici_value % portion.size * portion.stride;
        ici_value /= portion.size;
      }
    }
    int chip = 0;
    for (size_t dim = slice.shape.size(); dim-- > 0;) {
      chip = chip * slice.shape[dim] + position[dim + 1];
    }
    physical[static_cast<size_t>(device)] =
        (slice_index * slice.chips + chip) * slice.devices_per_chip + position[0];
  }
  return physical;
}

}  // namespace tpusim
