#include "sim/functional/device_context.h"

namespace tpusim {

int64_t DeviceContext::shard_index(const Dim& dim) const {
  int64_t index = 0;
  for (const std::string& axis : dim.sharded_over) {
    const int mesh_axis = mesh_axis_index(axis);
    index = index * sizes[static_cast<size_t>(mesh_axis)] + coordinates[static_cast<size_t>(mesh_axis)];
  }
  return index;
}

int64_t DeviceContext::offset(const Dim& dim) const {
  if (dim.sharded_over.empty()) {
    return 0;
  }
  return shard_index(dim) * dim.size;
}

}  // namespace tpusim
