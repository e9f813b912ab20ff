// model/ir/name.h: an interned name: a dim's semantic or logical axis name, a mesh axis it is split
// over.
//
// Programs copy their tensors' dims many times (the partitioner makes every local tensor of a
// per-device program from a global one, for every mesh the explorer tries), so a dim's names are
// interned: all Names spelling the same text point at one shared copy of it, and copying two Names
// or comparing them copies or compares a pointer. Reading one gives the text back (str(), or
// implicitly as a const std::string& or std::string_view). Making a Name from text takes a lock
// and a hash lookup; the texts live as long as the process (a model has a few dozen names).
// Names order by their text, as the strings they replace did.
//
// Example:
//   Name embed = "embed";
//   embed == Name("embed");     // true: one pointer compared
//   embed == "embed";           // true: the texts compared
//   std::string text = embed;   // "embed"
//   "@" + embed;                // std::string "@embed"
#pragma once

#include <compare>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

namespace tpusim {

class Name {
 public:
  Name() : text_(empty_text()) {}
  // Implicit: a Name stands wherever the dim's name was a string.
  Name(const char* text) : Name(std::string_view(text)) {}
  Name(const std::string& text) : Name(std::string_view(text)) {}
  Name(std::string_view text) : text_(intern(text)) {}

  const std::string& str() const { return *text_; }
  operator const std::string&() const { return *text_; }
  operator std::string_view() const { return *text_; }
  const char* c_str() const { return text_->c_str(); }
  size_t size() const { return text_->size(); }
  bool empty() const { return text_->empty(); }

  friend bool operator==(const Name& a, const Name& b) { return a.text_ == b.text_; }
  friend bool operator==(const Name& a, std::string_view b) { return *a.text_ == b; }
  friend bool operator==(const Name& a, const std::string& b) { return *a.text_ == b; }
  friend bool operator==(const Name& a, const char* b) { return *a.text_ == b; }
  friend std::strong_ordering operator<=>(const Name& a, const Name& b) {
    return a.text_ == b.text_ ? std::strong_ordering::equal : *a.text_ <=> *b.text_;
  }

  friend std::string operator+(const std::string& a, const Name& b) { return a + *b.text_; }
  friend std::string operator+(const Name& a, const std::string& b) { return *a.text_ + b; }
  friend std::string operator+(const char* a, const Name& b) { return a + *b.text_; }
  friend std::string operator+(const Name& a, const char* b) { return *a.text_ + b; }
  friend std::ostream& operator<<(std::ostream& out, const Name& name) {
    return out << *name.text_;
  }

 private:
  // The one stored copy of `text` (added on first use).
  static const std::string* intern(std::string_view text);
  static const std::string* empty_text();

  const std::string* text_;
};

}  // namespace tpusim
