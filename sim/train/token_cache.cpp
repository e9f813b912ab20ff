#include "sim/train/token_cache.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/counter_hash.h"
#include "common/error.h"
#include "common/yaml_text.h"
#include "sim/train/token_viz.h"

namespace tpusim {
namespace {

constexpr const char* kFormat = "tpusim-token-cache-2";
constexpr const char* kIndexFile = "index.json";
constexpr int64_t kByteVocabulary = 256;
constexpr int64_t kMaxUint16Pieces = 65536;

// xxHash64's constants and round (Collet, xxHash specification).
constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;

uint64_t rotate_left(uint64_t value, int bits) {
  return (value << bits) | (value >> (64 - bits));
}
uint64_t round_hash(uint64_t lane, uint64_t word) {
  return rotate_left(lane + word * kPrime2, 31) * kPrime1;
}

std::string hex(uint64_t value) {
  std::ostringstream out;
  out << std::hex;
  out.width(16);
  out.fill('0');
  out << value;
  return out.str();
}

// dataset_type decides how the file is read, whatever its name: "text" as is, "jsonl" as one JSON
// record with a "text" string per line.
// (JSON lines only: a text file is used as read.)
std::string read_documents(const std::string& raw, const std::string& path) {
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

struct Fingerprint {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
  std::string hash;  // "" until computed

  nlohmann::json to_json() const {
    return {{"bytes", bytes}, {"mtime_ns", mtime_ns}, {"hash", hash}};
  }
};

Fingerprint stat_file(const std::string& path, const std::string& key) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0 || !S_ISREG(status.st_mode)) {
    throw UserError(key + ": '" + path + "' is not a readable regular file", key);
  }
  Fingerprint print;
  print.bytes = static_cast<uint64_t>(status.st_size);
  print.mtime_ns = static_cast<int64_t>(status.st_mtim.tv_sec) * 1000000000 +
                   static_cast<int64_t>(status.st_mtim.tv_nsec);
  return print;
}

// The whole number `object[key]`, or nullopt when it is missing or not an integer that fits int64
// (nlohmann's get<int64_t> converts 1e51 or 2^64 - 1 out of range: undefined behavior).
std::optional<int64_t> integer_field(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) {
    return std::nullopt;
  }
  const auto found = object.find(key);
  if (found == object.end() || !found->is_number_integer()) {
    return std::nullopt;
  }
  if (found->is_number_unsigned()) {
    const auto value = found->get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(value);
  }
  return found->get<int64_t>();
}

// Whether the file still is what `recorded` describes: the same size and the same content hash.
// The content is hashed every time, whatever the mtime says: `cp -p`, `rsync -a` and `touch -r`
// keep an edited file's mtime (issue 35, item 6), and hashing reads the file once at several GB/s,
// little next to tokenizing it.
bool still_matches(const std::string& path, const Fingerprint& now,
                   const nlohmann::json& recorded) {
  const std::optional<int64_t> bytes = integer_field(recorded, "bytes");
  if (!bytes || *bytes < 0 || static_cast<uint64_t>(*bytes) != now.bytes) {
    return false;
  }
  return recorded.value("hash", std::string()) == hex(content_hash(read_text_file(path)));
}

// The source text cut into pieces of about kTokenizePieceBytes, each ending after a newline.
std::vector<std::string_view> cut_pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = std::min(text.size(), start + static_cast<size_t>(kTokenizePieceBytes));
    if (end < text.size()) {
      const size_t newline = text.find('\n', end - 1);
      end = newline == std::string_view::npos ? text.size() : newline + 1;
    }
    pieces.push_back(text.substr(start, end - start));
    start = end;
  }
  return pieces;
}

class Tokenizer {
 public:
  Tokenizer(const std::string& model, const std::string& source) : model_(model), source_(source) {
    if (model_.empty()) {
      return;
    }
    const auto status = processor_.Load(model_);
    if (!status.ok()) {
      throw UserError(
          "tokenizer_path: cannot load SentencePiece model '" + model_ + "': " + status.ToString(),
          "tokenizer_path");
    }
  }
  int64_t pieces() const {
    return model_.empty() ? kByteVocabulary : static_cast<int64_t>(processor_.GetPieceSize());
  }
  std::string piece(int32_t token) const {
    return token >= 0 && token < pieces() ? processor_.IdToPiece(token)
                                          : "#" + std::to_string(token);
  }
  std::vector<int32_t> encode(std::string_view text) const {
    if (model_.empty()) {
      std::vector<int32_t> tokens(text.size());
      for (size_t index = 0; index < text.size(); ++index) {
        tokens[index] = static_cast<unsigned char>(text[index]);
      }
      return tokens;
    }
    std::vector<int> ids;
    const auto encoded = processor_.Encode(text, &ids);
    if (!encoded.ok()) {
      throw UserError(
          "tokenizer_path: '" + model_ + "' failed on '" + source_ + "': " + encoded.ToString(),
          "tokenizer_path");
    }
    return {ids.begin(), ids.end()};
  }

