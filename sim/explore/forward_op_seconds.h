// sim/explore/forward_op_seconds.h: the TensorCore seconds of a remat_policy=none program's
// forward compute ops per cost context, by (region, op name), for remat_bounds (step_bounds.h) to
// add a policy's recomputed ops. Built once per bound program and kept with its bounds, so it is
// a few flat arrays (names in one string) rather than a tree of strings and vectors.
//
// Example:
//   ForwardOpSeconds table(/*contexts=*/2);
//   table.add(0, "layers/mlp/wi", {1e-3, 2e-3});
//   table.add(0, "layers/mlp/wi", {3e-3, 1e-3});  // a name seen twice keeps its cheaper costs
//   table.finish();
//   table.find(0, "layers/mlp/wi");  // -> {1e-3, 1e-3}; nullptr for a name not added
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

class ForwardOpSeconds {
 public:
  explicit ForwardOpSeconds(size_t contexts = 0) : contexts_(contexts) {}
  // A table to be filled by the same adds as finished table `like` (the same regions and names in
  // the same order; a program's bounds again, on another mesh): add() keeps only the seconds and
  // finish() takes like's entries and merges as like's did, without sorting. `like` must outlive
  // finish() and be finished by the plain finish() (a table made like another keeps no order).
  ForwardOpSeconds(size_t contexts, const ForwardOpSeconds* like)
      : contexts_(contexts), like_(like) {}
  // Adds an op's seconds per context (`seconds` has one per context); before finish().
  void add(int region, std::string_view name, const double* seconds);
  // Sorts the entries and merges each (region, name) into its least seconds per context.
  void finish();
  // The seconds per context of (region, name), or nullptr; after finish().
  const double* find(int region, std::string_view name) const;
  size_t size() const { return regions_.size(); }

 private:
  std::string_view name(size_t entry) const;
  void finish_like();

  size_t contexts_ = 0;
  std::vector<int> regions_;       // by entry
  std::vector<size_t> name_ends_;  // by entry: where its name ends in names_
  std::string names_;              // the entries' names one after another
  std::vector<double> seconds_;    // entries x contexts
  // After finish(): the adds in sorted order, and the entry each merged into, by that order.
  std::vector<uint32_t> order_;
  std::vector<uint32_t> merged_into_;
  const ForwardOpSeconds* like_ = nullptr;
  size_t like_adds_ = 0;  // adds to a table made like another
};

}  // namespace tpusim
