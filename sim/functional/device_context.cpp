#include "sim/functional/device_context.h"

#include <vector>

namespace tpusim {

int64_t DeviceContext::shard_index(const Dim& dim) const {
  int64_t index = 0;
  for (const std::string& axis : dim.sharded_over) {
    const int mesh_axis = mesh_axis_index(axis);
    index =
        index * sizes[static_cast<size_t>(mesh_axis)] + coordinates[static_cast<size_t>(mesh_axis)];
  }
  return index;
}

int64_t DeviceContext::offset(const Dim& dim) const {
  if (dim.sharded_over.empty()) {
    return 0;
  }
  return shard_index(dim) * dim.size;
}

void DeviceContext::for_each_global_element(
    const Tensor& tensor, const std::function<void(int64_t, int64_t)>& visit) const {
  int64_t count = 1;
  for (const Dim& dim : tensor.dims) {
    count *= dim.size;
  }
  std::vector<int64_t> index(tensor.dims.size(), 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t global = 0;
    bool inside = true;
    for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
      const Dim& info = tensor.dims[dim];
      const int64_t size = info.whole_size();
      const int64_t position = offset(info) + index[dim];
      inside = inside && position < size;
      global = global * size + position;
    }
    visit(flat, inside ? global : -1);
    for (size_t dim = tensor.dims.size(); dim-- > 0;) {
      if (++index[dim] < tensor.dims[dim].size) {
        break;
      }
      index[dim] = 0;
    }
  }
}

}  // namespace tpusim
