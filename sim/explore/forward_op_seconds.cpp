#include "sim/explore/forward_op_seconds.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace tpusim {

void ForwardOpSeconds::add(int region, std::string_view name, const double* seconds) {
  if (like_ != nullptr) {
    ++like_adds_;
    seconds_.insert(seconds_.end(), seconds, seconds + contexts_);
    return;
  }
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
  if (like_ != nullptr) {
    finish_like();
    return;
  }
  std::vector<uint32_t> order(regions_.size());
  std::iota(order.begin(), order.end(), uint32_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return regions_[a] != regions_[b] ? regions_[a] < regions_[b] : name(a) < name(b);
  });
  ForwardOpSeconds sorted(contexts_);
  for (const uint32_t entry : order) {
    const size_t last = sorted.size();
    if (last > 0 && sorted.regions_[last - 1] == regions_[entry] &&
        sorted.name(last - 1) == name(entry)) {
      // A name seen twice in a region keeps its cheaper cost (the bound stays a lower bound).
      for (size_t context = 0; context < contexts_; ++context) {
        double& kept = sorted.seconds_[(last - 1) * contexts_ + context];
        kept = std::min(kept, seconds_[entry * contexts_ + context]);
      }
    } else {
      sorted.add(regions_[entry], name(entry), seconds_.data() + entry * contexts_);
    }
    sorted.merged_into_.push_back(static_cast<uint32_t>(sorted.size() - 1));
  }
  sorted.order_ = std::move(order);
  *this = std::move(sorted);
}

void ForwardOpSeconds::finish_like() {
  const ForwardOpSeconds& like = *like_;
  if (like_adds_ != like.order_.size()) {
    throw std::logic_error("ForwardOpSeconds: a table made like another had other adds");
  }
  std::vector<double> merged(like.size() * contexts_);
  for (size_t at = 0; at < like.order_.size(); ++at) {  // as finish() merged them
    const size_t entry = like.merged_into_[at];
    // finish() appends entries in order: an entry met before was the previous add's.
    const bool seen = at > 0 && like.merged_into_[at - 1] == entry;
    const double* seconds = seconds_.data() + static_cast<size_t>(like.order_[at]) * contexts_;
    double* kept = merged.data() + entry * contexts_;
    for (size_t context = 0; context < contexts_; ++context) {
      kept[context] = seen ? std::min(kept[context], seconds[context]) : seconds[context];
    }
  }
  regions_ = like.regions_;
  name_ends_ = like.name_ends_;
  names_ = like.names_;
  seconds_ = std::move(merged);
  like_ = nullptr;  // no order of its own: a table made like it must be made like `like`
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
