// Training data: byte-level and SentencePiece tokenization, determinism by step, bad input, and
// the token cache (reuse across max_target_length, the same batches with and without it, stale
// and corrupted caches).
#include "sim/train/dataset.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/yaml_text.h"
#include "model/config.h"
#include "sim/train/token_cache.h"

namespace tpusim {
namespace {

constexpr const char* kText = "/usr/share/common-licenses/GPL-3";  // on every Debian machine

Config text_config(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {"model_name=tiny-llama", "dataset_type=text",
                                        std::string("dataset_path=") + kText};
  if (std::none_of(extra.begin(), extra.end(),
                   [](const std::string& key) { return key.starts_with("max_target_length="); })) {
    overrides.emplace_back("max_target_length=32");
  }
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
  // A directory as the tokenizer was an internal error (exit 1) from the stream reading it.
  EXPECT_THROW(Dataset::from_config(text_config({"tokenizer_path=/tmp"})), UserError);
  EXPECT_THROW(Dataset::from_config(text_config({"tokenizer_path=/dev/null"})), UserError);
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

// A fresh directory under the test's temporary directory.
std::filesystem::path fresh_directory(const std::string& name) {
  const std::filesystem::path directory =
      std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  return directory;
}

// Every training batch of the first `steps` steps and the first eval batch are equal.
void expect_same_batches(const Dataset& a, const Dataset& b, int64_t steps) {
  ASSERT_EQ(a.train_windows(), b.train_windows());
  ASSERT_EQ(a.eval_windows(), b.eval_windows());
  for (int64_t step = 0; step < steps; ++step) {
    const Batch left = a.train_batch(step, 0, 4);
    const Batch right = b.train_batch(step, 0, 4);
    ASSERT_EQ(left.tokens, right.tokens) << "step " << step;
    ASSERT_EQ(left.targets, right.targets) << "step " << step;
  }
  EXPECT_EQ(a.eval_batch(0, 4).tokens, b.eval_batch(0, 4).tokens);
  // Bitwise, not within a tolerance: the sum runs in the same order.
  EXPECT_EQ(a.unigram_entropy(), b.unigram_entropy());
}

// The first run tokenizes and writes the cache; runs with another max_target_length or seed read
// it without tokenizing, and every batch (hence a resumed run, which asks for batches by step) is
// bitwise what the uncached dataset gives.
TEST(TokenCache, ReusedAcrossMaxTargetLengthWithTheSameBatches) {
  const std::filesystem::path cache = fresh_directory("tpusim_token_cache");
  const std::string cache_key = "dataset_cache_dir=" + cache.string();
  const Dataset first = Dataset::from_config(text_config({cache_key}));
  EXPECT_FALSE(first.from_cache());
  EXPECT_NE(first.note().find("tokenizing"), std::string::npos) << first.note();
  // The cache is complete once the background tokenizer is done.
  const std::string tokenized = first.wait_until_tokenized();
  EXPECT_NE(tokenized.find("tokenized"), std::string::npos) << tokenized;
  EXPECT_NE(tokenized.find("cached in"), std::string::npos) << tokenized;
  const Dataset second = Dataset::from_config(text_config({cache_key}));
  EXPECT_TRUE(second.from_cache()) << second.note();
  EXPECT_NE(second.note().find("read from the cache"), std::string::npos) << second.note();
  expect_same_batches(Dataset::from_config(text_config({})), second, 40);
  for (const char* other : {"max_target_length=64", "data_shuffle_seed=7"}) {
    const Dataset reused = Dataset::from_config(text_config({cache_key, other}));
    EXPECT_TRUE(reused.from_cache()) << other;
    expect_same_batches(Dataset::from_config(text_config({other})), reused, 40);
  }
  // base_output_directory alone puts the cache beneath it.
  const Dataset beneath =
      Dataset::from_config(text_config({"base_output_directory=" + cache.string() + "/runs"}));
  const std::string beneath_note = beneath.wait_until_tokenized();
  EXPECT_NE(beneath_note.find("runs/dataset_cache"), std::string::npos) << beneath_note;
  std::filesystem::remove_all(cache);
}

// A source over kTokenizePieceBytes makes several chunks; the tokens still are the file's bytes,
// also across a chunk boundary, with and without the cache.
TEST(TokenCache, SeveralChunksHoldTheWholeFile) {
  const std::filesystem::path directory = fresh_directory("tpusim_token_chunks");
  const std::string licence = read_text_file(kText);
  std::string text;
  while (static_cast<int64_t>(text.size()) < kTokenizePieceBytes + (1 << 20)) {
    text += licence;
  }
  const std::string path = (directory / "big.txt").string();
  std::ofstream(path) << text;
  const TokenSourceSpec spec = {.dataset_type = "text",
                                .path = path,
                                .tokenizer_path = "",
                                .cache_directory = (directory / "cache").string()};
  const TokenizedSource built = load_tokens(spec);
  built.tokens->wait_complete();
  const TokenizedSource mapped = load_tokens(spec);
  ASSERT_TRUE(mapped.from_cache);
  EXPECT_GE(mapped.tokens->chunks().size(), 2U);
  ASSERT_EQ(mapped.tokens->size(), static_cast<int64_t>(text.size()));
  for (int64_t index : {int64_t{0}, mapped.tokens->chunks()[0].tokens - 1,
                        mapped.tokens->chunks()[0].tokens, mapped.tokens->size() - 1}) {
    EXPECT_EQ(mapped.tokens->at(index),
              static_cast<unsigned char>(text[static_cast<size_t>(index)]));
    EXPECT_EQ(built.tokens->at(index), mapped.tokens->at(index));
  }
  std::filesystem::remove_all(directory);
}

// The order as dataset.h defines it, checked on 2.5 MiB of pseudo-random letters (every window
// different; 2^20 tokens per era, windows of 32 + 1 tokens: 32768 windows per era, of which the
// last 3276 are held out): held-out window k of era e starts at token (32768 e + 29492 + k) * 32;
// the first 29492 training positions are distinct windows of era 0's training part and position
// 29492 is in era 1's.
TEST(Dataset, ErasHoldOutTheirLastTenthAndShuffleWithinThemselves) {
  const std::filesystem::path directory = fresh_directory("tpusim_eras");
  std::string text(5U << 19, ' ');
  uint64_t state = 1;
  for (char& letter : text) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // Knuth's MMIX LCG
    letter = static_cast<char>('A' + (state >> 59));                  // 32 ASCII letters and signs
  }
  const std::string path = (directory / "letters.txt").string();
  std::ofstream(path) << text;
  const Dataset data = Dataset::from_config(
      Config::load("", {"model_name=tiny-llama", "max_target_length=32", "dataset_type=text",
                        "dataset_path=" + path, "base_output_directory=", "dataset_cache_dir="}));
  constexpr int64_t kEra = 32768;
  constexpr int64_t kTrain = 29492;
  std::map<std::vector<int32_t>, int64_t> window_of;  // a window's 32 tokens -> its number
  for (int64_t window = 0; (window + 1) * 32 < static_cast<int64_t>(text.size()); ++window) {
    window_of[std::vector<int32_t>(text.begin() + window * 32, text.begin() + window * 32 + 32)] =
        window;
  }
  auto window_at = [&](const Batch& batch) {
    const auto found = window_of.find(batch.tokens);
    return found == window_of.end() ? int64_t{-1} : found->second;
  };
  EXPECT_EQ(window_at(data.eval_batch(0, 1)), kTrain);
  EXPECT_EQ(window_at(data.eval_batch(3275, 1)), kTrain + 3275);
  EXPECT_EQ(window_at(data.eval_batch(3276, 1)), kEra + kTrain);
  std::set<int64_t> seen;
  for (int64_t position = 0; position < kTrain; position += 7) {
    const int64_t window = window_at(data.train_batch(position, 0, 1));
    EXPECT_TRUE(window >= 0 && window < kTrain) << position << " -> " << window;
    EXPECT_TRUE(seen.insert(window).second) << position << " repeats window " << window;
  }
  const int64_t next_era = window_at(data.train_batch(kTrain, 0, 1));
  EXPECT_TRUE(next_era >= kEra && next_era < kEra + kTrain) << next_era;
  // 2.5 MiB: two full eras and a half one, each holding out a tenth.
  const int64_t windows = (static_cast<int64_t>(text.size()) - 1) / 32;
  EXPECT_EQ(data.train_windows() + data.eval_windows(), windows);
  EXPECT_EQ(data.eval_windows(), 2 * 3276 + (windows - 2 * kEra) / 10);
  std::filesystem::remove_all(directory);
}

// A growing TokenArray is readable while its producer still works: wait_for returns once the
// first chunk is published, wait_complete once the producer returns, with its note.
TEST(TokenCache, GrowingArrayIsReadBeforeItIsComplete) {
  std::mutex gate;
  gate.lock();
  auto array = TokenArray::growing(2, [&](TokenArray& out, const std::atomic<bool>&) {
    out.publish({7, 8, 9});
    const std::lock_guard wait(gate);  // held by the test until it has read the first chunk
    out.publish({10});
    return std::string("done");
  });
  EXPECT_EQ(array->wait_for(2), 3);
  EXPECT_FALSE(array->complete());
  EXPECT_EQ(array->at(2), 9);
  gate.unlock();
  EXPECT_EQ(array->wait_complete(), "done");
  EXPECT_EQ(array->size(), 4);
  EXPECT_EQ(array->at(3), 10);
  // A producer's error reaches the reader.
  auto failing = TokenArray::growing(1, [](TokenArray&, const std::atomic<bool>&) -> std::string {
    throw UserError("tokenizer_path: broken", "tokenizer_path");
  });
  EXPECT_THROW(failing->wait_for(1), UserError);
}

TEST(TokenCache, SentencePieceTokensAreCachedToo) {
  const std::filesystem::path directory = fresh_directory("tpusim_spm_cache");
  const std::string command = std::string("spm_train --input=") + kText +
                              " --model_prefix=" + directory.string() +
                              "/text --vocab_size=200 --model_type=bpe --character_coverage=1.0 "
                              "> /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "spm_train (Debian package sentencepiece)";
  const std::vector<std::string> keys = {"tokenizer_path=" + directory.string() + "/text.model",
                                         "dataset_cache_dir=" + directory.string() + "/cache"};
  const Dataset built = Dataset::from_config(text_config(keys));
  EXPECT_FALSE(built.from_cache());
  built.wait_until_tokenized();
  const Dataset cached = Dataset::from_config(text_config(keys));
  EXPECT_TRUE(cached.from_cache());
  expect_same_batches(Dataset::from_config(text_config({keys[0]})), cached, 20);
  std::filesystem::remove_all(directory);
}

// A changed source makes the cache stale: rebuilt, and the note says so. A chunk changed on disk
// or cut short is a corrupted cache: exit 2 naming the file.
TEST(TokenCache, StaleCacheIsRebuiltCorruptedOneNamed) {
  const std::filesystem::path directory = fresh_directory("tpusim_token_corrupt");
  const std::string path = (directory / "corpus.txt").string();
  std::filesystem::copy_file(kText, path);
  // Each load waits for its tokenizer, so the next one finds the cache it wrote.
  auto load = [&] {
    Dataset data = Dataset::from_config(Config::load(
        "", {"model_name=tiny-llama", "max_target_length=32", "dataset_type=text",
             "dataset_path=" + path, "dataset_cache_dir=" + (directory / "cache").string()}));
    data.wait_until_tokenized();
    return data;
  };
  load();
  std::ofstream(path, std::ios::app) << "one more line\n";
  const Dataset rebuilt = load();
  EXPECT_FALSE(rebuilt.from_cache());
  EXPECT_NE(rebuilt.note().find("rebuilt"), std::string::npos) << rebuilt.note();
  ASSERT_TRUE(load().from_cache());
  std::filesystem::path chunk;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(directory / "cache")) {
    if (entry.path().filename().string().starts_with("chunk-")) {
      chunk = entry.path();
    }
  }
  ASSERT_FALSE(chunk.empty());
  auto expect_named = [&](const std::string& what) {
    try {
      load();
      ADD_FAILURE() << "a " << what << " cache was read";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find(chunk.filename().string()), std::string::npos)
          << error.what();
      EXPECT_NE(std::string(error.what()).find(what), std::string::npos) << error.what();
      EXPECT_EQ(error.key(), "dataset_cache_dir");
    }
  };
  {
    std::fstream stream(chunk, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(100);
    stream.put('\x7f');
  }
  expect_named("content hash");
  std::filesystem::resize_file(chunk, std::filesystem::file_size(chunk) / 2);
  expect_named("truncated");
  std::filesystem::remove_all(directory);
}

// A hand-edited or damaged index.json is exit 2 too: fields of the wrong JSON type, a vocabulary
// that does not fit the token width, and tokens past the vocabulary (a 2-byte cache read as
// 4-byte tokens, which overran the Dataset's token counts). Found by fuzz/dataset_fuzz.cpp.
TEST(TokenCache, MalformedIndexIsUserError) {
  const std::filesystem::path directory = fresh_directory("tpusim_token_index");
  const std::string path = (directory / "corpus.txt").string();
  {
    std::ofstream out(path);
    for (int line = 0; line < 50; ++line) {
      out << "the quick brown fox jumps over the lazy dog\n";  // 44 bytes: an even total
    }
  }
  // Each load waits for its tokenizer, so the next one finds the cache it wrote.
  auto load = [&] {
    Dataset data = Dataset::from_config(Config::load(
        "", {"model_name=tiny-llama", "max_target_length=32", "dataset_type=text",
             "dataset_path=" + path, "dataset_cache_dir=" + (directory / "cache").string()}));
    data.wait_until_tokenized();
    return data;
  };
  load();
  std::filesystem::path index_path;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(directory / "cache")) {
    if (entry.path().filename() == "index.json") {
      index_path = entry.path();
    }
  }
  ASSERT_FALSE(index_path.empty());
  const nlohmann::json index = nlohmann::json::parse(read_text_file(index_path.string()));
  auto expect_refused = [&](const nlohmann::json& edited, const std::string& what) {
    std::ofstream(index_path, std::ios::trunc) << edited.dump();
    try {
      load();
      ADD_FAILURE() << "index " << edited.dump() << " was read";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find(what), std::string::npos) << error.what();
    }
  };
  nlohmann::json edited = index;
  edited["chunks"][0] = nullptr;
  expect_refused(edited, "malformed index");
  edited = index;
  edited["dataset_type"] = 5;
  expect_refused(edited, "malformed index");
  // Whole numbers that are text, fractional or past int64 (2.8e51 converted to int64 was
  // undefined behavior; fuzz/corpus/dataset/index-pieces-float-overflow) are refused by name.
  for (const nlohmann::json& pieces :
       {nlohmann::json("many"), nlohmann::json(int64_t{1} << 40), nlohmann::json(2.8e51),
        nlohmann::json(std::numeric_limits<uint64_t>::max()), nlohmann::json(256.0)}) {
    edited = index;
    edited["pieces"] = pieces;
    expect_refused(edited, "pieces must be from 1 to 65536");
  }
  edited = index;
  edited["token_bytes"] = 2.0;
  expect_refused(edited, "token_bytes must be 2 or 4");
  edited = index;
  edited["chunks"][0]["tokens"] = 1e30;
  expect_refused(edited, "bytes, the index records");
  edited = index;
  edited["token_bytes"] = 4;
  edited["chunks"][0]["tokens"] = index["chunks"][0]["tokens"].get<int64_t>() / 2;
  expect_refused(edited, "outside the tokenizer's 256 pieces");
  std::filesystem::remove_all(directory);
}

TEST(TokenCache, CacheDirectoryThatIsAFileIsUserError) {
  try {
    Dataset::from_config(text_config({std::string("dataset_cache_dir=") + kText}));
    ADD_FAILURE() << "a file was taken as the cache directory";
  } catch (const UserError& error) {
    EXPECT_EQ(error.key(), "dataset_cache_dir") << error.what();
  }
}

}  // namespace
}  // namespace tpusim
