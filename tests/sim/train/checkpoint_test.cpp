// Checkpoints: bitwise round trip, the files are valid safetensors (the header is parsed here
// independently of the writer), state.json records sizes and the checksums `sha256sum` computes,
// an existing checkpoint is replaced whole, latest_checkpoint ignores leftovers of interrupted
// saves, and every kind of damage is a UserError that names the file.
#include "sim/train/checkpoint.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/yaml_text.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kHeaderSizeBytes = 8;

CheckpointTensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    count *= dim;
  }
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  CheckpointTensor tensor{.shape = std::move(shape), .values = {}};
  for (int64_t i = 0; i < count; ++i) {
    tensor.values.push_back(normal(generator));
  }
  return tensor;
}

Checkpoint sample_checkpoint() {
  Checkpoint checkpoint;
  checkpoint.step = 42;
  checkpoint.weights["decoder/layers/mlp.wi#0"] = random_tensor({4, 6}, 1);
  checkpoint.weights["decoder/layers/norm.scale#1"] = random_tensor({6}, 2);
  checkpoint.weights["decoder/empty#0"] = random_tensor({0, 3}, 3);
  checkpoint.weights["embedding/token"] = random_tensor({8, 2, 2}, 4);
  checkpoint.weights["logits/temperature"] = {.shape = {}, .values = {0.5f}};
  // Values that only a bitwise copy keeps: signed zero, infinities, a NaN payload, subnormals.
  std::vector<float>& special = checkpoint.weights["embedding/token"].values;
  special[0] = -0.0f;
  special[1] = std::numeric_limits<float>::infinity();
  special[2] = -std::numeric_limits<float>::infinity();
  special[3] = std::bit_cast<float>(uint32_t{0x7fc01234});
  special[4] = std::numeric_limits<float>::denorm_min();
  special[5] = std::numeric_limits<float>::max();
  checkpoint.optimizer["decoder/layers/mlp.wi#0/mu"] = random_tensor({4, 6}, 5);
  checkpoint.optimizer["decoder/layers/mlp.wi#0/nu"] = random_tensor({4, 6}, 6);
  checkpoint.optimizer["logits/temperature/mu"] = {.shape = {}, .values = {-1e-30f}};
  checkpoint.optimizer["logits/temperature/nu"] = {.shape = {}, .values = {1e30f}};
  checkpoint.metadata = {{"data_position", {{"step", 42}, {"microbatch", 0}}},
                         {"config", {{"model_name", "tiny"}, {"learning_rate", 3e-4}}},
                         {"mesh", {2, 4}},
                         {"note", "caf\xc3\xa9"}};
  return checkpoint;
}

std::vector<uint32_t> bits(const std::vector<float>& values) {
  std::vector<uint32_t> result;
  for (const float value : values) {
    result.push_back(std::bit_cast<uint32_t>(value));
  }
  return result;
}

void expect_same_tensors(const std::map<std::string, CheckpointTensor>& actual,
                         const std::map<std::string, CheckpointTensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    const auto found = actual.find(name);
    ASSERT_NE(found, actual.end()) << name;
    EXPECT_EQ(found->second.shape, tensor.shape) << name;
    EXPECT_EQ(bits(found->second.values), bits(tensor.values)) << name;
  }
}

void expect_same_checkpoint(const Checkpoint& actual, const Checkpoint& expected) {
  EXPECT_EQ(actual.step, expected.step);
  EXPECT_EQ(actual.metadata, expected.metadata);
  expect_same_tensors(actual.weights, expected.weights);
  expect_same_tensors(actual.optimizer, expected.optimizer);
}