 private:
  std::string model_;
  std::string source_;
  sentencepiece::SentencePieceProcessor processor_;
};

// Tokenizes the pieces on the host's cores (each piece on its own, so the tokens do not depend on
// the thread count) and hands them to `consume` in order, on the calling thread, as soon as each
// and all before it are done. Stops early when `cancelled` is set; the first error is rethrown.
void encode_pieces_in_order(const Tokenizer& tokenizer, const std::vector<std::string_view>& pieces,
                            const std::atomic<bool>& cancelled,
                            const std::function<void(size_t, std::vector<int32_t>)>& consume) {
  std::vector<std::vector<int32_t>> tokens(pieces.size());
  std::vector<std::exception_ptr> errors(pieces.size());
  std::vector<char> done(pieces.size(), 0);
  std::mutex mutex;
  std::condition_variable finished;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    for (size_t piece = next++; piece < pieces.size() && !cancelled && !stop; piece = next++) {
      std::vector<int32_t> encoded;
      std::exception_ptr error;
      try {
        encoded = tokenizer.encode(pieces[piece]);
      } catch (...) {
        error = std::current_exception();
      }
      const std::lock_guard lock(mutex);
      tokens[piece] = std::move(encoded);
      errors[piece] = error;
      done[piece] = 1;
      finished.notify_all();
    }
  };
  const size_t threads =
      std::min<size_t>(pieces.size(), std::max(1U, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (size_t thread = 0; thread < threads; ++thread) {
    workers.emplace_back(work);
  }
  std::exception_ptr failure;
  for (size_t piece = 0; piece < pieces.size() && !cancelled && !failure; ++piece) {
    std::vector<int32_t> ready;
    {
      std::unique_lock lock(mutex);
      // A worker that saw `cancelled` leaves its piece undone: wake up to check it too.
      while (done[piece] == 0 && !cancelled) {
        finished.wait_for(lock, std::chrono::milliseconds(50));
      }
      if (done[piece] == 0) {
        break;
      }
      failure = errors[piece];
      ready = std::move(tokens[piece]);
    }
    if (!failure) {
      try {
        consume(piece, std::move(ready));
      } catch (...) {
        failure = std::current_exception();
      }
    }
  }
  stop = true;
  for (std::thread& worker : workers) {
    worker.join();
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
}

std::string encode_chunk(const std::vector<int32_t>& tokens, int width) {
  std::string bytes(tokens.size() * static_cast<size_t>(width), '\0');
  for (size_t index = 0; index < tokens.size(); ++index) {
    const auto value = static_cast<uint32_t>(tokens[index]);
    for (int byte = 0; byte < width; ++byte) {
      bytes[index * static_cast<size_t>(width) + static_cast<size_t>(byte)] =
          static_cast<char>((value >> (8 * byte)) & 0xffU);
    }
  }
  return bytes;
}

std::string absolute(const std::string& path) {
  std::error_code error;
  const auto resolved = std::filesystem::absolute(path, error);
  return error ? path : resolved.lexically_normal().string();
}

// The cache directory of a source: "<file name>-<hash of type, source, tokenizer>".
std::string cache_directory_for(const TokenSourceSpec& spec) {
  const std::string identity =
      spec.dataset_type + "\n" + absolute(spec.path) + "\n" +
      (spec.tokenizer_path.empty() ? "bytes" : absolute(spec.tokenizer_path));
  const std::string name = std::filesystem::path(spec.path).filename().string();
  return (std::filesystem::path(spec.cache_directory) / (name + "-" + hex(fnv1a(identity))))
      .string();
}

UserError corrupted(const std::string& file, const std::string& what) {
  return UserError("dataset_cache_dir: the token cache file '" + file + "' is corrupted (" + what +
                       "); delete its directory to rebuild it",
                   "dataset_cache_dir");
}

// The cache at `directory` if it is complete and matches the source and tokenizer; nullopt with
// `stale` set when it is absent or out of date; UserError when it is corrupted.
std::optional<TokenizedSource> read_cache_index(const TokenSourceSpec& spec,
                                                const std::string& directory,
                                                const Fingerprint& source, std::string& stale) {
  const std::string index_path = directory + "/" + kIndexFile;
  std::error_code error;
  if (!std::filesystem::exists(index_path, error)) {
    return std::nullopt;
  }
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text_file(index_path));
  } catch (const nlohmann::json::exception& parse_error) {
    throw corrupted(index_path, std::string("not JSON: ") + parse_error.what());
  }
  // An index of an earlier format (pieces cut elsewhere, so other tokens) is rebuilt.
  const std::string format =
      index.is_object() && index.contains("format") && index["format"].is_string()
          ? index["format"].get<std::string>()
          : "";
  if (format != kFormat && format.starts_with("tpusim-token-cache-")) {
    stale = "the cache format changed (" + format + ")";
    return std::nullopt;
  }
  if (!index.is_object() || format != kFormat || !index.contains("chunks") ||
      !index["chunks"].is_array() || !index.contains("pieces")) {
    throw corrupted(index_path, std::string("not a ") + kFormat + " index");
  }
  if (index.value("dataset_type", std::string()) != spec.dataset_type) {
    stale = "dataset_type changed";
    return std::nullopt;
  }
  if (!still_matches(spec.path, source, index["source"])) {
    stale = "'" + spec.path + "' changed";
    return std::nullopt;
  }
  const nlohmann::json& tokenizer = index["tokenizer"];
  if (spec.tokenizer_path.empty() != (tokenizer.value("kind", std::string()) == "bytes")) {
    stale = "the tokenizer changed";
    return std::nullopt;
  }
  if (!spec.tokenizer_path.empty() &&
      !still_matches(spec.tokenizer_path, stat_file(spec.tokenizer_path, "tokenizer_path"),
                     tokenizer)) {
    stale = "'" + spec.tokenizer_path + "' changed";
    return std::nullopt;
  }
  const int64_t token_bytes = integer_field(index, "token_bytes").value_or(0);
  if (token_bytes != 2 && token_bytes != 4) {
    throw corrupted(index_path, "token_bytes must be 2 or 4");
  }
  const int width = static_cast<int>(token_bytes);
  std::vector<std::string> paths;
  for (const nlohmann::json& chunk : index["chunks"]) {
    const std::string file = directory + "/" + chunk.value("file", std::string("?"));
    const int64_t tokens = integer_field(chunk, "tokens").value_or(-1);
    const auto expected = static_cast<uintmax_t>(tokens) * static_cast<uintmax_t>(width);
    const uintmax_t bytes = std::filesystem::file_size(file, error);
    if (error) {
      throw corrupted(file, "missing");
    }
    if (tokens < 0 || bytes != expected) {
      throw corrupted(file, std::to_string(bytes) + " bytes, the index records " +
                                std::to_string(expected) + (bytes < expected ? ": truncated" : ""));
    }
    paths.push_back(file);
  }
  TokenizedSource result;
  auto tokens = TokenArray::mapped(paths, width);
  for (size_t chunk = 0; chunk < paths.size(); ++chunk) {
    const TokenArray::Chunk& mapped = tokens->chunks()[chunk];
    const std::string_view bytes(static_cast<const char*>(mapped.data),
                                 static_cast<size_t>(mapped.tokens * width));
    if (hex(content_hash(bytes)) != index["chunks"][chunk].value("hash", std::string())) {
      throw corrupted(paths[chunk], "its content hash differs from the index's");
    }
  }
  result.tokens = std::move(tokens);
  result.pieces = integer_field(index, "pieces").value_or(0);
  // The Dataset sizes its token counts by the vocabulary: an id must fit the token width.
  const int64_t max_pieces = width == 2 ? int64_t{1} << 16 : std::numeric_limits<int32_t>::max();
  if (result.pieces < 1 || result.pieces > max_pieces) {
    throw corrupted(index_path, "pieces must be from 1 to " + std::to_string(max_pieces) +
                                    " for tokens of " + std::to_string(width) + " bytes");
  }
  result.from_cache = true;
  result.cache_path = directory;
  result.note = "dataset: " + std::to_string(result.tokens->size()) +
                " tokens read from the cache " + directory + " (nothing tokenized)";
  return result;
}

