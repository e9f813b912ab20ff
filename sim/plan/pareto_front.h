// sim/plan/pareto_front.h: the points no other point beats on both of two costs (both smaller is
// better: days to the token budget and chip-hours, or days and cost).
//
// A point is dominated when another is no worse on both costs and better on one; the front is
// every point that is not, in increasing first cost. Of points equal on both costs, the first
// is kept.
//
// Example:
//   pareto_front({{10, 5}, {8, 6}, {9, 7}, {10, 5}});  // {1, 0}: (9, 7) is beaten by (8, 6)
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace tpusim {

// Indices of the front, by increasing first cost (then second).
std::vector<size_t> pareto_front(const std::vector<std::pair<double, double>>& costs);

// True when `a` dominates `b`.
bool dominates(const std::pair<double, double>& a, const std::pair<double, double>& b);

}  // namespace tpusim