std::string read_bytes(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t read_u64_le(const std::string& bytes) {
  uint64_t value = 0;
  for (uint64_t i = 0; i < kHeaderSizeBytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

void write_u64_le(std::string& bytes, uint64_t value) {
  for (uint64_t i = 0; i < kHeaderSizeBytes; ++i) {
    bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

// Parses a .safetensors file by the specification, without the code under test, and checks it
// holds exactly `expected`.
void expect_valid_safetensors(const fs::path& path,
                              const std::map<std::string, CheckpointTensor>& expected) {
  SCOPED_TRACE(path.string());
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), kHeaderSizeBytes);
  const uint64_t header_size = read_u64_le(bytes);
  ASSERT_LE(header_size, bytes.size() - kHeaderSizeBytes);
  EXPECT_EQ(header_size % 8, 0u) << "header padded to a multiple of 8 bytes";
  const std::string header_text = bytes.substr(kHeaderSizeBytes, header_size);
  ASSERT_FALSE(header_text.empty());
  EXPECT_EQ(header_text.front(), '{');
  EXPECT_EQ(header_text[header_text.find_last_not_of(' ')], '}') << "padding is spaces only";

  // ordered_json keeps the order of the file: the data must follow the order of the JSON.
  const nlohmann::ordered_json header = nlohmann::ordered_json::parse(header_text);
  ASSERT_TRUE(header.is_object());
  ASSERT_TRUE(header.contains("__metadata__"));
  EXPECT_EQ(header["__metadata__"], nlohmann::ordered_json({{"format", "pt"}}));
  const uint64_t data_begin = kHeaderSizeBytes + header_size;
  const uint64_t data_size = bytes.size() - data_begin;
  uint64_t position = 0;
  size_t tensors = 0;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      continue;
    }
    SCOPED_TRACE(name);
    ++tensors;
    const auto found = expected.find(name);
    ASSERT_NE(found, expected.end()) << "unexpected tensor";
    const CheckpointTensor& tensor = found->second;
    EXPECT_EQ(info.at("dtype"), "F32");
    EXPECT_EQ(info.at("shape").get<std::vector<int64_t>>(), tensor.shape);
    ASSERT_EQ(info.at("data_offsets").size(), 2u);
    const auto begin = info.at("data_offsets")[0].get<uint64_t>();
    const auto end = info.at("data_offsets")[1].get<uint64_t>();
    EXPECT_EQ(begin, position) << "tensors contiguous in the order of the JSON";
    ASSERT_EQ(end - begin, 4 * tensor.values.size());
    ASSERT_LE(end, data_size);
    for (size_t i = 0; i < tensor.values.size(); ++i) {
      uint32_t word = 0;
      for (uint64_t byte = 0; byte < 4; ++byte) {
        word |= static_cast<uint32_t>(
                    static_cast<unsigned char>(bytes[data_begin + begin + 4 * i + byte]))
                << (8 * byte);
      }
      EXPECT_EQ(word, std::bit_cast<uint32_t>(tensor.values[i])) << "element " << i;
    }
    position = end;
  }
  EXPECT_EQ(tensors, expected.size());
  EXPECT_EQ(position, data_size) << "the data section holds exactly the tensors";
}

// `sha256sum <path>`, or "" where the tool is not installed.
std::string sha256sum(const fs::path& path) {
  const std::string command = "sha256sum '" + path.string() + "' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return "";
  }
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    output += buffer;
  }
  ::pclose(pipe);
  return output.size() >= 64 ? output.substr(0, 64) : "";
}

void expect_user_error(const std::function<void()>& action,
                       std::initializer_list<std::string> fragments) {
  try {
    action();
    ADD_FAILURE() << "expected UserError";
  } catch (const UserError& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "'" << fragment << "' not in: " << message;
    }
  }
}

