#include "sim/train/dataset.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/counter_hash.h"
#include "common/error.h"
#include "common/input_files.h"
#include "model/config.h"
#include "sim/train/token_cache.h"

namespace tpusim {
namespace {

constexpr int64_t kByteVocabulary = 256;
// Tokens per era (see dataset.h): an era is shuffled on its own, so training needs the first
// era's tokens only; 2^20 tokens is a fraction of a second of tokenizing.
constexpr int64_t kEraTokens = int64_t{1} << 20;
// One window in kEvalShare of each era is held out for evaluation.
constexpr int64_t kEvalShare = 10;

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
  note_input(path);
  note_input(tokenizer);
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
  data.pieces_ = std::max(source.pieces, data.vocab_);
  data.era_windows_ = std::max<int64_t>(2, kEraTokens / data.length_);
  // Two windows of length + 1 tokens at least (waits for the tokenizer's first pieces).
  if (data.tokens_->wait_for(2 * data.length_ + 1) < 2 * data.length_ + 1) {
    throw UserError("dataset_path: '" + path + "' holds " + std::to_string(data.tokens_->size()) +
                    " tokens, too few for two windows of max_target_length + 1 tokens");
  }
  // A cache is data from disk: every id must be one of the tokenizer's (a damaged cache's ids
  // past the vocabulary would index past the embedding). Ids from the tokenizer itself are.
  if (data.from_cache_) {
    for (const TokenArray::Chunk& chunk : data.tokens_->chunks()) {
      for (int64_t index = 0; index < chunk.tokens; ++index) {
        const int32_t token = chunk.at(index);
        if (token < 0 || token >= data.pieces_) {
          throw UserError("dataset_path: token id " + std::to_string(token) + " of '" + path +
                          "' is outside the tokenizer's " + std::to_string(data.pieces_) +
                          " pieces (a corrupted token cache? remove it to rebuild it)");
        }
      }
    }
  }
  return data;
}

int64_t Dataset::eval_windows_in_era(int64_t windows) {
  return windows < 2 ? 0 : std::max<int64_t>(1, windows / kEvalShare);
}

Dataset::Layout Dataset::layout() const {
  Layout layout;
  layout.windows = (tokens_->size() - 1) / length_;
  const int64_t full = layout.windows / era_windows_;
  const int64_t rest = layout.windows % era_windows_;
  layout.train =
      full * (era_windows_ - eval_windows_in_era(era_windows_)) + rest - eval_windows_in_era(rest);
  layout.eval = full * eval_windows_in_era(era_windows_) + eval_windows_in_era(rest);
  return layout;
}

int64_t Dataset::window_start(int64_t index, bool eval) const {
  const int64_t full_era_eval = eval_windows_in_era(era_windows_);
  const int64_t per_era = eval ? full_era_eval : era_windows_ - full_era_eval;
  int64_t era = index / per_era;
  // Era `era` is complete once its last window's last token is there; a source that ends before
  // has its size known, and the index wraps around the windows there are.
  const int64_t needed = (era + 1) * era_windows_ * length_ + 1;
  if (tokens_->wait_for(needed) < needed) {
    const Layout known = layout();
    index %= eval ? known.eval : known.train;
    era = index / per_era;
  }
  const int64_t windows_in_era =
      std::min(era_windows_, (tokens_->size() - 1) / length_ - era * era_windows_);
  const int64_t era_eval = eval_windows_in_era(windows_in_era);
  const int64_t position = index - era * per_era;
  if (eval) {
    // The last tenth of each era is held out: a contiguous stretch of text.
    return (era * era_windows_ + windows_in_era - era_eval + position) * length_;
  }
  // The era's training windows in a fixed order: an affine map with a multiplier coprime to n.
  const auto count = static_cast<uint64_t>(windows_in_era - era_eval);
  uint64_t multiplier = splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(era))) % count | 1;
  while (std::gcd(multiplier, count) != 1) {
    multiplier += 2;
  }
  const auto permuted =
      static_cast<int64_t>((multiplier * static_cast<uint64_t>(position) + seed_) % count);
  return (era * era_windows_ + permuted) * length_;
}

int64_t Dataset::train_windows() const {
  if (synthetic_) {
    return 0;
  }
  tokens_->wait_complete();
  return layout().train;
}

int64_t Dataset::eval_windows() const {
  if (synthetic_) {
    return 0;
  }
  tokens_->wait_complete();
  return layout().eval;
}

std::string Dataset::wait_until_tokenized() const {
  return synthetic_ ? std::string() : tokens_->wait_complete();
}

double Dataset::unigram_entropy() const {
  if (synthetic_) {
    return 0;
  }
  tokens_->wait_complete();
  // Token frequencies over the training windows' tokens, by id, summed in id order (the order of
  // the sum decides its last bits).
  std::vector<int64_t> counts(static_cast<size_t>(pieces_));
  const int64_t windows = layout().windows;
  int64_t total = 0;
  for (int64_t era = 0; era * era_windows_ < windows; ++era) {
    const int64_t in_era = std::min(era_windows_, windows - era * era_windows_);
    const int64_t first = era * era_windows_ * length_;
    const int64_t end = first + (in_era - eval_windows_in_era(in_era)) * length_;
    for (int64_t index = first; index < end; ++index) {
      ++counts[static_cast<size_t>(tokens_->at(index))];
    }
    total += end - first;
  }
  double entropy = 0;
  for (const int64_t count : counts) {
    if (count > 0) {
      const double p = static_cast<double>(count) / static_cast<double>(total);
      entropy -= p * std::log(p);
    }
  }
  return entropy;
}

Batch Dataset::window_batch(bool eval, int64_t first, int64_t sequences) const {
  Batch batch;
  for (int64_t sequence = 0; sequence < sequences; ++sequence) {
    const int64_t start = window_start(first + sequence, eval);
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
  return synthetic_ ? synthetic_batch(1, first, sequences) : window_batch(false, first, sequences);
}

Batch Dataset::eval_batch(int64_t index, int64_t sequences) const {
  return synthetic_ ? synthetic_batch(2, index * sequences, sequences)
                    : window_batch(true, index * sequences, sequences);
}

}  // namespace tpusim
