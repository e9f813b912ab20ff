// tests/model/decoder_family_test.cpp: every DecoderBlock has its traits row, and no source file
// but the table names a family in a string literal (the family is decided by the enum and its
// row, not by comparing names; docs/design.md "Adding a decoder family").
#include "model/decoder_family.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "model/config.h"
#include "model/config_rules.h"
#include "model/model_dims.h"
#include "support/run_command.h"

namespace tpusim {
namespace {

// A new enum value without its row does not build (decoder_family.cpp also checks at compile time
// that each row sits at its enum's index).
static_assert(std::tuple_size_v<std::remove_cvref_t<decltype(decoder_families())>> ==
                  kDecoderBlockCount,
              "one traits row per DecoderBlock");

TEST(DecoderFamily, EveryBlockHasItsRowAndItsNameParsesBack) {
  std::set<std::string> names;
  for (size_t index = 0; index < kDecoderBlockCount; ++index) {
    const auto block = static_cast<DecoderBlock>(index);
    const DecoderFamily& family = decoder_family(block);
    EXPECT_EQ(family.block, block) << index;
    ASSERT_NE(std::string(family.name), "") << index;
    EXPECT_TRUE(names.insert(family.name).second) << family.name << " is in two rows";
    EXPECT_EQ(parse_decoder_block(family.name), block) << family.name;
    EXPECT_GE(family.layers_per_decoder_layer, 1) << family.name;
  }
  EXPECT_EQ(decoder_block_names().size(), kDecoderBlockCount);
}

TEST(DecoderFamily, ConfigRulesAllowExactlyTheFamilies) {
  EXPECT_EQ(allowed_values("decoder_block"), decoder_block_names());
  try {
    parse_decoder_block("gemma5");
    FAIL() << "gemma5 parsed";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("decoder_block: 'gemma5' is not one of llama2, "),
              std::string::npos)
        << error.what();
  }
}

TEST(DecoderFamily, EveryPresetsBlockParses) {
  const std::filesystem::path models =
      std::filesystem::path(testing::source_dir()) / "configs" / "models";
  int presets = 0;
  for (const auto& entry : std::filesystem::directory_iterator(models)) {
    if (entry.path().extension() != ".yml") {
      continue;
    }
    const std::string name = entry.path().stem().string();
    const ModelDims dims = ModelDims::from_config(Config::load("", {"model_name=" + name}));
    EXPECT_EQ(decoder_family(dims.decoder_block).block, dims.decoder_block) << name;
    ++presets;
  }
  EXPECT_GT(presets, 20);
}

// The rows carry both patterns; they differ where MaxText's count differs from the model.
TEST(DecoderFamily, ProgramAndMaxTextPatternsDifferWhereMaxTextCountsOtherwise) {
  const DecoderFamily& olmo3 = decoder_family(DecoderBlock::kOlmo3);
  EXPECT_EQ(olmo3.program_attention.layout, AttentionLayout::kGlobalEveryN);
  EXPECT_EQ(olmo3.maxtext_attention.layout, AttentionLayout::kUniform);
  const DecoderFamily& gemma3 = decoder_family(DecoderBlock::kGemma3);
  EXPECT_EQ(gemma3.program_attention.layout, gemma3.maxtext_attention.layout);
  EXPECT_EQ(gemma3.program_attention.period_for(1), 6);
  EXPECT_EQ(decoder_family(DecoderBlock::kGemma4Small).maxtext_attention.period_for(1), 5);
  EXPECT_EQ(decoder_family(DecoderBlock::kGemma2).layers_per_decoder_layer, 2);
  // gemma2 and gpt_oss: the cycle interval, at least 2.
  EXPECT_EQ(decoder_family(DecoderBlock::kGptOss).program_attention.period_for(1), 2);
  EXPECT_EQ(decoder_family(DecoderBlock::kGptOss).program_attention.period_for(3), 3);
}

TEST(DecoderFamily, HuggingFaceSchemes) {
  EXPECT_EQ(hf_mapped_families(),
            "llama2, mistral: Llama/Mistral names; qwen3: Qwen3 names; gpt3: GPT-2 names");
  EXPECT_STREQ(hf_model_type(decoder_family(DecoderBlock::kGpt3).hf_names), "gpt2");
  EXPECT_STREQ(hf_architecture(decoder_family(DecoderBlock::kQwen3).hf_names), "Qwen3ForCausalLM");
  EXPECT_THROW(hf_model_type(HfNameScheme::kNone), std::logic_error);
}

struct Literal {
  std::string text;
  int line = 0;
};

// The string literals of a C++ source (comments and character literals skipped, raw strings
// read to their delimiter).
std::vector<Literal> string_literals(const std::string& source) {
  std::vector<Literal> literals;
  int line = 1;
  size_t at = 0;
  const auto advance_to = [&](size_t end) {
    for (; at < end && at < source.size(); ++at) {
      line += source[at] == '\n' ? 1 : 0;
    }
  };
  while (at < source.size()) {
    const char c = source[at];
    const char previous = at > 0 ? source[at - 1] : ' ';
    if (source.compare(at, 2, "//") == 0) {
      advance_to(source.find('\n', at));
    } else if (source.compare(at, 2, "/*") == 0) {
      const size_t end = source.find("*/", at + 2);
      advance_to(end == std::string::npos ? source.size() : end + 2);
    } else if (c == 'R' && at + 1 < source.size() && source[at + 1] == '"' &&
               !std::isalnum(static_cast<unsigned char>(previous)) && previous != '_') {
      const size_t open = source.find('(', at + 2);
      const std::string close = ")" + source.substr(at + 2, open - at - 2) + "\"";
      const size_t end = source.find(close, open);
      const int start_line = line;
      const size_t stop = end == std::string::npos ? source.size() : end + close.size();
      literals.push_back({source.substr(open + 1, end - open - 1), start_line});
      advance_to(stop);
    } else if (c == '"') {
      size_t end = at + 1;
      while (end < source.size() && source[end] != '"' && source[end] != '\n') {
        end += source[end] == '\\' ? 2 : 1;
      }
      literals.push_back({source.substr(at + 1, end - at - 1), line});
      advance_to(end + 1);
    } else if (c == '\'' && !std::isalnum(static_cast<unsigned char>(previous))) {
      size_t end = at + 1;
      while (end < source.size() && source[end] != '\'' && source[end] != '\n') {
        end += source[end] == '\\' ? 2 : 1;
      }
      advance_to(end + 1);
    } else {
      advance_to(at + 1);  // a digit separator (1'000) is skipped here too
    }
  }
  return literals;
}

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

// `text` names `family` as a word of its own ("gemma3", "decoder_block gpt_oss", "llama4's"), not
// inside a longer name (a model such as "gemma3-4b", a key such as "gemma2_window").
bool names_family(const std::string& text, const std::string& family) {
  for (size_t at = text.find(family); at != std::string::npos; at = text.find(family, at + 1)) {
    const bool starts = at == 0 || !is_name_char(text[at - 1]);
    const size_t end = at + family.size();
    const bool ends = end == text.size() || !is_name_char(text[end]);
    if (starts && ends) {
      return true;
    }
  }
  return false;
}

TEST(DecoderFamily, ScannerFindsNamesInLiteralsOnly) {
  const std::vector<Literal> literals = string_literals(
      "// \"llama2\" in a comment\nx = \"gemma3\"; c = '\"'; n = 1'000;\n"
      "r = R\"x(qwen3_next \" )x\"; /* \"olmo3\" */ s = \"no\\\"pe\";\n");
  ASSERT_EQ(literals.size(), 3u);
  EXPECT_EQ(literals[0].text, "gemma3");
  EXPECT_EQ(literals[0].line, 2);
  EXPECT_EQ(literals[1].text, "qwen3_next \" ");
  EXPECT_EQ(literals[1].line, 3);
  EXPECT_TRUE(names_family("for decoder_block gpt_oss", "gpt_oss"));
  EXPECT_TRUE(names_family("llama4's qk-norm", "llama4"));
  EXPECT_FALSE(names_family("gemma3-4b", "gemma3"));
  EXPECT_FALSE(names_family("qwen3_next", "qwen3"));
  EXPECT_FALSE(names_family("a simpler one", "simple"));
}

// Done-when of issue 36: no string literal naming a decoder family outside the traits table
// (which is also where the name is parsed to the enum).
TEST(DecoderFamily, NoFamilyNameInALiteralOutsideTheTable) {
  const std::filesystem::path root(testing::source_dir());
  const std::set<std::string> allowed = {"model/decoder_family.cpp"};
  const std::vector<std::string> families = decoder_block_names();
  int files = 0;
  int allowed_hits = 0;
  for (const char* folder : {"common", "hw", "model", "sharding", "sim"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / folder)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || (extension != ".h" && extension != ".cpp")) {
        continue;
      }
      std::ifstream file(entry.path());
      std::stringstream text;
      text << file.rdbuf();
      const std::string relative = entry.path().lexically_relative(root).generic_string();
      ++files;
      for (const Literal& literal : string_literals(text.str())) {
        for (const std::string& family : families) {
          if (!names_family(literal.text, family)) {
            continue;
          }
          if (allowed.contains(relative)) {
            ++allowed_hits;
          } else {
            ADD_FAILURE() << relative << ":" << literal.line << ": \"" << literal.text
                          << "\" names decoder family " << family
                          << "; decide by DecoderBlock and its row in model/decoder_family.cpp";
          }
        }
      }
    }
  }
  EXPECT_GT(files, 100);
  // The table itself names every family (the scan sees what it should).
  EXPECT_GE(allowed_hits, static_cast<int>(kDecoderBlockCount));
}

}  // namespace
}  // namespace tpusim
