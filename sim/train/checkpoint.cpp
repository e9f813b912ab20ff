// Checkpoints: safetensors encoding and decoding, SHA-256 checksums, and the atomic directory
// swap. See checkpoint.h for the layout.
#include "sim/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/error.h"
#include "common/process.h"
#include "sim/train/safetensors.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian: this code copies floats as they are in memory");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";

// --- SHA-256 (FIPS 180-4), so the checksums in state.json match `sha256sum`. ---

constexpr std::array<uint32_t, 64> kSha256RoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

void sha256_compress(std::array<uint32_t, 8>& state, const unsigned char* block) {
  std::array<uint32_t, 64> w{};
  for (size_t i = 0; i < 16; ++i) {
    w[i] = static_cast<uint32_t>(block[4 * i]) << 24 |
           static_cast<uint32_t>(block[4 * i + 1]) << 16 |
           static_cast<uint32_t>(block[4 * i + 2]) << 8 | static_cast<uint32_t>(block[4 * i + 3]);
  }
  for (size_t i = 16; i < 64; ++i) {
    const uint32_t s0 = std::rotr(w[i - 15], 7) ^ std::rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = std::rotr(w[i - 2], 17) ^ std::rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (size_t i = 0; i < 64; ++i) {
    const uint32_t sum1 = std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t temp1 = h + sum1 + choose + kSha256RoundConstants[i] + w[i];
    const uint32_t sum0 = std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t temp2 = sum0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + temp1;
    d = c;
    c = b;
    b = a;
    a = temp1 + temp2;
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
  state[4] += e;
  state[5] += f;
  state[6] += g;
  state[7] += h;
}

std::string sha256_hex(std::string_view data) {
  std::array<uint32_t, 8> state = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const size_t full_blocks = data.size() / 64;
  for (size_t block = 0; block < full_blocks; ++block) {
    sha256_compress(state, bytes + 64 * block);
  }
  // Padding: 0x80, zeros, then the message length in bits as a big-endian uint64.
  std::array<unsigned char, 128> tail{};
  const size_t remainder = data.size() - 64 * full_blocks;
  std::memcpy(tail.data(), bytes + 64 * full_blocks, remainder);
  tail[remainder] = 0x80;
  const size_t tail_size = remainder + 1 + 8 <= 64 ? 64 : 128;
  const uint64_t bit_length = static_cast<uint64_t>(data.size()) * 8;
  for (size_t i = 0; i < 8; ++i) {
    tail[tail_size - 1 - i] = static_cast<unsigned char>(bit_length >> (8 * i));
  }
  for (size_t offset = 0; offset < tail_size; offset += 64) {
    sha256_compress(state, tail.data() + offset);
  }
  static constexpr char kHexDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(64);
  for (const uint32_t word : state) {
    for (int shift = 28; shift >= 0; shift -= 4) {
      hex += kHexDigits[(word >> shift) & 0xf];
    }
  }
  return hex;
}

// --- Files. ---

UserError file_error(const fs::path& path, const std::string& problem) {
  return UserError("checkpoint file '" + path.string() + "': " + problem);
}

std::string errno_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

// Writes `content` to a new file and fsyncs it before returning.
void write_synced_file(const fs::path& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw file_error(path, "cannot create: " + errno_text(errno));
  }
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t count = ::write(fd, content.data() + written, content.size() - written);
    if (count < 0) {
      if (errno == EINTR) {
        continue;
      }
      const int error = errno;
      ::close(fd);
      throw file_error(path, "write failed: " + errno_text(error));
    }
    written += static_cast<size_t>(count);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    throw file_error(path, "fsync failed: " + errno_text(error));
  }
  if (::close(fd) != 0) {
    throw file_error(path, "close failed: " + errno_text(errno));
  }
}

// Makes the entries of a directory (new files, renames) durable.
void sync_directory(const fs::path& directory) {
  const fs::path path = directory.empty() ? fs::path(".") : directory;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw UserError("cannot open checkpoint directory '" + path.string() +
                    "' to sync it: " + errno_text(errno));
  }
  // Some file systems do not support fsync on a directory (EINVAL): nothing more can be done.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int error = errno;
    ::close(fd);
    throw UserError("cannot sync checkpoint directory '" + path.string() +
                    "': " + errno_text(error));
  }
  ::close(fd);
}