// read_cache_index, with a field of the wrong JSON type (a hand-edited or damaged index) a
// corrupted cache like any other.
std::optional<TokenizedSource> read_cache(const TokenSourceSpec& spec, const std::string& directory,
                                          const Fingerprint& source, std::string& stale) {
  try {
    return read_cache_index(spec, directory, source, stale);
  } catch (const nlohmann::json::exception& error) {
    throw corrupted(directory + "/" + kIndexFile, std::string("malformed index: ") + error.what());
  }
}

// Writes a cache as the tokenizer produces it: create() the directory, one chunk file per
// add_chunk(), then finish() writes the index that makes them visible and removes the chunks of an
// older source.
class CacheWriter {
 public:
  CacheWriter(const TokenSourceSpec& spec, std::string directory, Fingerprint source,
              const Tokenizer& tokenizer)
      : spec_(spec),
        directory_(std::move(directory)),
        source_(std::move(source)),
        pieces_(tokenizer.pieces()),
        width_(pieces_ <= kMaxUint16Pieces ? 2 : 4) {}

  void create() const {
    std::error_code error;
    std::filesystem::create_directories(directory_, error);
    if (error) {
      throw UserError("dataset_cache_dir: cannot create '" + directory_ + "': " + error.message(),
                      "dataset_cache_dir");
    }
  }

