// tests/model/ir/op_kind_traits_test.cpp: the op-kind traits table (model/ir/op_kind_traits.h)
// and the rule that keeps per-kind code exhaustive: no `switch` over op kinds has a `default:`
// arm anywhere in the sources, so -Wswitch names every place a new kind must be handled.
#include "model/ir/op_kind_traits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/run_command.h"

namespace tpusim {
namespace {

TEST(OpKindTraits, EachRowsNameRoundTrips) {
  std::set<std::string> names;
  for (size_t index = 0; index < kOpKindCount; ++index) {
    const auto kind = static_cast<OpKind>(index);
    const OpKindTraits& row = op_kind_traits(kind);
    EXPECT_EQ(row.kind, kind) << "row " << index << " is out of the enum's order";
    EXPECT_STREQ(op_kind_name(kind), row.name);
    EXPECT_EQ(op_kind_from_name(row.name), kind) << row.name;
    EXPECT_TRUE(names.insert(row.name).second) << row.name << " names two kinds";
  }
  EXPECT_STREQ(op_kind_name(static_cast<OpKind>(kOpKindCount)), "?");
  EXPECT_THROW(op_kind_traits(static_cast<OpKind>(kOpKindCount)), std::out_of_range);
  EXPECT_EQ(op_kind_from_name("no_such_kind"), std::nullopt);
}

TEST(OpKindTraits, FactsAgreeWithEachOther) {
  for (size_t index = 0; index < kOpKindCount; ++index) {
    const auto kind = static_cast<OpKind>(index);
    const OpKindTraits& row = op_kind_traits(kind);
    const bool collective = row.collective != Collective::kNone;
    EXPECT_EQ(is_collective(kind), collective) << row.name;
    // The functional engine runs every op: collectives on the Communicator, the rest as kernels.
    EXPECT_NE(row.has_kernel, collective) << row.name;
    EXPECT_EQ(is_compute(kind), !collective && !row.host_transfer) << row.name;
    EXPECT_FALSE(collective && row.host_transfer) << row.name;
    EXPECT_EQ(may_fuse(kind), row.fuses_into_producer) << row.name;
    // A fused op runs in its producer's kernel: it is compute work, element by element.
    EXPECT_TRUE(!row.fuses_into_producer || (is_compute(kind) && row.writes_in_place)) << row.name;
  }
  EXPECT_TRUE(is_reducing_collective(OpKind::kAllReduce));
  EXPECT_TRUE(is_reducing_collective(OpKind::kReduceScatter));
  EXPECT_FALSE(is_reducing_collective(OpKind::kAllGather));
  EXPECT_FALSE(is_reducing_collective(OpKind::kElementwise));
}

// `text` with comments and string and character literals blanked (line breaks kept), so that
// only code is searched.
std::string code_only(const std::string& text) {
  std::string code = text;
  const size_t size = code.size();
  auto blank = [&code](size_t from, size_t to) {
    for (size_t at = from; at < to && at < code.size(); ++at) {
      if (code[at] != '\n') {
        code[at] = ' ';
      }
    }
  };
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  size_t at = 0;
  while (at < size) {
    const char c = text[at];
    const char next = at + 1 < size ? text[at + 1] : '\0';
    size_t end = at + 1;
    if (c == '/' && next == '/') {
      end = text.find('\n', at);
    } else if (c == '/' && next == '*') {
      end = text.find("*/", at + 2);
      end = end == std::string::npos ? end : end + 2;
    } else if (c == 'R' && next == '"' && (at == 0 || !word_char(text[at - 1]))) {
      const size_t open = text.find('(', at + 2);
      const std::string close = ")" + text.substr(at + 2, open - at - 2) + "\"";
      end = text.find(close, open);
      end = end == std::string::npos ? end : end + close.size();
    } else if (c == '"' || (c == '\'' && (at == 0 || !std::isxdigit(text[at - 1])))) {
      end = at + 1;
      while (end < size && text[end] != c) {
        end += text[end] == '\\' ? 2 : 1;
      }
      end = std::min(end + 1, size);
    } else {
      ++at;
      continue;
    }
    if (end == std::string::npos) {
      end = size;
    }
    blank(at, end);
    at = end;
  }
  return code;
}

// The index one past the bracket that closes the one at `open` ('(' or '{'), or npos.
size_t past_closing(const std::string& code, size_t open) {
  const char opening = code[open];
  const char closing = opening == '(' ? ')' : '}';
  int depth = 0;
  for (size_t at = open; at < code.size(); ++at) {
    depth += code[at] == opening ? 1 : (code[at] == closing ? -1 : 0);
    if (depth == 0) {
      return at + 1;
    }
  }
  return std::string::npos;
}

bool word_at(const std::string& code, size_t at, const std::string& word) {
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  return code.compare(at, word.size(), word) == 0 && (at == 0 || !word_char(code[at - 1])) &&
         (at + word.size() >= code.size() || !word_char(code[at + word.size()]));
}

// The lines (1-based) of each `switch` over op kinds (a case label of its own names OpKind:: or
// Collective::) that has a `default:` label of its own (labels of nested switches and blocks
// are not its own).
std::vector<int> op_kind_switches_with_default(const std::string& text) {
  const std::string code = code_only(text);
  std::vector<int> lines;
  for (size_t at = code.find("switch"); at != std::string::npos; at = code.find("switch", at + 1)) {
    if (!word_at(code, at, "switch")) {
      continue;
    }
    const size_t condition = code.find_first_not_of(" \t\n", at + 6);
    if (condition == std::string::npos || code[condition] != '(') {
      continue;
    }
    const size_t body_open = code.find_first_not_of(" \t\n", past_closing(code, condition));
    if (body_open == std::string::npos || code[body_open] != '{') {
      continue;
    }
    const size_t body_end = past_closing(code, body_open);
    bool over_op_kinds = false;
    bool has_default = false;
    int depth = 0;
    for (size_t inner = body_open + 1; inner + 1 < body_end; ++inner) {
      depth += code[inner] == '{' ? 1 : (code[inner] == '}' ? -1 : 0);
      if (depth != 0) {
        continue;
      }
      if (word_at(code, inner, "case")) {
        size_t label_end = inner + 4;  // the label ends at a ':' that is not half of a '::'
        while (label_end < body_end && (code[label_end] != ':' || code[label_end + 1] == ':')) {
          label_end += code.compare(label_end, 2, "::") == 0 ? 2 : 1;
        }
        const std::string label = code.substr(inner, label_end - inner);
        over_op_kinds = over_op_kinds || label.find("OpKind::") != std::string::npos ||
                        label.find("Collective::") != std::string::npos;
      } else if (word_at(code, inner, "default")) {
        const size_t after = code.find_first_not_of(" \t\n", inner + 7);
        has_default = has_default || (after != std::string::npos && code[after] == ':');
      }
    }
    if (over_op_kinds && has_default) {
      lines.push_back(1 + static_cast<int>(std::count(code.begin(), code.begin() + at, '\n')));
    }
  }
  return lines;
}

TEST(OpKindSwitches, TheCheckFindsADefaultArmAndOnlyThere) {
  const std::string flagged =
      "int f(OpKind k) {\n  switch (k) {\n    case OpKind::kEinsum:\n      return 1;\n"
      "    default:  // a new kind lands here silently\n      return 0;\n  }\n}\n";
  EXPECT_EQ(op_kind_switches_with_default(flagged), std::vector<int>{2});
  const std::string fine =
      "int f(OpKind k, Dtype d) {\n"
      "  switch (k) {\n    case OpKind::kEinsum:\n      switch (d) {\n        default:\n"
      "          return 2;\n      }\n    case OpKind::kRope: { return 1; }\n  }\n"
      "  // switch (k) { case OpKind::kRope: default: }\n"
      "  const char* text = \"switch (k) { case OpKind::kRope: default: }\";\n"
      "  switch (d) {\n    case Dtype::kBf16:\n      break;\n    default:\n      break;\n  }\n"
      "  return 0;\n}\n";
  EXPECT_TRUE(op_kind_switches_with_default(fine).empty());
}

// A `default:` in a switch over op kinds would give a new kind some other kind's cost, layout,
// buffer or gradient without a word: list the kinds (or switch over a traits fact) instead.
TEST(OpKindSwitches, NoSwitchOverOpKindsHasADefaultArm) {
  const std::filesystem::path root = testing::source_dir();
  int files = 0;
  for (const char* folder : {"common", "hw", "model", "sharding", "sim"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / folder)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || (extension != ".cpp" && extension != ".h")) {
        continue;
      }
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      ++files;
      for (const int line : op_kind_switches_with_default(text.str())) {
        ADD_FAILURE() << entry.path().lexically_relative(root).string() << ":" << line
                      << ": a switch over op kinds has a default: arm; list each kind instead "
                         "(docs/design.md, \"Adding an op kind\")";
      }
    }
  }
  EXPECT_GT(files, 100) << "the sources were not found under " << root;
}

}  // namespace
}  // namespace tpusim