std::string read_whole_file(const fs::path& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) {
    throw file_error(path, "missing");
  }
  if (error) {
    throw file_error(path, "cannot access: " + error.message());
  }
  if (!fs::is_regular_file(status)) {
    throw file_error(path, "not a regular file");
  }
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    throw file_error(path, "cannot open for reading");
  }
  std::string content;
  char buffer[1 << 16];
  while (stream.read(buffer, sizeof(buffer)) || stream.gcount() > 0) {
    content.append(buffer, static_cast<size_t>(stream.gcount()));
  }
  if (stream.bad()) {
    throw file_error(path, "read failed");
  }
  return content;
}

std::string process_suffix(const char* kind) {
  return std::string(".") + kind + "." + std::to_string(::getpid());
}

// Renames the complete checkpoint `temporary` to `target`, replacing a checkpoint already there.
void move_into_place(const fs::path& temporary, const fs::path& target) {
  if (::rename(temporary.c_str(), target.c_str()) == 0) {
    return;  // there was no checkpoint at `target` (or only an empty directory)
  }
  if (errno != EEXIST && errno != ENOTEMPTY) {
    throw UserError("cannot move checkpoint into place at '" + target.string() +
                    "': " + errno_text(errno));
  }
  std::error_code ignored;
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  // Swap the two directories in one step, then delete the old checkpoint (now at `temporary`).
  if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(temporary, ignored);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) {
    throw UserError("cannot replace the checkpoint at '" + target.string() +
                    "': " + errno_text(errno));
  }
#endif
  // No atomic swap on this file system: move the old checkpoint aside, then the new one in.
  const fs::path old = target.string() + process_suffix("old");
  fs::remove_all(old, ignored);
  if (::rename(target.c_str(), old.c_str()) != 0) {
    throw UserError("cannot replace the checkpoint at '" + target.string() +
                    "': " + errno_text(errno));
  }
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::rename(old.c_str(), target.c_str());
    throw UserError("cannot move checkpoint into place at '" + target.string() +
                    "': " + errno_text(error));
  }
  fs::remove_all(old, ignored);
}

// --- safetensors. ---

template <typename Json>
std::string dump_json(const Json& json, int indent, const std::string& what) {
  try {
    return json.dump(indent);
  } catch (const nlohmann::json::type_error& error) {
    throw std::logic_error("save_checkpoint: " + what + " is not valid UTF-8: " + error.what());
  }
}

// state.json's own fields (step, metadata, files), hashed: an edited state.json (a step, a
// metrics line) is refused by name instead of failing later wherever the field is read. A
// state.json without it was written before tpusim recorded one and is read as it is.
constexpr const char* kFieldsChecksum = "fields_sha256";

std::string fields_checksum(const nlohmann::json& state) {
  nlohmann::json fields = nlohmann::json::object();
  for (const char* key : {"step", "metadata", "files"}) {
    if (state.contains(key)) {
      fields[key] = state[key];
    }
  }
  return sha256_hex(dump_json(fields, -1, "the metadata"));
}

nlohmann::json file_record(std::string_view content) {
  return {{"bytes", content.size()}, {"sha256", sha256_hex(content)}};
}

// Reads one .safetensors file of a checkpoint and checks it against its record in state.json.
std::map<std::string, CheckpointTensor> load_tensor_file(const fs::path& directory,
                                                         const char* file_name,
                                                         const nlohmann::json& files) {
  const fs::path state_path = directory / kStateFile;
  const fs::path path = directory / file_name;
  const auto record = files.find(file_name);
  if (record == files.end() || !record->is_object() || !record->contains("bytes") ||
      !(*record)["bytes"].is_number_unsigned() || !record->contains("sha256") ||
      !(*record)["sha256"].is_string()) {
    throw file_error(state_path, std::string("no {\"bytes\", \"sha256\"} record for ") + file_name);
  }
  const auto expected_bytes = (*record)["bytes"].get<uint64_t>();
  const auto expected_sha256 = (*record)["sha256"].get<std::string>();

  const std::string content = read_whole_file(path);
  if (content.size() < expected_bytes) {
    throw file_error(path, "truncated: " + std::to_string(content.size()) + " bytes, " +
                               kStateFile + " records " + std::to_string(expected_bytes));
  }
  if (content.size() > expected_bytes) {
    throw file_error(path, std::to_string(content.size()) + " bytes, but " + kStateFile +
                               " records " + std::to_string(expected_bytes) +
                               " (the file was changed after the checkpoint was written)");
  }
  const std::string actual_sha256 = sha256_hex(content);
  std::map<std::string, CheckpointTensor> tensors;
  try {
    tensors = decode_safetensors(path.string(), content);
  } catch (const UserError& error) {
    if (actual_sha256 == expected_sha256) {
      throw;
    }
    throw UserError(std::string(error.what()) +
                    " (and its sha256 differs from state.json's: the file is corrupted)");
  }
  if (actual_sha256 != expected_sha256) {
    throw file_error(path, "checksum mismatch: sha256 " + actual_sha256 + ", " + kStateFile +
                               " records " + expected_sha256 + " (the file is corrupted)");
  }
  return tensors;
}