  void add_chunk(size_t piece, const std::vector<int32_t>& tokens) {
    std::string name = std::to_string(piece);
    name = "chunk-" + source_.hash + "-" + std::string(5 - std::min<size_t>(5, name.size()), '0') +
           name + ".bin";
    const std::string bytes = encode_chunk(tokens, width_);
    write_file_durably(directory_ + "/" + name, bytes);
    chunks_.push_back(
        {{"file", name}, {"tokens", tokens.size()}, {"hash", hex(content_hash(bytes))}});
    names_.push_back(name);
  }

  void finish() const {
    nlohmann::json tokenizer_json = {{"kind", "bytes"}};
    if (!spec_.tokenizer_path.empty()) {
      Fingerprint model = stat_file(spec_.tokenizer_path, "tokenizer_path");
      model.hash = hex(content_hash(read_text_file(spec_.tokenizer_path)));
      tokenizer_json = model.to_json();
      tokenizer_json["kind"] = "sentencepiece";
      tokenizer_json["path"] = absolute(spec_.tokenizer_path);
    }
    nlohmann::json source_json = source_.to_json();
    source_json["path"] = absolute(spec_.path);
    const nlohmann::json index = {{"format", kFormat},     {"dataset_type", spec_.dataset_type},
                                  {"source", source_json}, {"tokenizer", tokenizer_json},
                                  {"pieces", pieces_},     {"token_bytes", width_},
                                  {"chunks", chunks_}};
    // Last: the index makes the chunks visible to readers.
    write_file_durably(directory_ + "/" + kIndexFile, index.dump(1) + "\n");
    // Chunks of an older source are no longer referenced.
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory_, error)) {
      const std::string name = entry.path().filename().string();
      // Only finished chunks (".bin"): another process may be writing its temporaries here.
      if (name.starts_with("chunk-") && name.ends_with(".bin") &&
          std::find(names_.begin(), names_.end(), name) == names_.end()) {
        std::filesystem::remove(entry.path(), error);
      }
    }
  }

 private:
  TokenSourceSpec spec_;
  std::string directory_;
  Fingerprint source_;
  int64_t pieces_;
  int width_;
  nlohmann::json chunks_ = nlohmann::json::array();
  std::vector<std::string> names_;
};

}  // namespace

uint64_t content_hash(std::string_view data, uint64_t seed) {
  std::array<uint64_t, 4> lanes = {seed + kPrime1 + kPrime2, seed + kPrime2, seed, seed - kPrime1};
  const size_t blocks = data.size() / 32;
  for (size_t block = 0; block < blocks; ++block) {
    for (size_t lane = 0; lane < 4; ++lane) {
      uint64_t word = 0;
      std::memcpy(&word, data.data() + block * 32 + lane * 8, 8);
      lanes[lane] = round_hash(lanes[lane], word);
    }
  }
  uint64_t hash = static_cast<uint64_t>(data.size());
  for (const uint64_t lane : lanes) {
    hash = splitmix64(hash ^ lane);
  }
  for (size_t index = blocks * 32; index < data.size(); ++index) {
    hash = splitmix64(hash ^ static_cast<unsigned char>(data[index]));
  }
  return hash;
}