std::vector<std::string> entries_of(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test_name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    root_ = fs::temp_directory_path() /
            ("tpusim_checkpoint_test_" + test_name + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A saved sample checkpoint; returns its directory.
  std::string saved_sample() {
    const std::string directory = (root_ / "checkpoint").string();
    save_checkpoint(directory, sample_checkpoint());
    return directory;
  }

  fs::path root_;
};

TEST_F(CheckpointTest, RoundTripIsBitwiseExact) {
  const Checkpoint original = sample_checkpoint();
  const std::string directory = (root_ / "run" / "checkpoints" / "42").string();
  save_checkpoint(directory, original);  // creates the parent directories
  expect_same_checkpoint(load_checkpoint(directory), original);
  EXPECT_EQ(entries_of(directory),
            (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));
  EXPECT_EQ(entries_of(root_ / "run" / "checkpoints"), std::vector<std::string>{"42"})
      << "no temporary directory left behind";
}

TEST_F(CheckpointTest, EmptyCheckpointRoundTrips) {
  Checkpoint empty;
  const std::string directory = (root_ / "empty").string();
  save_checkpoint(directory, empty);
  expect_same_checkpoint(load_checkpoint(directory), empty);
  expect_valid_safetensors(fs::path(directory) / "model.safetensors", {});
}

TEST_F(CheckpointTest, FilesAreValidSafetensorsAndStateRecordsThem) {
  const Checkpoint original = sample_checkpoint();
  const fs::path directory = saved_sample();
  expect_valid_safetensors(directory / "model.safetensors", original.weights);
  expect_valid_safetensors(directory / "optimizer.safetensors", original.optimizer);

  const nlohmann::json state = nlohmann::json::parse(read_bytes(directory / "state.json"));
  EXPECT_EQ(state.at("step"), 42);
  EXPECT_EQ(state.at("metadata"), original.metadata);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(file);
    const nlohmann::json& record = state.at("files").at(file);
    EXPECT_EQ(record.at("bytes").get<uint64_t>(), fs::file_size(directory / file));
    const std::string checksum = record.at("sha256").get<std::string>();
    EXPECT_EQ(checksum.size(), 64u);
    if (const std::string reference = sha256sum(directory / file); !reference.empty()) {
      EXPECT_EQ(checksum, reference);
    }
  }
}

TEST_F(CheckpointTest, OverwriteReplacesTheWholeCheckpoint) {
  const std::string directory = saved_sample();
  Checkpoint newer;
  newer.step = 43;
  newer.weights["only/tensor"] = random_tensor({3, 5}, 9);
  newer.optimizer["only/tensor/mu"] = random_tensor({3, 5}, 10);
  newer.optimizer["only/tensor/nu"] = random_tensor({3, 5}, 11);
  newer.metadata = {{"data_position", 43}};
  save_checkpoint(directory + "/", newer);  // a trailing slash names the same directory
  expect_same_checkpoint(load_checkpoint(directory), newer);

  newer.step = 44;
  save_checkpoint(directory, newer);
  EXPECT_EQ(load_checkpoint(directory).step, 44);
  EXPECT_EQ(entries_of(root_), std::vector<std::string>{"checkpoint"})
      << "neither the temporary nor the replaced checkpoint is left behind";
}

TEST_F(CheckpointTest, InconsistentCheckpointIsRejectedBeforeAnythingIsWritten) {
  const std::string directory = saved_sample();
  Checkpoint bad = sample_checkpoint();
  bad.weights["decoder/layers/norm.scale#1"].shape = {7};  // 6 values
  EXPECT_THROW(save_checkpoint(directory, bad), std::logic_error);
  expect_same_checkpoint(load_checkpoint(directory), sample_checkpoint());
  EXPECT_EQ(entries_of(root_), std::vector<std::string>{"checkpoint"});
}

TEST_F(CheckpointTest, UnwritableLocationIsUserError) {
  write_bytes(root_ / "a_file", "not a directory");
  const std::string directory = (root_ / "a_file" / "checkpoint").string();
  expect_user_error([&] { save_checkpoint(directory, sample_checkpoint()); },
                    {(root_ / "a_file").string()});
}