// What keeps `directory` from being a complete checkpoint ("" when nothing does): a file that is
// missing, that is not a regular file, or that this process cannot read.
std::string checkpoint_problem(const fs::path& directory) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    return error ? "cannot be opened (" + error.message() + ")" : "is not a directory";
  }
  for (const char* file : {kModelFile, kOptimizerFile, kStateFile}) {
    const fs::path path = directory / file;
    const fs::file_status status = fs::status(path, error);
    if (error && error != std::errc::no_such_file_or_directory) {
      return std::string("cannot read ") + file + " (" + error.message() + ")";
    }
    if (!fs::exists(status)) {
      return std::string("is incomplete (") + file + " is missing)";
    }
    if (!fs::is_regular_file(status)) {
      return std::string("is damaged (") + file + " is not a regular file)";
    }
    if (::access(path.c_str(), R_OK) != 0) {
      return std::string("cannot read ") + file + " (" + std::strerror(errno) + ")";
    }
  }
  return "";
}

// Removes "<step>.tmp.<pid>" and "<step>.old.<pid>" directories beside `target` left by a save
// whose process no longer runs (killed mid-write): a live writer's are kept.
void remove_stale_leftovers(const fs::path& parent) {
  std::error_code error;
  fs::directory_iterator entry(parent, error);
  std::vector<fs::path> stale;
  for (; !error && entry != fs::directory_iterator(); entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    for (const char* kind : {".tmp.", ".old."}) {
      const size_t at = name.find(kind);
      if (at == std::string::npos || at == 0 || name.find_first_not_of("0123456789") != at) {
        continue;
      }
      const std::string pid_text = name.substr(at + std::strlen(kind));
      int64_t pid = 0;
      const auto [end, parse_error] =
          std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
      if (parse_error != std::errc() || end != pid_text.data() + pid_text.size()) {
        continue;
      }
      if (process_has_exited(pid) || pid == ::getpid()) {
        stale.push_back(entry->path());
      }
    }
  }
  for (const fs::path& path : stale) {
    fs::remove_all(path, error);  // best effort: a leftover that stays is only disk space
  }
}

}  // namespace

void save_checkpoint(const std::string& directory, const Checkpoint& checkpoint) {
  if (checkpoint.step < 0) {
    throw std::logic_error("save_checkpoint: negative step " + std::to_string(checkpoint.step));
  }
  if (directory.empty()) {
    throw UserError("save_checkpoint: empty checkpoint directory");
  }
  fs::path target(directory);
  if (!target.has_filename()) {
    target = target.parent_path();  // "run/checkpoints/5/" -> "run/checkpoints/5"
  }

  const std::string model = encode_safetensors(checkpoint.weights);
  const std::string optimizer = encode_safetensors(checkpoint.optimizer);
  nlohmann::json state = {
      {"step", checkpoint.step},
      {"metadata", checkpoint.metadata},
      {"files", {{kModelFile, file_record(model)}, {kOptimizerFile, file_record(optimizer)}}}};
  state[kFieldsChecksum] = fields_checksum(state);
  const std::string state_text = dump_json(state, 2, "the metadata") + "\n";

  std::error_code error;
  const fs::path parent = target.parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, error);
    if (error) {
      throw UserError("cannot create checkpoint directory '" + parent.string() +
                      "': " + error.message());
    }
  }
  remove_stale_leftovers(parent.empty() ? fs::path(".") : parent);
  const fs::path temporary = target.string() + process_suffix("tmp");
  if (!fs::create_directory(temporary, error) || error) {
    throw UserError("cannot create checkpoint directory '" + temporary.string() +
                    "': " + (error ? error.message() : "it already exists"));
  }
  try {
    write_synced_file(temporary / kModelFile, model);
    write_synced_file(temporary / kOptimizerFile, optimizer);
    write_synced_file(temporary / kStateFile, state_text);  // last: it marks the files complete
    sync_directory(temporary);
    move_into_place(temporary, target);
  } catch (...) {
    fs::remove_all(temporary, error);
    throw;
  }
  sync_directory(parent);
}

