// sim/train/text_tokenizer.h: text <-> token ids for `tpusim generate` and the tokenizer files of
// `tpusim export-hf`, with the tokenizer training used: the SentencePiece model at tokenizer_path,
// or (no path) the byte-level tokenizer (token = byte value, ids 0..255, no special tokens).
//
// Encoding is what the training data saw (sim/train/token_cache.cpp): SentencePiece's Encode of
// the text, with no BOS or EOS added; bytes as they are. Decoding a list of ids gives the text
// (SentencePiece's Decode; the byte tokenizer drops ids past 255, which only synthetic data
// makes).
//
// Example:
//   const TextTokenizer tokenizer("");                 // bytes
//   tokenizer.encode("hi");                            // {104, 105}
//   tokenizer.decode({104, 105});                      // "hi"
//   TextTokenizer("runs/text.model").special().eos;    // SentencePiece's eos_id (2), -1 if none
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

class Config;

// The tokenizer_path key ("" = the byte-level tokenizer).
std::string tokenizer_path_from_config(const Config& config);

class TextTokenizer {
 public:
  struct Special {
    int32_t bos = -1;  // -1: the tokenizer has none
    int32_t eos = -1;
    int32_t pad = -1;
    int32_t unk = -1;
  };
  struct Piece {
    std::string text;
    float score = 0;
    int type = 1;  // SentencePiece's ModelProto.SentencePiece.Type: 1 normal, 2 unknown,
                   // 3 control, 5 unused, 6 byte
  };

  // `path` "" = bytes; UserError naming tokenizer_path when the model cannot be loaded.
  explicit TextTokenizer(const std::string& path);
  ~TextTokenizer();
  TextTokenizer(const TextTokenizer&) = delete;
  TextTokenizer& operator=(const TextTokenizer&) = delete;

  bool bytes() const { return path_.empty(); }
  const std::string& path() const { return path_; }
  int64_t vocab() const;  // 256 for bytes
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  Special special() const;
  // Every piece by id (SentencePiece models only): what a tokenizer.json lists.
  std::vector<Piece> pieces() const;
  // "unigram", "bpe", "word" or "char" (SentencePiece's model_type); "bytes" for bytes.
  std::string model_type() const;
  // SentencePiece's normalizer settings that a tokenizer.json must reproduce.
  bool adds_dummy_prefix() const;
  bool byte_fallback() const;

 private:
  std::string path_;
  struct Model;
  std::unique_ptr<Model> model_;
};

}  // namespace tpusim
