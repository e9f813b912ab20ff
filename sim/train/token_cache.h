// sim/train/token_cache.h: the tokens of a text or JSON-lines file, tokenized once and cached.
//
// load_tokens() reads dataset_path (dataset_type text or jsonl), tokenizes it (bytes, or the
// SentencePiece model at tokenizer_path) piece by piece and, with a cache directory, keeps the
// result in <dataset_cache_dir>/<file name>-<key>/ (key: a hash of dataset_type, the source's and
// the tokenizer's absolute paths):
//   chunk-<source hash>-<n>.bin   the tokens of piece n, little-endian uint16 (uint32 when the
//                                 tokenizer has more than 65536 pieces), memory-mapped on reading
//   index.json                    format, source and tokenizer fingerprints, token width, and per
//                                 chunk its file, token count and content hash
// Every file is written durably (temporary, fsync, rename) and the index last, so a reader
// (another run, even a concurrent one) sees either no cache or a complete one.
//
// Tokenizing streams: load_tokens() returns as soon as the source is read and cut into pieces;
// a background thread tokenizes the pieces (on worker threads, one per core) and publishes them
// in order into a growing TokenArray, writing each chunk to the cache as it goes and the index
// last. Training reads the first pieces while the rest are tokenized (TokenArray::wait_for), and
// TokenArray::wait_complete() at the end of a run waits for the cache to be finished, so the
// next run reads it. A run that stops early (an error) cancels the tokenizer: no index, no cache.
//
// Fingerprint of a file: (size, mtime in ns, a 64-bit hash of the content). When size and mtime
// match the index the file is not read at all; when either differs the content hash decides (a
// copied or touched file with the same bytes still uses the cache). The hash is a 4-lane
// multiply-rotate hash (xxHash64's round), several GB/s, so checking a 50 MB source or 100 MB of
// chunks costs tens of ms where SHA-256 would cost a few hundred.
//
// Reading a cache: a source or tokenizer that changed makes the cache stale (rebuilt, and the note
// says why); a chunk that is missing, truncated or whose content hash differs, or an unreadable
// index, is a corrupted cache: UserError naming the file (exit 2), nothing is rebuilt silently.
//
// The tokens do not depend on max_target_length or the seeds (windows and order are the
// Dataset's), so one cache serves every run on the same file. With or without a cache the tokens
// are the same: a source is always tokenized in pieces of about kTokenizePieceBytes cut after a
// newline (SentencePiece encodes each piece on its own; byte-level tokens are the bytes), the
// pieces on worker threads, one per core (the tokens do not depend on their number).
//
// Example:
//   TokenizedSource source = load_tokens({.dataset_type = "text", .path = "corpus.txt",
//                                         .cache_directory = "runs/dataset_cache"});
//   source.tokens->wait_for(1);
//   int32_t first = source.tokens->at(0);
//   std::cerr << source.note << "\n";  // "dataset: 52428800 tokens read from the cache ..."
//   std::cerr << source.tokens->wait_complete() << "\n";  // what a background tokenizer did
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tpusim {

// Bytes of source text per tokenized piece (and cache chunk); a piece ends after a newline.
inline constexpr int64_t kTokenizePieceBytes = int64_t{1} << 20;

// 64-bit content hash of `data` (see the file comment), seedable.
uint64_t content_hash(std::string_view data, uint64_t seed = 0);

// The tokens of a source: owned in memory, memory-mapped chunks of a cache, or a growing array
// that a background tokenizer fills chunk by chunk while training already reads its beginning.
// Readers (any thread) may read the published prefix while the producer publishes more.
class TokenArray {
 public:
  struct Chunk {
    const void* data = nullptr;
    int64_t tokens = 0;
    int width = 4;  // bytes per token: 2 (uint16) or 4 (int32 in memory, uint32 in a cache)
    // Token `index` < tokens of this chunk.
    int32_t at(int64_t index) const;
  };
  TokenArray() = default;
  TokenArray(const TokenArray&) = delete;
  TokenArray& operator=(const TokenArray&) = delete;
  // A growing array's producer is told to stop and joined (its cache is then not written).
  ~TokenArray();

  static std::unique_ptr<TokenArray> in_memory(std::vector<std::vector<int32_t>> pieces);
  // Maps `paths` (whole files of `width`-byte tokens) read-only; the caller has checked them.
  static std::unique_ptr<TokenArray> mapped(const std::vector<std::string>& paths, int width);

  // Tokens published so far (all of them once complete()).
  int64_t size() const;
  // Token `index` < size().
  int32_t at(int64_t index) const;
  // Blocks until at least `tokens` tokens are published or the array is complete; returns size().
  // Rethrows the producer's error (a tokenizer failure, a cache that cannot be written).
  int64_t wait_for(int64_t tokens) const;
  bool complete() const;
  // Waits for the producer to finish; rethrows its error; returns what it did ("dataset:
  // tokenized 52428800 tokens ... cached in ..."), "" for arrays that were complete at once.
  std::string wait_complete() const;
  // Every chunk; only once complete().
  const std::vector<Chunk>& chunks() const { return chunks_; }

  // The producer side of a growing array of `expected_chunks` chunks: `produce` runs on a
  // background thread, calls publish() for each chunk in order and returns its note; it should
  // return early once `cancelled` is set.
  using Producer =
      std::function<std::string(TokenArray& array, const std::atomic<bool>& cancelled)>;
  static std::shared_ptr<TokenArray> growing(size_t expected_chunks, Producer produce);
  void publish(std::vector<int32_t> tokens);

 private:
  void add(Chunk chunk);

  std::vector<Chunk> chunks_;    // sized up front for a growing array: never reallocated
  std::vector<int64_t> starts_;  // starts_[c] = first token of chunk c; starts_[published] = size
  std::vector<std::vector<int32_t>> owned_;
  std::vector<std::pair<void*, size_t>> mappings_;
  // Growing arrays: chunks [0, published_) are readable.
  std::atomic<size_t> published_{0};
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool complete_ = true;
  std::exception_ptr failure_;
  std::string note_;
  std::atomic<bool> cancelled_{false};
  std::thread producer_;
};

struct TokenSourceSpec {
  std::string dataset_type;     // "text" or "jsonl"
  std::string path;             // dataset_path
  std::string tokenizer_path;   // "" = bytes
  std::string cache_directory;  // "" = no cache
};

struct TokenizedSource {
  std::shared_ptr<const TokenArray> tokens;
  int64_t pieces = 0;       // the tokenizer's vocabulary (256 for bytes)
  bool from_cache = false;  // read from the cache, nothing tokenized
  std::string cache_path;   // the cache's directory ("" without a cache)
  // One line saying what happened ("read from the cache", or "tokenizing ... in the background")
  // for the progress output; tokens->wait_complete() says how the tokenizing ended.
  std::string note;
};

TokenizedSource load_tokens(const TokenSourceSpec& spec);

// The text of each token, for display: SentencePiece pieces with tokenizer_path, else bytes
// (byte_token_text of token_viz.h; ids past 255, from synthetic data, as "#id").
std::vector<std::string> token_texts(const std::string& tokenizer_path,
                                     const std::vector<int32_t>& tokens);

}  // namespace tpusim
