// Safetensors encoding and decoding. See safetensors.h.
#include "sim/train/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tpusim {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian: this code copies floats as they are in memory");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

constexpr uint64_t kHeaderSizeBytes = 8;  // the little-endian uint64 before the JSON header

UserError file_error(const std::string& path, const std::string& problem) {
  return UserError("safetensors file '" + path + "': " + problem);
}

// Bytes per element of a supported dtype, 0 for any other.
uint64_t element_bytes(const std::string& dtype) {
  if (dtype == "F32") {
    return 4;
  }
  if (dtype == "BF16" || dtype == "F16") {
    return 2;
  }
  return 0;
}

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// IEEE half -> float, subnormals, infinities and NaN included.
float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) {
    return std::bit_cast<float>(sign);
  }
  // Subnormal half: value = mantissa x 2^-24.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign != 0 ? -magnitude : magnitude;
}

uint64_t element_count(const std::string& name, const CheckpointTensor& tensor) {
  uint64_t count = 1;
  for (const int64_t dim : tensor.shape) {
    if (dim < 0) {
      throw std::logic_error("save_checkpoint: tensor '" + name + "' has a negative dimension");
    }
    const auto size = static_cast<uint64_t>(dim);
    if (size != 0 && count > std::numeric_limits<uint64_t>::max() / size) {
      throw std::logic_error("save_checkpoint: tensor '" + name + "' has too many elements");
    }
    count *= size;
  }
  return count;
}

}  // namespace

namespace {

// float -> bfloat16 bits, rounded to nearest even (torch's rounding); NaN stays a quiet NaN.
uint16_t float_to_bf16(float value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace

std::string encode_safetensors(const std::map<std::string, CheckpointTensor>& tensors,
                               bool bfloat16) {
  const uint64_t width = bfloat16 ? 2 : sizeof(float);
  // The JSON lists the tensors in map order and the data follows in the same order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") {
      throw std::logic_error("save_checkpoint: invalid tensor name '" + name + "'");
    }
    if (element_count(name, tensor) != tensor.values.size()) {
      throw std::logic_error("save_checkpoint: tensor '" + name + "' has " +
                             std::to_string(tensor.values.size()) +
                             " values, which does not match its shape");
    }
    const uint64_t bytes = tensor.values.size() * width;
    header[name] = {{"dtype", bfloat16 ? "BF16" : "F32"},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text;
  try {
    header_text = header.dump(-1);
  } catch (const nlohmann::json::type_error& error) {
    throw std::logic_error(std::string("safetensors: a tensor name is not valid UTF-8: ") +
                           error.what());
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(kHeaderSizeBytes + header_text.size() + offset);
  const uint64_t header_size = header_text.size();
  for (uint64_t i = 0; i < kHeaderSizeBytes; ++i) {
    out += static_cast<char>((header_size >> (8 * i)) & 0xff);
  }
  out += header_text;
  for (const auto& [name, tensor] : tensors) {
    if (!bfloat16) {
      out.append(reinterpret_cast<const char*>(tensor.values.data()),
                 tensor.values.size() * sizeof(float));
      continue;
    }
    for (const float value : tensor.values) {
      const uint16_t half = float_to_bf16(value);
      out += static_cast<char>(half & 0xffu);
      out += static_cast<char>(half >> 8);
    }
  }
  return out;
}

namespace {

struct TensorEntry {
  std::string name;
  std::string dtype;
  uint64_t element_bytes = 4;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  return nlohmann::json(shape).dump();
}

TensorEntry parse_tensor_entry(const std::string& path, const std::string& name,
                               const nlohmann::json& info) {
  const auto bad = [&](const std::string& problem) {
    return file_error(path, "bad safetensors header: tensor '" + name + "' " + problem);
  };
  // What encode_safetensors refuses to write is not read either: a checkpoint that loads must
  // save again.
  if (name.empty()) {
    throw file_error(path, "bad safetensors header: a tensor has an empty name");
  }
  if (!info.is_object()) {
    throw bad("is not a JSON object");
  }
  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) {
    throw bad("has no \"dtype\" string");
  }
  TensorEntry entry;
  entry.name = name;
  entry.dtype = dtype->get<std::string>();
  entry.element_bytes = element_bytes(entry.dtype);
  if (entry.element_bytes == 0) {
    throw file_error(path, "tensor '" + name + "' has unsupported dtype '" + entry.dtype +
                               "' (F32, BF16 and F16 are supported)");
  }
  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) {
    throw bad("has no \"shape\" array");
  }
  uint64_t count = 1;
  for (const nlohmann::json& dim : *shape) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw bad("has a shape entry that is not a non-negative integer");
    }
    const auto size = dim.get<uint64_t>();
    if (size != 0 && count > std::numeric_limits<uint64_t>::max() / sizeof(float) / size) {
      throw bad("has a shape too large to address");
    }
    count *= size;
    entry.shape.push_back(static_cast<int64_t>(size));
  }
  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    throw bad("has no \"data_offsets\" pair of non-negative integers");
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.end < entry.begin) {
    throw bad("has data_offsets that end before they begin");
  }
  if (entry.end - entry.begin != count * entry.element_bytes) {
    throw bad("has data_offsets [" + std::to_string(entry.begin) + ", " +
              std::to_string(entry.end) + "] that do not hold the " +
              std::to_string(count * entry.element_bytes) + " bytes of shape " +
              shape_text(entry.shape) + " in " + entry.dtype);
  }
  return entry;
}

}  // namespace

