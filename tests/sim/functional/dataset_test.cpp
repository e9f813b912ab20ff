// Training data: byte-level and SentencePiece tokenization, determinism by step, bad input.
#include "sim/train/dataset.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

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

}  // namespace
}  // namespace tpusim