TEST_F(CheckpointTest, LatestCheckpointPicksTheHighestCompleteStep) {
  const std::string run = (root_ / "run").string();
  EXPECT_EQ(latest_checkpoint(run), "") << "no run directory yet";
  EXPECT_EQ(checkpoint_directory(run, 20), run + "/checkpoints/20");

  Checkpoint checkpoint = sample_checkpoint();
  for (const int64_t step : {5, 20, 100}) {  // "5" > "20" > "100" as text: order is numeric
    checkpoint.step = step;
    save_checkpoint(checkpoint_directory(run, step), checkpoint);
  }
  EXPECT_EQ(latest_checkpoint(run), checkpoint_directory(run, 100));

  // Leftovers that are not complete checkpoints: an interrupted save (complete files, but never
  // renamed into place), a step directory without all its files, a stray file.
  const fs::path checkpoints = fs::path(run) / "checkpoints";
  fs::copy(checkpoint_directory(run, 100), checkpoints / "300.tmp.4242");
  fs::copy(checkpoint_directory(run, 100), checkpoints / "250.old.4242");
  fs::create_directories(checkpoints / "200");
  fs::copy_file(fs::path(checkpoint_directory(run, 100)) / "model.safetensors",
                checkpoints / "200" / "model.safetensors");
  write_bytes(checkpoints / "400", "a file, not a directory");
  EXPECT_EQ(latest_checkpoint(run), checkpoint_directory(run, 100));
  EXPECT_EQ(load_checkpoint(latest_checkpoint(run)).step, 100);
}

// A save removes leftovers of saves whose process is gone ("<step>.tmp.<pid>", "<step>.old.<pid>")
// and keeps a live process's; resuming past an incomplete newer step says so on stderr.
TEST_F(CheckpointTest, StaleLeftoversAreRemovedAndIncompleteStepsReported) {
  const std::string run = (root_ / "run").string();
  Checkpoint checkpoint = sample_checkpoint();
  checkpoint.step = 10;
  save_checkpoint(checkpoint_directory(run, 10), checkpoint);
  const fs::path checkpoints = fs::path(run) / "checkpoints";
  const std::string dead = std::to_string(std::numeric_limits<pid_t>::max() - 1);  // no such pid
  const std::string live = std::to_string(::getppid());
  for (const std::string& name : {"30.tmp." + dead, "30.old." + dead, "40.tmp." + live}) {
    fs::create_directories(checkpoints / name);
  }
  fs::create_directories(checkpoints / "20");  // a step whose files never arrived
  testing::internal::CaptureStderr();
  EXPECT_EQ(latest_checkpoint(run), checkpoint_directory(run, 10));
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("checkpoints/20' is incomplete"), std::string::npos) << said;
  EXPECT_NE(said.find("resuming from step 10"), std::string::npos) << said;
  checkpoint.step = 11;
  save_checkpoint(checkpoint_directory(run, 11), checkpoint);
  EXPECT_EQ(entries_of(checkpoints),
            (std::vector<std::string>{"10", "11", "20", "40.tmp." + live}));
}

// state.json's step must be the step its directory names (checkpoints/<step>), and small enough
// that step + 1 cannot overflow: an edited or copied state.json is refused, not resumed.
TEST_F(CheckpointTest, StepThatDisagreesWithItsDirectoryOrOverflowsIsUserError) {
  const fs::path directory = root_ / "run" / "checkpoints" / "20";
  save_checkpoint(directory.string(), sample_checkpoint());  // records step 42
  expect_user_error([&] { load_checkpoint(directory.string()); },
                    {"state.json", "step 42", "directory is step 20"});
  expect_user_error([&] { load_checkpoint(directory.string() + "/"); }, {"directory is step 20"});

  const fs::path huge = root_ / "huge";
  save_checkpoint(huge.string(), sample_checkpoint());
  const fs::path state = huge / "state.json";
  nlohmann::json json = nlohmann::json::parse(read_text_file(state.string()));
  json["step"] = std::numeric_limits<int64_t>::max();
  write_bytes(state, json.dump());
  expect_user_error([&] { load_checkpoint(huge.string()); }, {"state.json", "2^40"});
}

TEST_F(CheckpointTest, MissingDirectoryIsUserErrorNamingIt) {
  const std::string directory = (root_ / "no_such_checkpoint").string();
  expect_user_error([&] { load_checkpoint(directory); }, {directory, "does not exist"});
}

TEST_F(CheckpointTest, MissingFileIsUserErrorNamingIt) {
  const fs::path directory = saved_sample();
  fs::remove(directory / "optimizer.safetensors");
  expect_user_error([&] { load_checkpoint(directory.string()); },
                    {(directory / "optimizer.safetensors").string(), "missing"});
}

