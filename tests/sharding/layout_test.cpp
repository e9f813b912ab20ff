// AxisList and Layout, the partitioner's inline lists of mesh axes per dim.
#include "sharding/layout.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tpusim {
namespace {

TEST(AxisList, EditsInOrder) {
  AxisList axes = {8, 3};
  axes.push_back(5);
  EXPECT_EQ(axes.size(), 3U);
  EXPECT_TRUE(axes.contains(3));
  EXPECT_FALSE(axes.contains(4));
  EXPECT_EQ(axes.without(AxisList{8}), (AxisList{3, 5}));
  axes.sort();
  EXPECT_EQ(axes, (AxisList{3, 5, 8}));
  axes.append(AxisList{1});
  EXPECT_EQ(axes, (AxisList{3, 5, 8, 1}));
  EXPECT_LT(AxisList{3}, (AxisList{3, 5}));
  axes.clear();
  EXPECT_TRUE(axes.empty());
}

TEST(AxisList, RefusesMoreAxesThanTheMesh) {
  AxisList axes;
  for (int axis = 0; axis < kNumMeshAxes; ++axis) {
    axes.push_back(axis);
  }
  EXPECT_THROW(axes.push_back(0), std::logic_error);
}

TEST(Layout, ComparesDimByDim) {
  Layout layout = {AxisList{3}, AxisList{}, AxisList{8}};
  EXPECT_EQ(layout.size(), 3U);
  EXPECT_EQ(layout[2], AxisList{8});
  Layout other = layout;
  EXPECT_EQ(layout, other);
  other[1].push_back(5);
  EXPECT_NE(layout, other);
  EXPECT_LT(layout, other);
  Layout wide;
  for (size_t dim = 0; dim < Layout::kCapacity; ++dim) {
    wide.push_back({});
  }
  EXPECT_THROW(wide.push_back({}), std::logic_error);
}

}  // namespace
}  // namespace tpusim
