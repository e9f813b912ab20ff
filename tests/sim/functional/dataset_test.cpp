// Training data: byte-level and SentencePiece tokenization, determinism by step, bad input.
#include "sim/train/dataset.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {
namespace {

constexpr const char* kText = "/usr/share/common-licenses/GPL-3";  // on every Debian machine

Config text_config(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {"model_name=tiny-llama", "max_target_length=32",
                                        "dataset_type=text", std::string("dataset_path=") + kText};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return Config::load("", overrides);
}

TEST(Dataset, ByteTokensAreTheFileAndTargetsTheNextByte) {
  const Dataset data = Dataset::from_config(text_config({}));
  const Batch batch = data.train_batch(0, 0, 4);
  ASSERT_EQ(batch.tokens.size(), 4u * 32);
  for (size_t index = 0; index + 1 < 32; ++index) {
    EXPECT_EQ(batch.targets[index], batch.tokens[index + 1]);
  }
  EXPECT_TRUE(std::all_of(batch.tokens.begin(), batch.tokens.end(),
                          [](int32_t token) { return token >= 0 && token < 256; }));
  EXPECT_GT(data.unigram_entropy(), 2.0);
  // Deterministic by step: the same step gives the same batch, another step another one.
  EXPECT_EQ(data.train_batch(5, 0, 4).tokens,
            Dataset::from_config(text_config({})).train_batch(5, 0, 4).tokens);
  EXPECT_NE(data.train_batch(5, 0, 4).tokens, data.train_batch(6, 0, 4).tokens);
}

TEST(Dataset, SentencePieceModel) {
  const std::string directory = ::testing::TempDir() + "tpusim_spm_" + std::to_string(::getpid());
  std::filesystem::create_directories(directory);
  const std::string command =
      std::string("spm_train --input=") + kText + " --model_prefix=" + directory +
      "/text --vocab_size=200 --model_type=bpe " + "--character_coverage=1.0 > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "spm_train (Debian package sentencepiece)";
  const std::string model = directory + "/text.model";
  const Dataset data = Dataset::from_config(text_config({"tokenizer_path=" + model}));
  const Batch batch = data.train_batch(0, 0, 4);
  EXPECT_TRUE(std::all_of(batch.tokens.begin(), batch.tokens.end(),
                          [](int32_t token) { return token >= 0 && token < 200; }));
  // Pieces are longer than bytes: the same text makes fewer tokens.
  EXPECT_LT(data.train_windows(), Dataset::from_config(text_config({})).train_windows());
  EXPECT_THROW(Dataset::from_config(text_config(
                   {"tokenizer_path=" + model, "vocab_size=100", "override_model_config=true"})),
               UserError);
  std::filesystem::remove_all(directory);
}

TEST(Dataset, BadInputIsUserError) {
  EXPECT_THROW(Dataset::from_config(text_config({"tokenizer_path=/nonexistent/tokenizer.model"})),
               UserError);
  EXPECT_THROW(Dataset::from_config(Config::load("", {"model_name=tiny-llama", "dataset_type=text",
                                                      "dataset_path=/nonexistent.txt"})),
               UserError);
  EXPECT_THROW(Dataset::from_config(Config::load("", {"model_name=tiny-llama", "dataset_type=hf"})),
               UserError);
}

// dataset_type decides how a file is read, not its name: a .txt read as jsonl parses its records
// (and names the line that is not one); a .jsonl read as text is taken byte for byte.
TEST(Dataset, DatasetTypeDecidesNotTheSuffix) {
  const std::filesystem::path directory = std::filesystem::path(::testing::TempDir()) /
                                          ("tpusim_dataset_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  std::string records;
  for (int index = 0; index < 40; ++index) {
    records += R"({"text": "record )" + std::to_string(index) +
               R"( of a json lines file"})"
               "\n";
  }
  const std::filesystem::path as_txt = directory / "records.txt";
  const std::filesystem::path as_jsonl = directory / "records.jsonl";
  for (const auto& path : {as_txt, as_jsonl}) {
    std::ofstream(path) << records;
  }
  auto load = [](const char* type, const std::filesystem::path& path) {
    return Dataset::from_config(
        Config::load("", {"model_name=tiny-llama", "max_target_length=32",
                          std::string("dataset_type=") + type, "dataset_path=" + path.string()}));
  };
  const Batch parsed = load("jsonl", as_txt).train_batch(0, 0, 1);
  const std::string parsed_text(parsed.tokens.begin(), parsed.tokens.end());
  EXPECT_EQ(parsed_text.find('{'), std::string::npos) << "records parsed: " << parsed_text;
  const Batch raw = load("text", as_jsonl).train_batch(0, 0, 1);
  // Any 32 bytes of the raw records hold a quote: read as text, nothing was parsed away.
  EXPECT_NE(std::string(raw.tokens.begin(), raw.tokens.end()).find('"'), std::string::npos);
  std::ofstream(as_txt, std::ios::app) << "not json\n";
  try {
    load("jsonl", as_txt);
    ADD_FAILURE() << "a malformed record was accepted";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("records.txt:41"), std::string::npos) << error.what();
  }
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace tpusim