TokenArray::~TokenArray() {
  if (producer_.joinable()) {
    cancelled_ = true;
    producer_.join();
  }
  for (const auto& [address, bytes] : mappings_) {
    ::munmap(address, bytes);
  }
}

void TokenArray::add(Chunk chunk) {
  if (starts_.empty()) {
    starts_.push_back(0);
  }
  starts_.push_back(starts_.back() + chunk.tokens);
  chunks_.push_back(chunk);
  published_ = chunks_.size();
}

std::shared_ptr<TokenArray> TokenArray::growing(size_t expected_chunks, Producer produce) {
  auto array = std::make_shared<TokenArray>();
  // Sized once: readers index these while the producer fills the next slots.
  array->chunks_.resize(expected_chunks);
  array->starts_.assign(expected_chunks + 1, 0);
  array->owned_.reserve(expected_chunks);
  array->complete_ = false;
  TokenArray* self = array.get();
  array->producer_ = std::thread([self, produce = std::move(produce)] {
    std::string note;
    std::exception_ptr failure;
    try {
      note = produce(*self, self->cancelled_);
    } catch (...) {
      failure = std::current_exception();
    }
    const std::lock_guard lock(self->mutex_);
    self->note_ = std::move(note);
    self->failure_ = failure;
    self->complete_ = true;
    self->changed_.notify_all();
  });
  return array;
}

void TokenArray::publish(std::vector<int32_t> tokens) {
  const std::lock_guard lock(mutex_);
  const size_t chunk = published_;
  if (chunk >= chunks_.size()) {
    throw std::logic_error("TokenArray::publish: more chunks than expected");
  }
  owned_.push_back(std::move(tokens));
  const std::vector<int32_t>& stored = owned_.back();
  chunks_[chunk] = {stored.data(), static_cast<int64_t>(stored.size()), 4};
  starts_[chunk + 1] = starts_[chunk] + static_cast<int64_t>(stored.size());
  published_.store(chunk + 1, std::memory_order_release);
  changed_.notify_all();
}

int64_t TokenArray::size() const {
  return starts_.empty() ? 0 : starts_[published_.load(std::memory_order_acquire)];
}

bool TokenArray::complete() const {
  const std::lock_guard lock(mutex_);
  return complete_;
}

int64_t TokenArray::wait_for(int64_t tokens) const {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return complete_ || size() >= tokens; });
  if (failure_) {
    std::rethrow_exception(failure_);
  }
  return size();
}

std::string TokenArray::wait_complete() const {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return complete_; });
  if (failure_) {
    std::rethrow_exception(failure_);
  }
  return note_;
}

std::unique_ptr<TokenArray> TokenArray::in_memory(std::vector<std::vector<int32_t>> pieces) {
  auto array = std::make_unique<TokenArray>();
  array->owned_ = std::move(pieces);
  for (const auto& piece : array->owned_) {
    array->add({piece.data(), static_cast<int64_t>(piece.size()), 4});
  }
  return array;
}

std::unique_ptr<TokenArray> TokenArray::mapped(const std::vector<std::string>& paths, int width) {
  auto array = std::make_unique<TokenArray>();
  for (const std::string& path : paths) {
    const auto bytes = static_cast<size_t>(std::filesystem::file_size(path));
    if (bytes == 0) {
      array->add({nullptr, 0, width});
      continue;
    }
    const int descriptor = ::open(path.c_str(), O_RDONLY);
    if (descriptor < 0) {
      throw corrupted(path, "cannot be opened");
    }
    void* address = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, descriptor, 0);
    ::close(descriptor);
    if (address == MAP_FAILED) {
      throw corrupted(path, "cannot be mapped");
    }
    array->mappings_.emplace_back(address, bytes);
    array->add({address, static_cast<int64_t>(bytes) / width, width});
  }
  return array;
}

int32_t TokenArray::at(int64_t index) const {
  const auto published = static_cast<ptrdiff_t>(published_.load(std::memory_order_acquire));
  const auto after = std::upper_bound(starts_.begin(), starts_.begin() + published + 1, index);
  const auto chunk = static_cast<size_t>(after - starts_.begin() - 1);
  return chunks_[chunk].at(index - starts_[chunk]);
}

