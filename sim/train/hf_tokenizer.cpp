#include "sim/train/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/yaml_text.h"

namespace tpusim {
namespace {

using Json = nlohmann::ordered_json;

const char* const kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's whitespace marker

std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n.
std::array<std::string, 256> byte_characters() {
  std::array<bool, 256> printable{};
  for (int byte = 0; byte < 256; ++byte) {
    printable[static_cast<size_t>(byte)] = (byte >= '!' && byte <= '~') ||
                                           (byte >= 0xa1 && byte <= 0xac) ||
                                           (byte >= 0xae && byte <= 0xff);
  }
  std::array<std::string, 256> characters;
  uint32_t next = 256;
  for (int byte = 0; byte < 256; ++byte) {
    characters[static_cast<size_t>(byte)] =
        utf8(printable[static_cast<size_t>(byte)] ? static_cast<uint32_t>(byte) : next++);
  }
  return characters;
}

Json byte_level_tokenizer_json() {
  Json vocab = Json::object();
  const std::array<std::string, 256> characters = byte_characters();
  for (int byte = 0; byte < 256; ++byte) {
    vocab[characters[static_cast<size_t>(byte)]] = byte;
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", Json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", Json::array()}}}};
}

bool is_special(const TextTokenizer::Piece& piece) {
  return piece.type == 2 || piece.type == 3;
}

// BPE merges of a SentencePiece BPE model, as transformers' SentencePieceExtractor recovers them:
// every split of a piece into two pieces, ordered by the merged piece's id, then the parts'.
Json bpe_merges(const std::vector<TextTokenizer::Piece>& pieces) {
  std::unordered_map<std::string, int> ids;
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (!is_special(pieces[id])) {
      ids.emplace(pieces[id].text, static_cast<int>(id));
    }
  }
  std::vector<std::tuple<int, int, int>> merges;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& text = pieces[id].text;
    if (is_special(pieces[id])) {
      continue;
    }
    for (size_t cut = 1; cut < text.size(); ++cut) {
      const auto left = ids.find(text.substr(0, cut));
      const auto right = ids.find(text.substr(cut));
      if (left != ids.end() && right != ids.end()) {
        merges.emplace_back(static_cast<int>(id), left->second, right->second);
      }
    }
  }
  std::sort(merges.begin(), merges.end());
  Json list = Json::array();
  for (const auto& [merged, left, right] : merges) {
    list.push_back(pieces[static_cast<size_t>(left)].text + " " +
                   pieces[static_cast<size_t>(right)].text);
  }
  return list;
}

Json sentencepiece_model_json(const TextTokenizer& tokenizer,
                              const std::vector<TextTokenizer::Piece>& pieces) {
  const TextTokenizer::Special special = tokenizer.special();
  if (tokenizer.model_type() == "bpe") {
    Json vocab = Json::object();
    for (size_t id = 0; id < pieces.size(); ++id) {
      vocab[pieces[id].text] = id;
    }
    return {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", special.unk >= 0 ? Json(pieces[static_cast<size_t>(special.unk)].text)
                                           : Json(nullptr)},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", tokenizer.byte_fallback()},
            {"vocab", vocab},
            {"merges", bpe_merges(pieces)}};
  }
  Json vocab = Json::array();
  for (const TextTokenizer::Piece& piece : pieces) {
    vocab.push_back({piece.text, piece.score});
  }
  return {{"type", "Unigram"},
          {"unk_id", special.unk >= 0 ? Json(special.unk) : Json(nullptr)},
          {"vocab", vocab},
          {"byte_fallback", tokenizer.byte_fallback()}};
}

Json sentencepiece_tokenizer_json(const TextTokenizer& tokenizer) {
  const std::vector<TextTokenizer::Piece> pieces = tokenizer.pieces();
  Json added = Json::array();
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (is_special(pieces[id])) {
      added.push_back({{"id", id},
                       {"content", pieces[id].text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
  }
  const bool prefix = tokenizer.adds_dummy_prefix();
  const Json metaspace = {{"type", "Metaspace"},
                          {"replacement", kSpace},
                          {"add_prefix_space", prefix},
                          {"prepend_scheme", prefix ? "always" : "never"},
                          {"split", true}};
  Json json = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  if (tokenizer.model_type() == "bpe") {
    // LlamaConverter: the spaces become the marker before the model, which sees the whole text.
    Json normalizers = Json::array();
    if (prefix) {
      normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
    }
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
    Json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (prefix) {
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    json["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    json["pre_tokenizer"] = nullptr;
    json["post_processor"] = nullptr;
    json["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  } else {
    // SpmConverter: SentencePiece's default normalizer (nmt_nfkc) is NFKC with the spaces at
    // both ends removed and runs of spaces collapsed.
    json["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFKC"}},
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
          {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}}}};
    json["pre_tokenizer"] = metaspace;
    json["post_processor"] = nullptr;
    json["decoder"] = metaspace;
  }
  json["model"] = sentencepiece_model_json(tokenizer, pieces);
  return json;
}

// The special tokens' texts by role ("bos_token": "<s>", ...), those the tokenizer has.
Json special_tokens_map(const TextTokenizer& tokenizer) {
  Json map = Json::object();
  const TextTokenizer::Special special = tokenizer.special();
  const std::vector<TextTokenizer::Piece> pieces = tokenizer.pieces();
  for (const auto& [role, id] :
       {std::pair{"bos_token", special.bos}, std::pair{"eos_token", special.eos},
        std::pair{"unk_token", special.unk}, std::pair{"pad_token", special.pad}}) {
    if (id >= 0 && static_cast<size_t>(id) < pieces.size()) {
      map[role] = pieces[static_cast<size_t>(id)].text;
    }
  }
  return map;
}

}  // namespace

std::map<std::string, std::string> hf_tokenizer_files(const TextTokenizer& tokenizer) {
  std::map<std::string, std::string> files;
  const Json special = special_tokens_map(tokenizer);
  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 {"clean_up_tokenization_spaces", false}};
  config.update(special);
  if (tokenizer.bytes()) {
    files["tokenizer.json"] = byte_level_tokenizer_json().dump(2) + "\n";
  } else {
    files["tokenizer.model"] = read_text_file(tokenizer.path());
    files["tokenizer.json"] = sentencepiece_tokenizer_json(tokenizer).dump(2) + "\n";
  }
  files["tokenizer_config.json"] = config.dump(2) + "\n";
  files["special_tokens_map.json"] = special.dump(2) + "\n";
  return files;
}

nlohmann::json hf_special_token_ids(const TextTokenizer& tokenizer) {
  const TextTokenizer::Special special = tokenizer.special();
  const auto id = [](int32_t value) {
    return value >= 0 ? nlohmann::json(value) : nlohmann::json(nullptr);
  };
  return {{"bos_token_id", id(special.bos)},
          {"eos_token_id", id(special.eos)},
          {"pad_token_id", id(special.pad)}};
}

}  // namespace tpusim
