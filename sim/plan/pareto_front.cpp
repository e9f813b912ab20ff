#include "sim/plan/pareto_front.h"

#include <algorithm>

namespace tpusim {

bool dominates(const std::pair<double, double>& a, const std::pair<double, double>& b) {
  return a.first <= b.first && a.second <= b.second && (a.first < b.first || a.second < b.second);
}

std::vector<size_t> pareto_front(const std::vector<std::pair<double, double>>& costs) {
  std::vector<size_t> order(costs.size());
  for (size_t index = 0; index < order.size(); ++index) {
    order[index] = index;
  }
  // By first cost, then second, then position: a point can be dominated only by one before it.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] < costs[b]; });
  std::vector<size_t> front;
  for (const size_t index : order) {
    // Sorted so: the last kept point has the least second cost so far.
    if (front.empty() || costs[index].second < costs[front.back()].second) {
      front.push_back(index);
    }
  }
  return front;
}

}  // namespace tpusim
