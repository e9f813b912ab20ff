#include "model/ir/name.h"

#include <functional>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

namespace tpusim {
namespace {

// The interned texts. A node-based set: adding a text never moves the others, so the pointers
// Names hold stay valid. Never freed (Names in static objects may outlive any destructor order).
// Looked up by std::string_view (no std::string made to find a text that is already there).
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

struct InternTable {
  std::shared_mutex mutex;
  std::unordered_set<std::string, TextHash, std::equal_to<>> texts;
};

InternTable& intern_table() {
  static auto* table = new InternTable();  // see above
  return *table;
}

}  // namespace

const std::string* Name::intern(std::string_view text) {
  InternTable& table = intern_table();
  {
    const std::shared_lock lock(table.mutex);
    if (const auto found = table.texts.find(text); found != table.texts.end()) {
      return &*found;
    }
  }
  const std::unique_lock lock(table.mutex);
  return &*table.texts.emplace(text).first;
}

const std::string* Name::empty_text() {
  static const std::string* const empty = intern("");
  return empty;
}

}  // namespace tpusim