TEST_F(CheckpointTest, TruncatedFileIsUserError) {
  const fs::path directory = saved_sample();
  const fs::path model = directory / "model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 10);
  expect_user_error([&] { load_checkpoint(directory.string()); }, {model.string(), "truncated"});
}

TEST_F(CheckpointTest, CorruptedDataIsChecksumError) {
  const fs::path directory = saved_sample();
  const fs::path model = directory / "model.safetensors";
  std::string bytes = read_bytes(model);
  const uint64_t data_begin = kHeaderSizeBytes + read_u64_le(bytes);
  bytes[data_begin + (bytes.size() - data_begin) / 2] ^= 0x10;
  write_bytes(model, bytes);
  expect_user_error([&] { load_checkpoint(directory.string()); },
                    {model.string(), "checksum mismatch"});
}

TEST_F(CheckpointTest, HeaderSizeLargerThanTheFileIsUserError) {
  const fs::path directory = saved_sample();
  const fs::path model = directory / "model.safetensors";
  std::string bytes = read_bytes(model);
  write_u64_le(bytes, bytes.size() + 100);
  write_bytes(model, bytes);
  expect_user_error([&] { load_checkpoint(directory.string()); },
                    {model.string(), "header size", "larger than the file"});
}

TEST_F(CheckpointTest, GarbageHeaderIsUserError) {
  const fs::path directory = saved_sample();
  const fs::path model = directory / "optimizer.safetensors";
  std::string bytes = read_bytes(model);
  const uint64_t header_size = read_u64_le(bytes);
  const std::string garbage = "{this is not JSON";
  bytes.replace(kHeaderSizeBytes, header_size,
                garbage + std::string(header_size - garbage.size(), '#'));
  write_bytes(model, bytes);
  expect_user_error([&] { load_checkpoint(directory.string()); },
                    {model.string(), "bad safetensors header", "not valid JSON"});
}

// A number too large for a double is nlohmann's out_of_range, not a parse_error: it must still be
// a UserError, in a safetensors header and in state.json (found by fuzz/checkpoint_fuzz.cpp).
TEST_F(CheckpointTest, NumberTooLargeForADoubleIsUserError) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1e3082],"data_offsets":[0,0]}})";
  std::string bytes(kHeaderSizeBytes, '\0');
  write_u64_le(bytes, header.size());
  bytes += header;
  expect_user_error([&] { decode_safetensors("big.safetensors", bytes); },
                    {"big.safetensors", "bad safetensors header", "not valid JSON"});

  const fs::path directory = saved_sample();
  write_bytes(directory / "state.json", R"({"step": 1e400, "files": {}})");
  expect_user_error([&] { load_checkpoint(directory.string()); }, {"state.json", "not valid JSON"});
}

// A tensor named "" decoded, but save_checkpoint refuses the name (std::logic_error): a resumed
// run could not save. The reader refuses it too (found by fuzz/checkpoint_fuzz.cpp's round trip).
TEST_F(CheckpointTest, EmptyTensorNameIsUserError) {
  const std::string header = R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string bytes(kHeaderSizeBytes, '\0');
  write_u64_le(bytes, header.size());
  bytes += header + std::string(4, '\0');
  expect_user_error([&] { decode_safetensors("unnamed.safetensors", bytes); },
                    {"unnamed.safetensors", "empty name"});
}

TEST_F(CheckpointTest, UnsupportedDtypeIsUserError) {
  const fs::path directory = saved_sample();
  const fs::path model = directory / "model.safetensors";
  std::string bytes = read_bytes(model);
  const size_t dtype = bytes.find("\"F32\"");
  ASSERT_NE(dtype, std::string::npos);
  bytes.replace(dtype, 5, "\"F64\"");
  write_bytes(model, bytes);
  expect_user_error([&] { load_checkpoint(directory.string()); },
                    {model.string(), "unsupported dtype 'F64'"});
}

}  // namespace
}  // namespace tpusim
