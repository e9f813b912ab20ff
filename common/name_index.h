// common/name_index.h: look a row of a table up by its `name`, for the tables tpusim loads once
// (configs/maxtext/base_keys.tsv, train_keys.tsv, ...).
//
// Example:
//   struct Row { std::string name; int value; };
//   static const std::vector<Row> rows = load();
//   static const NameIndex<Row> index(rows);
//   const Row* found = index.find("learning_rate");  // nullptr when no row has that name
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

// The rows of `table` by name (the table must outlive the index; the first of equal names wins).
template <typename Row>
class NameIndex {
 public:
  explicit NameIndex(const std::vector<Row>& table) {
    for (const Row& row : table) {
      by_name_.emplace(row.name, &row);
    }
  }

  const Row* find(std::string_view name) const {
    const auto found = by_name_.find(name);
    return found == by_name_.end() ? nullptr : found->second;
  }

 private:
  std::map<std::string, const Row*, std::less<>> by_name_;
};

}  // namespace tpusim