Checkpoint load_checkpoint(const std::string& directory) {
  const fs::path path(directory);
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    throw UserError("checkpoint directory '" + directory + "' " +
                    (fs::exists(path, error) ? "is not a directory" : "does not exist"));
  }
  const fs::path state_path = path / kStateFile;
  const std::string state_text = read_whole_file(state_path);
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(state_text);
  } catch (const nlohmann::json::exception& parse_error) {
    // parse_error, and out_of_range for a number too large for a double ("1e400").
    throw file_error(state_path, std::string("not valid JSON: ") + parse_error.what());
  }
  // Steps stay far below int64's end, so that step + 1 and step x tokens cannot overflow.
  constexpr uint64_t kMaxStep = uint64_t{1} << 40;
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_unsigned() ||
      state["step"].get<uint64_t>() > kMaxStep) {
    throw file_error(state_path, "no integer \"step\" from 0 to 2^40");
  }
  // A checkpoint written by tpusim lives in checkpoints/<step>: a step that disagrees with its
  // directory (a copied or edited state.json) would resume at the wrong place.
  fs::path named = path.lexically_normal();
  if (named.filename().empty()) {
    named = named.parent_path();
  }
  const std::string name = named.filename().string();
  const bool step_directory =
      !name.empty() && name.find_first_not_of("0123456789") == std::string::npos;
  if (step_directory && name != std::to_string(state["step"].get<uint64_t>())) {
    throw file_error(state_path, "says step " + std::to_string(state["step"].get<uint64_t>()) +
                                     " but its directory is step " + name);
  }
  if (!state.contains("files") || !state["files"].is_object()) {
    throw file_error(state_path, "no \"files\" object");
  }
  if (state.contains(kFieldsChecksum) &&
      (!state[kFieldsChecksum].is_string() ||
       state[kFieldsChecksum].get<std::string>() != fields_checksum(state))) {
    throw file_error(state_path,
                     "was edited after tpusim wrote it (its step, metadata or files no longer "
                     "match its fields_sha256)");
  }

  Checkpoint checkpoint;
  checkpoint.step = static_cast<int64_t>(state["step"].get<uint64_t>());
  checkpoint.metadata = state.value("metadata", nlohmann::json());
  checkpoint.weights = load_tensor_file(path, kModelFile, state["files"]);
  checkpoint.optimizer = load_tensor_file(path, kOptimizerFile, state["files"]);
  return checkpoint;
}

std::string checkpoint_directory(const std::string& run_directory, int64_t step) {
  if (step < 0) {
    throw std::logic_error("checkpoint_directory: negative step " + std::to_string(step));
  }
  return (fs::path(run_directory) / "checkpoints" / std::to_string(step)).string();
}

std::string latest_checkpoint(const std::string& run_directory) {
  const fs::path checkpoints = fs::path(run_directory) / "checkpoints";
  std::error_code error;
  if (!fs::is_directory(checkpoints, error)) {
    return "";
  }
  int64_t latest = -1;
  int64_t latest_incomplete = -1;
  std::string latest_problem;
  fs::directory_iterator entry(checkpoints, error);
  for (; !error && entry != fs::directory_iterator(); entry.increment(error)) {
    // Only canonical step numbers: "<step>.tmp.<pid>", "007" or "notes" are not checkpoints.
    const std::string name = entry->path().filename().string();
    int64_t step = -1;
    const auto [end, parse_error] = std::from_chars(name.data(), name.data() + name.size(), step);
    if (parse_error != std::errc() || end != name.data() + name.size() || step < 0 ||
        std::to_string(step) != name) {
      continue;
    }
    if (const std::string problem = checkpoint_problem(entry->path()); problem.empty()) {
      latest = std::max(latest, step);
    } else if (step > latest_incomplete) {
      latest_incomplete = step;
      latest_problem = problem;
    }
  }
  if (error) {
    throw UserError("cannot list checkpoints in '" + checkpoints.string() +
                    "': " + error.message());
  }
  if (latest_incomplete > latest) {
    // Said, not skipped in silence: the user may have expected to resume from there.
    std::cerr << "tpusim: checkpoint '" << checkpoint_directory(run_directory, latest_incomplete)
              << "' " << latest_problem << "; "
              << (latest < 0 ? std::string("starting from step 1")
                             : "resuming from step " + std::to_string(latest))
              << "\n";
  }
  return latest < 0 ? "" : checkpoint_directory(run_directory, latest);
}

}  // namespace tpusim
