#include "sim/train/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/counter_hash.h"
#include "common/error.h"
#include "model/config.h"
#include "sim/train/token_cache.h"

namespace tpusim {
namespace {

constexpr int64_t kByteVocabulary = 256;
constexpr double kEvalFraction = 0.1;

}  // namespace

Dataset Dataset::from_config(const Config& config) {
  Dataset data;
  data.seed_ = static_cast<uint64_t>(config.get_int("data_shuffle_seed"));
  data.length_ = config.get_int("max_target_length");
  data.vocab_ = config.get_int("vocab_size");
  data.accumulation_ = config.get_int("gradient_accumulation_steps");
  const std::string type = config.get_string("dataset_type");
  const std::string path = config.get_string("dataset_path");
  const std::string tokenizer = config.get_string("tokenizer_path");
  if (type == "synthetic") {
    return data;
  }
  if (type != "text" && type != "jsonl") {
    throw UserError("dataset_type: '" + type +
                    "' is not supported by tpusim train (synthetic, "
                    "text or jsonl with dataset_path)");
  }
  if (path.empty()) {
    throw UserError("dataset_path: dataset_type=" + type + " needs a file");
  }
  data.synthetic_ = false;
  // The cache: dataset_cache_dir, else under base_output_directory, else none.
  std::string cache = config.get_string("dataset_cache_dir");
  if (cache.empty() && !config.get_string("base_output_directory").empty()) {
    cache = config.get_string("base_output_directory") + "/dataset_cache";
  }
  TokenizedSource source = load_tokens(
      {.dataset_type = type, .path = path, .tokenizer_path = tokenizer, .cache_directory = cache});
  if (tokenizer.empty() && data.vocab_ < kByteVocabulary) {
    throw UserError("vocab_size: " + std::to_string(data.vocab_) +
                    " is too small for the byte-level tokenizer (needs >= 256)");
  }
  if (!tokenizer.empty() && source.pieces > data.vocab_) {
    throw UserError("vocab_size: " + std::to_string(data.vocab_) + " is smaller than the " +
                    std::to_string(source.pieces) + " pieces of '" + tokenizer + "'");
  }
  data.tokens_ = std::move(source.tokens);
  data.note_ = std::move(source.note);
  data.from_cache_ = source.from_cache;
  const TokenArray& tokens = *data.tokens_;
  const int64_t windows = (tokens.size() - 1) / data.length_;
  if (windows < 2) {
    throw UserError("dataset_path: '" + path + "' holds " + std::to_string(tokens.size()) +
                    " bytes, too few for two windows of max_target_length + 1 tokens");
  }
  const auto eval_count =
      std::max<int64_t>(1, static_cast<int64_t>(kEvalFraction * static_cast<double>(windows)));
  const int64_t train_count = windows - eval_count;
  // A fixed permutation of the training windows: an affine map with a multiplier coprime to n.
  uint64_t multiplier = splitmix64(data.seed_) % static_cast<uint64_t>(train_count) | 1;
  while (std::gcd(multiplier, static_cast<uint64_t>(train_count)) != 1) {
    multiplier += 2;
  }
  for (int64_t index = 0; index < train_count; ++index) {
    const auto permuted =
        static_cast<int64_t>((multiplier * static_cast<uint64_t>(index) + data.seed_) %
                             static_cast<uint64_t>(train_count));
    data.train_.push_back(permuted * data.length_);
  }
  for (int64_t index = 0; index < eval_count; ++index) {
    data.eval_.push_back((train_count + index) * data.length_);
  }
  // Token frequencies by id, in id order (the order of the sum decides its last bits).
  std::vector<int64_t> counts(static_cast<size_t>(std::max<int64_t>(source.pieces, data.vocab_)));
  const int64_t train_bytes = train_count * data.length_;
  int64_t counted = 0;
  for (const TokenArray::Chunk& chunk : tokens.chunks()) {
    const int64_t take = std::min(chunk.tokens, train_bytes - counted);
    for (int64_t index = 0; index < take; ++index) {
      int32_t token = 0;
      if (chunk.width == 4) {
        std::memcpy(&token, static_cast<const char*>(chunk.data) + index * 4, 4);
      } else {
        uint16_t narrow = 0;
        std::memcpy(&narrow, static_cast<const char*>(chunk.data) + index * 2, 2);
        token = narrow;
      }
      // Only a damaged token cache holds ids past its tokenizer's pieces.
      if (token < 0 || static_cast<size_t>(token) >= counts.size()) {
        throw UserError("dataset_path: token id " + std::to_string(token) + " of '" + path +
                        "' is outside the tokenizer's " + std::to_string(counts.size()) +
                        " pieces (a corrupted token cache? remove it to rebuild it)");
      }
      ++counts[static_cast<size_t>(token)];
    }
    counted += take;
  }
  for (const int64_t count : counts) {
    if (count == 0) {
      continue;
    }
    const double p = static_cast<double>(count) / static_cast<double>(train_bytes);
    data.unigram_entropy_ -= p * std::log(p);
  }
  return data;
}

Batch Dataset::window_batch(const std::vector<int64_t>& windows, int64_t first,
                            int64_t sequences) const {
  Batch batch;
  for (int64_t sequence = 0; sequence < sequences; ++sequence) {
    const int64_t start =
        windows[static_cast<size_t>((first + sequence) % static_cast<int64_t>(windows.size()))];
    for (int64_t position = 0; position < length_; ++position) {
      batch.tokens.push_back(tokens_->at(start + position));
      batch.targets.push_back(tokens_->at(start + position + 1));
    }
  }
  return batch;
}

Batch Dataset::synthetic_batch(uint64_t stream, int64_t first, int64_t sequences) const {
  Batch batch;
  for (int64_t sequence = 0; sequence < sequences; ++sequence) {
    std::vector<int32_t> row;
    for (int64_t position = 0; position <= length_; ++position) {
      const uint64_t value = splitmix64(
          seed_ ^ splitmix64(stream ^ splitmix64(static_cast<uint64_t>(
                                          (first + sequence) * (length_ + 1) + position))));
      row.push_back(static_cast<int32_t>(value % static_cast<uint64_t>(vocab_)));
    }
    batch.tokens.insert(batch.tokens.end(), row.begin(), row.end() - 1);
    batch.targets.insert(batch.targets.end(), row.begin() + 1, row.end());
  }
  return batch;
}

Batch Dataset::train_batch(int64_t step, int64_t microbatch, int64_t sequences) const {
  const int64_t first = (step * accumulation_ + microbatch) * sequences;
  return synthetic_ ? synthetic_batch(1, first, sequences) : window_batch(train_, first, sequences);
}

Batch Dataset::eval_batch(int64_t index, int64_t sequences) const {
  return synthetic_ ? synthetic_batch(2, index * sequences, sequences)
                    : window_batch(eval_, index * sequences, sequences);
}

}  // namespace tpusim
