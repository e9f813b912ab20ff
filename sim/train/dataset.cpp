#include "sim/train/dataset.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/counter_hash.h"
#include "common/error.h"
#include "common/yaml_text.h"
#include "model/config.h"

namespace tpusim {
namespace {

constexpr int64_t kByteVocabulary = 256;
constexpr double kEvalFraction = 0.1;

// dataset_type decides how the file is read, whatever its name: "text" as is, "jsonl" as one JSON
// record with a "text" string per line.
std::string read_documents(const std::string& path, bool json_lines) {
  std::string raw = read_text_file(path);
  if (!json_lines) {
    return raw;
  }
  std::string text;
  std::istringstream lines(raw);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      continue;
    }
    try {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (!record.contains("text") || !record["text"].is_string()) {
        throw UserError(path + ":" + std::to_string(number) +
                        ": a JSON-lines record needs a \"text\" string");
      }
      text += record["text"].get<std::string>();
      text += '\n';
    } catch (const nlohmann::json::exception& error) {
      throw UserError(path + ":" + std::to_string(number) + ": malformed JSON: " + error.what());
    }
  }
  return text;
}

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
  const std::string text = read_documents(path, type == "jsonl");
  if (tokenizer.empty()) {
    if (data.vocab_ < kByteVocabulary) {
      throw UserError("vocab_size: " + std::to_string(data.vocab_) +
                      " is too small for the byte-level tokenizer (needs >= 256)");
    }
    data.bytes_.assign(text.begin(), text.end());
    for (int32_t& token : data.bytes_) {
      token = static_cast<int32_t>(static_cast<unsigned char>(static_cast<char>(token)));
    }
  } else {
    // A SentencePiece model (the tokenizer MaxText's Llama-2-era configs use).
    sentencepiece::SentencePieceProcessor processor;
    const auto status = processor.Load(tokenizer);
    if (!status.ok()) {
      throw UserError("tokenizer_path: cannot load SentencePiece model '" + tokenizer +
                      "': " + status.ToString());
    }
    if (processor.GetPieceSize() > data.vocab_) {
      throw UserError("vocab_size: " + std::to_string(data.vocab_) + " is smaller than the " +
                      std::to_string(processor.GetPieceSize()) + " pieces of '" + tokenizer + "'");
    }
    std::vector<int> ids;
    const auto encoded = processor.Encode(text, &ids);
    if (!encoded.ok()) {
      throw UserError("tokenizer_path: '" + tokenizer + "' failed on '" + path +
                      "': " + encoded.ToString());
    }
    data.bytes_.assign(ids.begin(), ids.end());
  }
  const int64_t windows = (static_cast<int64_t>(data.bytes_.size()) - 1) / data.length_;
  if (windows < 2) {
    throw UserError("dataset_path: '" + path + "' holds " + std::to_string(data.bytes_.size()) +
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
  std::map<int32_t, int64_t> counts;
  const int64_t train_bytes = train_count * data.length_;
  for (int64_t index = 0; index < train_bytes; ++index) {
    ++counts[data.bytes_[static_cast<size_t>(index)]];
  }
  for (const auto& [token, count] : counts) {
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
      batch.tokens.push_back(bytes_[static_cast<size_t>(start + position)]);
      batch.targets.push_back(bytes_[static_cast<size_t>(start + position + 1)]);
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
