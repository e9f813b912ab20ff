// sharding/layout.h: a tensor's layout as the partitioner plans with it: for each dim, the mesh
// axes that split it.
//
// A dim is split over a few of the 12 mesh axes (an AxisList, major to minor), and a tensor has a
// few dims (a Layout: one AxisList per dim). The partitioner copies, compares and edits layouts
// for every operand of every op it partitions, so both keep their elements inline (fixed
// capacity, no heap allocation). Outgrowing a capacity is a bug (std::logic_error): each mesh axis
// splits at most one dim of a tensor, and tensors have at most a handful of dims.
//
// Example:
//   AxisList axes = {3, 8};             // fsdp, tensor (mesh_axis_index)
//   axes.push_back(5);                  // + context: {3, 8, 5}
//   axes.contains(8);                   // true
//   axes.without(AxisList{8});          // {3, 5}
//   Layout layout;                      // w[embed, mlp]:
//   layout.push_back({3});              //   embed over fsdp
//   layout.push_back({8});              //   mlp over tensor
//   for (AxisList& dim_axes : layout) { dim_axes.sort(); }
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <vector>

#include "sharding/mesh.h"

namespace tpusim {

class AxisList {
 public:
  // Each mesh axis at most once (MaxText rejects a rule that names an axis twice).
  static constexpr size_t kCapacity = kNumMeshAxes;

  AxisList() = default;
  AxisList(std::initializer_list<int> axes) {
    for (const int axis : axes) {
      push_back(axis);
    }
  }
  explicit AxisList(const std::vector<int>& axes) {
    for (const int axis : axes) {
      push_back(axis);
    }
  }

  void push_back(int axis) {
    if (size_ == kCapacity) {
      throw std::logic_error("AxisList: more axes than the mesh has on one dim");
    }
    axes_[size_++] = static_cast<uint8_t>(axis);
  }
  void append(const AxisList& other) {
    for (const int axis : other) {
      push_back(axis);
    }
  }
  void clear() { size_ = 0; }
  // Mesh order (major to minor), so equal splits compare equal. Insertion sort: a list holds at
  // most kCapacity axes, and unlike std::sort's heap fallback it lets GCC 12 at -O3 see that no
  // index passes size_ (its -Warray-bounds otherwise flags the unreachable heap path).
  void sort() {
    for (size_t index = 1; index < size_; ++index) {
      const uint8_t axis = axes_[index];
      size_t hole = index;
      for (; hole > 0 && axes_[hole - 1] > axis; --hole) {
        axes_[hole] = axes_[hole - 1];
      }
      axes_[hole] = axis;
    }
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  const uint8_t* begin() const { return axes_.data(); }
  const uint8_t* end() const { return axes_.data() + size_; }
  uint8_t* begin() { return axes_.data(); }
  uint8_t* end() { return axes_.data() + size_; }

  bool contains(int axis) const { return std::find(begin(), end(), axis) != end(); }
  // The axes not in `removed`, in order.
  AxisList without(const AxisList& removed) const {
    AxisList result;
    for (const int axis : *this) {
      if (!removed.contains(axis)) {
        result.push_back(axis);
      }
    }
    return result;
  }

  // A loop, not std::equal: on bytes that becomes a call to memcmp, costly for one or two axes
  // (layouts are compared for every operand the partitioner reshards).
  friend bool operator==(const AxisList& a, const AxisList& b) {
    if (a.size_ != b.size_) {
      return false;
    }
    for (size_t index = 0; index < a.size_; ++index) {
      if (a.axes_[index] != b.axes_[index]) {
        return false;
      }
    }
    return true;
  }
  friend bool operator<(const AxisList& a, const AxisList& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  // Only the first size_ entries are set (no zero-filling: lists are built and copied often).
  std::array<uint8_t, kCapacity> axes_;
  uint8_t size_ = 0;
};

class Layout {
 public:
  static constexpr size_t kCapacity = 8;  // dims per tensor

  Layout() = default;
  Layout(std::initializer_list<AxisList> dims) {
    for (const AxisList& axes : dims) {
      push_back(axes);
    }
  }

  void push_back(const AxisList& axes) {
    if (size_ == kCapacity) {
      throw std::logic_error("Layout: a tensor with more than 8 dims");
    }
    dims_[size_++] = axes;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const AxisList& operator[](size_t dim) const { return dims_[dim]; }
  AxisList& operator[](size_t dim) { return dims_[dim]; }
  const AxisList* begin() const { return dims_.data(); }
  const AxisList* end() const { return dims_.data() + size_; }
  AxisList* begin() { return dims_.data(); }
  AxisList* end() { return dims_.data() + size_; }

  friend bool operator==(const Layout& a, const Layout& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator<(const Layout& a, const Layout& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::array<AxisList, kCapacity> dims_;  // the first size_ are used
  uint8_t size_ = 0;
};

}  // namespace tpusim