int32_t TokenArray::Chunk::at(int64_t index) const {
  if (width == 4) {
    int32_t value = 0;
    std::memcpy(&value, static_cast<const char*>(data) + index * 4, 4);
    return value;
  }
  uint16_t value = 0;
  std::memcpy(&value, static_cast<const char*>(data) + index * 2, 2);
  return value;
}

TokenizedSource load_tokens(const TokenSourceSpec& spec) {
  const bool cached = !spec.cache_directory.empty();
  if (cached) {
    std::error_code error;
    if (std::filesystem::exists(spec.cache_directory, error) &&
        !std::filesystem::is_directory(spec.cache_directory, error)) {
      throw UserError(
          "dataset_cache_dir: '" + spec.cache_directory + "' exists and is not a directory",
          "dataset_cache_dir");
    }
  }
  Fingerprint source = stat_file(spec.path, "dataset_path");
  if (!spec.tokenizer_path.empty()) {
    stat_file(spec.tokenizer_path, "tokenizer_path");  // a directory or a FIFO is exit 2
  }
  const std::string directory = cached ? cache_directory_for(spec) : "";
  std::string stale;
  if (cached) {
    remove_stale_temporaries(directory);  // chunks of a tokenizer killed before their rename
    if (auto hit = read_cache(spec, directory, source, stale)) {
      return std::move(*hit);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto text = std::make_shared<std::string>(read_text_file(spec.path));
  source.hash = hex(content_hash(*text));
  auto tokenizer = std::make_shared<const Tokenizer>(spec.tokenizer_path, spec.path);
  if (spec.dataset_type == "jsonl") {
    *text = read_documents(*text, spec.path);
  }
  auto pieces = std::make_shared<const std::vector<std::string_view>>(cut_pieces(*text));
  std::shared_ptr<CacheWriter> writer;
  if (cached) {
    writer = std::make_shared<CacheWriter>(spec, directory, source, *tokenizer);
    writer->create();  // a directory that cannot be made is exit 2 before training starts
  }
  TokenizedSource result;
  result.pieces = tokenizer->pieces();
  result.cache_path = directory;
  const std::string path = spec.path;
  // `pieces` views `text`: the producer owns both until it is done.
  result.tokens = TokenArray::growing(
      pieces->size(), [=](TokenArray& array, const std::atomic<bool>& cancelled) {
        const std::shared_ptr<std::string> owned_text = text;
        encode_pieces_in_order(*tokenizer, *pieces, cancelled,
                               [&](size_t piece, std::vector<int32_t> tokens) {
                                 if (writer) {
                                   writer->add_chunk(piece, tokens);
                                 }
                                 array.publish(std::move(tokens));
                               });
        if (cancelled) {
          return std::string("dataset: tokenizing stopped early, nothing cached");
        }
        if (writer) {
          writer->finish();
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::ostringstream note;
        note.precision(2);
        note << std::fixed << "dataset: tokenized " << array.size() << " tokens of '" << path
             << "' in " << seconds << " s";
        if (writer) {
          note << ", cached in " << directory;
          if (!stale.empty()) {
            note << " (rebuilt: " << stale << ")";
          }
        }
        return note.str();
      });
  std::ostringstream note;
  note.precision(1);
  note << std::fixed << "dataset: tokenizing '" << spec.path << "' ("
       << static_cast<double>(text->size()) / (1 << 20) << " MiB in " << pieces->size()
       << (pieces->size() == 1 ? " piece" : " pieces")
       << ") in the background; training starts once the first piece is tokenized";
  if (!stale.empty()) {
    note << " (cache rebuilt: " << stale << ")";
  }
  result.note = note.str();
  return result;
}

std::vector<std::string> token_texts(const std::string& tokenizer_path,
                                     const std::vector<int32_t>& tokens) {
  std::vector<std::string> texts;
  if (tokenizer_path.empty()) {
    for (const int32_t token : tokens) {
      texts.push_back(token < kByteVocabulary ? byte_token_text(token)
                                              : "#" + std::to_string(token));
    }
    return texts;
  }
  stat_file(tokenizer_path, "tokenizer_path");
  const Tokenizer tokenizer(tokenizer_path, tokenizer_path);
  for (const int32_t token : tokens) {
    texts.push_back(tokenizer.piece(token));
  }
  return texts;
}

}  // namespace tpusim
