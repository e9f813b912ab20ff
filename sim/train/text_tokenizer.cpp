#include "sim/train/text_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {
namespace {

constexpr int64_t kByteVocabulary = 256;

// The few fields of SentencePiece's ModelProto (sentencepiece_model.proto) a tokenizer.json
// needs, read from the serialized model by the protobuf wire format (the library installs no
// header for the message): TrainerSpec (field 2) model_type = 3 (1 unigram, 2 bpe, 3 word,
// 4 char), byte_fallback = 35; NormalizerSpec (field 3) add_dummy_prefix = 3 (default true).
struct ProtoFields {
  int model_type = 1;
  bool byte_fallback = false;
  bool add_dummy_prefix = true;
};

class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && at_ < bytes_.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(bytes_[at_++]);
      value |= static_cast<uint64_t>(byte & 0x7fu) << shift;
      if ((byte & 0x80u) == 0) {
        return value;
      }
    }
    throw UserError("tokenizer_path: the SentencePiece model is truncated", "tokenizer_path");
  }
  // The next field: (number, wire type); a length-delimited field's bytes in `payload`, a varint's
  // value in `value`; fixed-width fields are skipped.
  bool next(uint64_t& number, uint64_t& value, std::string_view& payload) {
    if (done()) {
      return false;
    }
    const uint64_t key = varint();
    number = key >> 3;
    switch (key & 7u) {
      case 0:
        value = varint();
        break;
      case 1:
        at_ += 8;
        break;
      case 2: {
        const uint64_t size = varint();
        if (size > bytes_.size() - std::min(at_, bytes_.size())) {
          throw UserError("tokenizer_path: the SentencePiece model is truncated", "tokenizer_path");
        }
        payload = bytes_.substr(at_, size);
        at_ += size;
        break;
      }
      case 5:
        at_ += 4;
        break;
      default:
        throw UserError("tokenizer_path: the SentencePiece model is not a ModelProto",
                        "tokenizer_path");
    }
    return true;
  }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

ProtoFields read_proto_fields(std::string_view model) {
  ProtoFields fields;
  WireReader reader(model);
  uint64_t number = 0;
  uint64_t value = 0;
  std::string_view payload;
  while (reader.next(number, value, payload)) {
    if (number != 2 && number != 3) {
      continue;
    }
    WireReader spec(payload);
    uint64_t inner = 0;
    std::string_view ignored;
    while (spec.next(inner, value, ignored)) {
      if (number == 2 && inner == 3) {
        fields.model_type = static_cast<int>(value);
      } else if (number == 2 && inner == 35) {
        fields.byte_fallback = value != 0;
      } else if (number == 3 && inner == 3) {
        fields.add_dummy_prefix = value != 0;
      }
    }
  }
  return fields;
}

}  // namespace

std::string tokenizer_path_from_config(const Config& config) {
  return config.get_string("tokenizer_path");
}

struct TextTokenizer::Model {
  sentencepiece::SentencePieceProcessor processor;
  ProtoFields fields;
};

TextTokenizer::TextTokenizer(const std::string& path) : path_(path) {
  if (path_.empty()) {
    return;
  }
  model_ = std::make_unique<Model>();
  const auto status = model_->processor.Load(path_);
  if (!status.ok()) {
    throw UserError(
        "tokenizer_path: cannot load SentencePiece model '" + path_ + "': " + status.ToString(),
        "tokenizer_path");
  }
  model_->fields = read_proto_fields(model_->processor.serialized_model_proto());
}

TextTokenizer::~TextTokenizer() = default;

int64_t TextTokenizer::vocab() const {
  return bytes() ? kByteVocabulary : model_->processor.GetPieceSize();
}

std::vector<int32_t> TextTokenizer::encode(std::string_view text) const {
  if (bytes()) {
    std::vector<int32_t> ids;
    for (const char c : text) {
      ids.push_back(static_cast<unsigned char>(c));
    }
    return ids;
  }
  std::vector<int> ids;
  if (const auto status = model_->processor.Encode(text, &ids); !status.ok()) {
    throw UserError("tokenizer_path: '" + path_ + "' cannot encode the text: " + status.ToString(),
                    "tokenizer_path");
  }
  return {ids.begin(), ids.end()};
}

std::string TextTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  if (bytes()) {
    for (const int32_t id : ids) {
      if (id >= 0 && id < kByteVocabulary) {
        text += static_cast<char>(id);
      }
    }
    return text;
  }
  std::vector<int> valid;
  for (const int32_t id : ids) {
    if (id >= 0 && id < model_->processor.GetPieceSize()) {
      valid.push_back(id);
    }
  }
  if (const auto status = model_->processor.Decode(valid, &text); !status.ok()) {
    throw UserError("tokenizer_path: '" + path_ + "' cannot decode: " + status.ToString(),
                    "tokenizer_path");
  }
  return text;
}

TextTokenizer::Special TextTokenizer::special() const {
  if (bytes()) {
    return {};
  }
  const sentencepiece::SentencePieceProcessor& processor = model_->processor;
  return {processor.bos_id(), processor.eos_id(), processor.pad_id(), processor.unk_id()};
}

std::vector<TextTokenizer::Piece> TextTokenizer::pieces() const {
  std::vector<Piece> pieces;
  if (bytes()) {
    return pieces;
  }
  const sentencepiece::SentencePieceProcessor& processor = model_->processor;
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    Piece piece{processor.IdToPiece(id), processor.GetScore(id), 1};
    if (processor.IsUnknown(id)) {
      piece.type = 2;
    } else if (processor.IsControl(id)) {
      piece.type = 3;
    } else if (processor.IsByte(id)) {
      piece.type = 6;
    } else if (processor.IsUnused(id)) {
      piece.type = 5;
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

std::string TextTokenizer::model_type() const {
  if (bytes()) {
    return "bytes";
  }
  switch (model_->fields.model_type) {
    case 2:
      return "bpe";
    case 3:
      return "word";
    case 4:
      return "char";
    default:
      return "unigram";
  }
}

bool TextTokenizer::adds_dummy_prefix() const {
  return !bytes() && model_->fields.add_dummy_prefix;
}

bool TextTokenizer::byte_fallback() const {
  return !bytes() && model_->fields.byte_fallback;
}

}  // namespace tpusim
