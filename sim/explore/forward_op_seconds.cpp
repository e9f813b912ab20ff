#include "sim/explore/forward_op_seconds.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace tpusim {

void ForwardOpSeconds::add(int region, std::string_view name, const double* seconds) {
  regions_.push_back(region);
  names_.append(name);
  name_ends_.push_back(names_.size());
  seconds_.insert(seconds_.end(), seconds, seconds + contexts_);
}

std::string_view ForwardOpSeconds::name(size_t entry) const {
  const size_t begin = entry == 0 ? 0 : name_ends_[entry - 1];
  return std::string_view(names_).substr(begin, name_ends_[entry] - begin);
}

void ForwardOpSeconds::finish() {
  std::vector<size_t> order(regions_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return regions_[a] != regions_[b] ? regions_[a] < regions_[b] : name(a) < name(b);
  });
  ForwardOpSeconds sorted(contexts_);
  for (const size_t entry : order) {
    const size_t last = sorted.size();
    if (last > 0 && sorted.regions_[last - 1] == regions_[entry] &&
        sorted.name(last - 1) == name(entry)) {
      // A name seen twice in a region keeps its cheaper cost (the bound stays a lower bound).
      for (size_t context = 0; context < contexts_; ++context) {
        double& kept = sorted.seconds_[(last - 1) * contexts_ + context];
        kept = std::min(kept, seconds_[entry * contexts_ + context]);
      }
      continue;
    }
    sorted.add(regions_[entry], name(entry), seconds_.data() + entry * contexts_);
  }
  *this = std::move(sorted);
}

const double* ForwardOpSeconds::find(int region, std::string_view name_of_op) const {
  size_t low = 0;
  size_t high = regions_.size();
  while (low < high) {  // the first entry not below (region, name)
    const size_t middle = low + (high - low) / 2;
    const bool below =
        regions_[middle] != region ? regions_[middle] < region : name(middle) < name_of_op;
    (below ? low : high) = below ? middle + 1 : middle;
  }
  if (low == regions_.size() || regions_[low] != region || name(low) != name_of_op) {
    return nullptr;
  }
  return seconds_.data() + low * contexts_;
}

}  // namespace tpusim
