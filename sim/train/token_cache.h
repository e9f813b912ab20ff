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
//   int32_t first = source.tokens->at(0);
//   std::cerr << source.note << "\n";  // "dataset: 52428800 tokens read from the cache ..."
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

// Bytes of source text per tokenized piece (and cache chunk); a piece ends after a newline.
inline constexpr int64_t kTokenizePieceBytes = int64_t{8} << 20;

// 64-bit content hash of `data` (see the file comment), seedable.
uint64_t content_hash(std::string_view data, uint64_t seed = 0);

// The tokens of a source: owned in memory or memory-mapped chunks of a cache.
class TokenArray {
 public:
  struct Chunk {
    const void* data = nullptr;
    int64_t tokens = 0;
    int width = 4;  // bytes per token: 2 (uint16) or 4 (int32 in memory, uint32 in a cache)
  };
  TokenArray() = default;
  TokenArray(const TokenArray&) = delete;
  TokenArray& operator=(const TokenArray&) = delete;
  ~TokenArray();

  static std::unique_ptr<TokenArray> in_memory(std::vector<std::vector<int32_t>> pieces);
  // Maps `paths` (whole files of `width`-byte tokens) read-only; the caller has checked them.
  static std::unique_ptr<TokenArray> mapped(const std::vector<std::string>& paths, int width);

  int64_t size() const { return starts_.empty() ? 0 : starts_.back(); }
  int32_t at(int64_t index) const;
  const std::vector<Chunk>& chunks() const { return chunks_; }

 private:
  void add(Chunk chunk);

  std::vector<Chunk> chunks_;
  std::vector<int64_t> starts_;  // starts_[c] = first token of chunk c; back() = size
  std::vector<std::vector<int32_t>> owned_;
  std::vector<std::pair<void*, size_t>> mappings_;
};

struct TokenSourceSpec {
  std::string dataset_type;     // "text" or "jsonl"
  std::string path;             // dataset_path
  std::string tokenizer_path;   // "" = bytes
  std::string cache_directory;  // "" = no cache
};

struct TokenizedSource {
  std::shared_ptr<const TokenArray> tokens;
  int64_t pieces = 0;           // the tokenizer's vocabulary (256 for bytes)
  bool from_cache = false;      // read from the cache, nothing tokenized
  double tokenize_seconds = 0;  // time spent tokenizing (0 from the cache)
  std::string cache_path;       // the cache's directory ("" without a cache)
  std::string note;             // one line saying what happened, for the progress output
};

TokenizedSource load_tokens(const TokenSourceSpec& spec);

// The text of each token, for display: SentencePiece pieces with tokenizer_path, else bytes
// (byte_token_text of token_viz.h; ids past 255, from synthetic data, as "#id").
std::vector<std::string> token_texts(const std::string& tokenizer_path,
                                     const std::vector<int32_t>& tokens);

}  // namespace tpusim
