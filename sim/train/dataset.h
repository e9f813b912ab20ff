// sim/train/dataset.h: the training data of `tpusim train`, deterministic by step.
//
// dataset_type=synthetic draws tokens from a counter-based hash of (seed, step, sequence,
// position). A local file (dataset_path: plain text, or JSON lines with a "text" field) is read
// as bytes (the byte-level tokenizer: token = byte value, so vocab_size must be >= 256) or with
// the SentencePiece model at tokenizer_path (its pieces must fit in vocab_size), packed
// into windows of max_target_length + 1 tokens (inputs and next-token targets), and split 90/10
// into training and held-out evaluation windows. The batch of step s is a fixed permutation of
// the windows, indexed by s, so a resumed run reads exactly what an uninterrupted one would.
// The tokens come from token_cache.h: tokenized once into dataset_cache_dir (default
// <base_output_directory>/dataset_cache; no cache when both are ""), then memory-mapped by every
// later run whatever its max_target_length; the batches are bitwise the same either way.
//
// Example:
//   Dataset data = Dataset::from_config(config);
//   Batch batch = data.train_batch(step, /*microbatch=*/0, /*sequences=*/16);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpusim {

class Config;
class TokenArray;

struct Batch {
  std::vector<int32_t> tokens;   // [sequences, length] row-major
  std::vector<int32_t> targets;  // the next token of each position
};

class Dataset {
 public:
  static Dataset from_config(const Config& config);

  // Microbatch `microbatch` of optimizer step `step` (steps count from 0).
  Batch train_batch(int64_t step, int64_t microbatch, int64_t sequences) const;
  // Evaluation batch `index` of the held-out windows (synthetic data: a separate seed).
  Batch eval_batch(int64_t index, int64_t sequences) const;

  int64_t train_windows() const { return static_cast<int64_t>(train_.size()); }
  int64_t eval_windows() const { return static_cast<int64_t>(eval_.size()); }
  int64_t microbatches_per_step() const { return accumulation_; }
  // Unigram entropy of the training tokens in nats (0 for synthetic data): a loss below it means
  // the model learned more than token frequencies.
  double unigram_entropy() const { return unigram_entropy_; }
  // What loading did ("dataset: 1234 tokens read from the cache ..."); "" for synthetic data.
  const std::string& note() const { return note_; }
  bool from_cache() const { return from_cache_; }

 private:
  Batch window_batch(const std::vector<int64_t>& windows, int64_t first, int64_t sequences) const;
  Batch synthetic_batch(uint64_t stream, int64_t first, int64_t sequences) const;

  bool synthetic_ = true;
  uint64_t seed_ = 0;
  int64_t length_ = 0;
  int64_t vocab_ = 0;
  int64_t accumulation_ = 1;
  std::shared_ptr<const TokenArray> tokens_;
  std::string note_;
  bool from_cache_ = false;
  std::vector<int64_t> train_;  // window start offsets, permuted
  std::vector<int64_t> eval_;
  double unigram_entropy_ = 0;
};

}  // namespace tpusim