std::map<std::string, CheckpointTensor> decode_safetensors(const std::string& path,
                                                           std::string_view bytes) {
  if (bytes.size() < kHeaderSizeBytes) {
    throw file_error(path, "truncated: " + std::to_string(bytes.size()) +
                               " bytes, shorter than the 8-byte safetensors header size");
  }
  uint64_t header_size = 0;
  for (uint64_t i = 0; i < kHeaderSizeBytes; ++i) {
    header_size |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  const uint64_t available = bytes.size() - kHeaderSizeBytes;
  if (header_size > available) {
    throw file_error(path, "bad safetensors header: header size " + std::to_string(header_size) +
                               " bytes is larger than the file (" + std::to_string(bytes.size()) +
                               " bytes)");
  }
  nlohmann::json header;
  try {
    const char* begin = bytes.data() + kHeaderSizeBytes;
    header = nlohmann::json::parse(begin, begin + header_size);
  } catch (const nlohmann::json::exception& error) {
    // parse_error, and out_of_range for a number too large for a double ("1e400").
    throw file_error(path, std::string("bad safetensors header: not valid JSON: ") + error.what());
  }
  if (!header.is_object()) {
    throw file_error(path, "bad safetensors header: not a JSON object");
  }

  std::vector<TensorEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name != "__metadata__") {
      entries.push_back(parse_tensor_entry(path, name, info));
    }
  }
  // The tensors must tile the data section exactly: no gaps, no overlaps, nothing missing.
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = available - header_size;
  uint64_t position = 0;
  for (const TensorEntry& entry : entries) {
    if (entry.begin != position) {
      throw file_error(path, "bad safetensors header: tensor '" + entry.name + "' starts at byte " +
                                 std::to_string(entry.begin) + " of the data, expected " +
                                 std::to_string(position) + " (tensors must be contiguous)");
    }
    position = entry.end;
  }
  if (position > data_size) {
    throw file_error(path, "truncated: the header describes " + std::to_string(position) +
                               " bytes of tensor data, the file holds " +
                               std::to_string(data_size));
  }
  if (position < data_size) {
    throw file_error(path,
                     std::to_string(data_size - position) + " bytes of data after the last tensor");
  }

  const std::string_view data = bytes.substr(kHeaderSizeBytes + header_size);
  std::map<std::string, CheckpointTensor> tensors;
  for (TensorEntry& entry : entries) {
    CheckpointTensor& tensor = tensors[entry.name];
    tensor.shape = std::move(entry.shape);
    const uint64_t count = (entry.end - entry.begin) / entry.element_bytes;
    tensor.values.resize(count);
    const char* source = data.data() + entry.begin;
    if (entry.dtype == "F32") {
      if (count > 0) {
        std::memcpy(tensor.values.data(), source, count * sizeof(float));
      }
      continue;
    }
    for (uint64_t index = 0; index < count; ++index) {
      uint16_t bits = 0;
      std::memcpy(&bits, source + 2 * index, sizeof(bits));
      tensor.values[index] = entry.dtype == "BF16" ? bf16_to_float(bits) : f16_to_float(bits);
    }
  }
  return tensors;
}

std::map<std::string, CheckpointTensor> read_safetensors(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    throw file_error(path, "cannot open for reading (missing, or not readable)");
  }
  std::string content((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  if (stream.bad()) {
    throw file_error(path, "read failed");
  }
  return decode_safetensors(path, content);
}

}  // namespace tpusim
