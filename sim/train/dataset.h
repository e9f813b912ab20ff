// sim/train/dataset.h: the training data of `tpusim train`, deterministic by step.
//
// dataset_type=synthetic draws tokens from a counter-based hash of (seed, step, sequence,
// position). A local file (dataset_path: plain text, or JSON lines with a "text" field) is read
// as bytes (the byte-level tokenizer: token = byte value, so vocab_size must be >= 256) or with
// the SentencePiece model at tokenizer_path (its pieces must fit in vocab_size), packed
// into windows of max_target_length + 1 tokens (inputs and next-token targets).
//
// Order, as Levanter's era shuffling: the windows are grouped into eras of 2^20 tokens in file
// order; in each era the last tenth of its windows is held out for evaluation and the others are
// visited in a fixed permutation (seeded by data_shuffle_seed and the era), era after era, then
// around again. The batch of step s is that order's positions [s * batch, (s + 1) * batch), so a
// resumed run reads exactly what an uninterrupted one would, and an era is all training needs to
// start: the tokens come from token_cache.h, tokenized in the background while training reads
// the first eras (or memory-mapped from dataset_cache_dir, whatever max_target_length); the
// batches are bitwise the same either way.
//
// Example:
//   Dataset data = Dataset::from_config(config);
//   Batch batch = data.train_batch(step, /*microbatch=*/0, /*sequences=*/16);
//   std::cerr << data.wait_until_tokenized() << "\n";  // at the end of a run: the cache is done
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

  // Training and held-out windows of the whole source (wait for the tokenizer to finish).
  int64_t train_windows() const;
  int64_t eval_windows() const;
  int64_t microbatches_per_step() const { return accumulation_; }
  // Unigram entropy of the training windows' tokens in nats (0 for synthetic data): a loss below
  // it means the model learned more than token frequencies. Waits for the tokenizer.
  double unigram_entropy() const;
  // What loading did ("dataset: 1234 tokens read from the cache ...", "dataset: tokenizing ... in
  // the background"); "" for synthetic data.
  const std::string& note() const { return note_; }
  // Waits for the background tokenizer (and the cache it writes), rethrowing its error; returns
  // what it did ("dataset: tokenized ... cached in ..."), "" when nothing was tokenized.
  std::string wait_until_tokenized() const;
  bool from_cache() const { return from_cache_; }

 private:
  struct Layout {
    int64_t windows = 0;
    int64_t train = 0;
    int64_t eval = 0;
  };
  static int64_t eval_windows_in_era(int64_t windows);
  // Window counts of the tokens there are (the whole source once tokenizing is complete).
  Layout layout() const;
  // First token of training (or held-out) window `index` of the order; waits for its era.
  int64_t window_start(int64_t index, bool eval) const;
  Batch window_batch(bool eval, int64_t first, int64_t sequences) const;
  Batch synthetic_batch(uint64_t stream, int64_t first, int64_t sequences) const;

  bool synthetic_ = true;
  uint64_t seed_ = 0;
  int64_t length_ = 0;
  int64_t vocab_ = 0;
  int64_t pieces_ = 0;  // token ids are below this (the larger of vocab_size and the tokenizer's)
  int64_t accumulation_ = 1;
  int64_t era_windows_ = 2;
  std::shared_ptr<const TokenArray> tokens_;
  std::string note_;
  bool from_cache_ = false;
};

}  // namespace tpusim
