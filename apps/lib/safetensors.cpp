#include "apps/lib/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/error.h"

namespace tt::app {

namespace fs = std::filesystem;

// The format is little-endian; so are the machines this builds for, which lets bytes go straight to memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// safetensors' own reader refuses larger headers; a bigger length is damage, not a model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(where + " is not valid JSON (" + json_error_message(e) + ")");
  }
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  return std::bit_cast<float>(bits);
}

// A non-negative integer of a header entry, or nothing.
bool unsigned_value(const nlohmann::json& value, uint64_t& out) {
  if (!value.is_number_integer()) return false;
  if (!value.is_number_unsigned() && value.get<int64_t>() < 0) return false;
  out = value.get<uint64_t>();
  return true;
}

SafetensorsTensor parse_entry(const std::string& name, const nlohmann::json& entry,
                              const std::string& where) {
  const std::string tensor = where + ": tensor " + name;
  TT_CHECK(entry.is_object(), tensor + " is not an object with dtype, shape and data_offsets");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    TT_CHECK(entry.contains(field), tensor + " has no " + field);
  SafetensorsTensor t;
  t.name = name;
  TT_CHECK(entry.at("dtype").is_string(), tensor + ": dtype is not a string");
  t.dtype = entry.at("dtype").get<std::string>();
  const int64_t element_bytes = safetensors_dtype_bytes(t.dtype);
  TT_CHECK(element_bytes > 0, tensor + ": dtype '" + t.dtype + "' is not a safetensors dtype");
  const nlohmann::json& shape = entry.at("shape");
  TT_CHECK(shape.is_array(), tensor + ": shape is not an array");
  uint64_t bytes = static_cast<uint64_t>(element_bytes);
  bool overflow = false;
  for (const nlohmann::json& dim : shape) {
    uint64_t size = 0;
    TT_CHECK(unsigned_value(dim, size) && size <= static_cast<uint64_t>(INT64_MAX),
             tensor + ": shape " + shape.dump() + " is not a list of non-negative integers");
    t.shape.push_back(static_cast<int64_t>(size));
    overflow = overflow || __builtin_mul_overflow(bytes, size, &bytes);
  }
  const nlohmann::json& offsets = entry.at("data_offsets");
  TT_CHECK(offsets.is_array() && offsets.size() == 2 && unsigned_value(offsets[0], t.begin) &&
               unsigned_value(offsets[1], t.end) && t.begin <= t.end,
           tensor + ": data_offsets " + offsets.dump() + " is not [begin, end] with 0 <= begin <= end");
  TT_CHECK(!overflow && bytes == t.end - t.begin,
           tensor + ": data_offsets " + offsets.dump() + " hold " + std::to_string(t.end - t.begin) +
               " bytes, but " + t.dtype + " " + shape_str(t.shape) + " needs " +
               (overflow ? std::string("more than 2^64") : std::to_string(bytes)));
  return t;
}

}  // namespace

std::string json_error_message(const std::exception& e) {
  const std::string what = e.what();
  const size_t bracket = what.find("] ");
  const std::string message = bracket == std::string::npos ? what : what.substr(bracket + 2);
  std::string shown;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      shown += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", byte);
      shown += hex;
    }
  }
  return shown;
}

int64_t safetensors_dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8},  {"I64", 8},     {"U64", 8},     {"F32", 4},     {"I32", 4},        {"U32", 4},
      {"F16", 2},  {"BF16", 2},    {"I16", 2},     {"U16", 2},     {"I8", 1},         {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"F8_E4M3FNUZ", 1}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  TT_CHECK(fs::is_regular_file(path, ec), path + " does not exist or is not a file");
  const uint64_t size = fs::file_size(path, ec);
  TT_CHECK(!ec, path + ": cannot read its size");
  TT_CHECK(size >= 8,
           path + " is truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  std::ifstream in(path, std::ios::binary);
  TT_CHECK(in, path + ": cannot be read");
  unsigned char length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  TT_CHECK(in, path + ": cannot read the header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  TT_CHECK(header_bytes <= size - 8, path + " is truncated: its header length is " +
                                         std::to_string(header_bytes) + " bytes, but only " +
                                         std::to_string(size - 8) + " follow");
  TT_CHECK(header_bytes <= kMaxHeaderBytes, path + ": header length " + std::to_string(header_bytes) +
                                                " is over 100 MB: not a safetensors file");
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  TT_CHECK(in, path + ": cannot read the header");
  const nlohmann::json header = parse_json(text, path + ": the header");
  TT_CHECK(header.is_object(), path + ": the header is not a JSON object");
  data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = size - data_start_;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      TT_CHECK(entry.is_object(), path + ": __metadata__ is not an object");
      continue;
    }
    SafetensorsTensor t = parse_entry(name, entry, path);
    TT_CHECK(t.end <= data_bytes, path + ": tensor " + name + " has data_offsets [" +
                                      std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                      "] past the end of the data (" + std::to_string(data_bytes) +
                                      " bytes): the file is truncated or the offsets are wrong");
    tensors_.push_back(std::move(t));
  }
  // The data is the tensors end to end, as the format's own reader requires: no overlap, gap or tail.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsTensor& t = tensors_[i];
    TT_CHECK(t.begin >= covered, path + ": tensor " + t.name + " overlaps tensor " + tensors_[i - 1].name);
    TT_CHECK(t.begin == covered, path + ": data bytes [" + std::to_string(covered) + ", " +
                                     std::to_string(t.begin) + ") belong to no tensor");
    covered = t.end;
    index_[t.name] = i;
  }
  TT_CHECK(covered == data_bytes,
           path + ": " + std::to_string(data_bytes - covered) + " bytes after the last tensor's data");
}

const SafetensorsTensor* SafetensorsReader::find(const std::string& name) const {
  const auto found = index_.find(name);
  return found == index_.end() ? nullptr : &tensors_[found->second];
}

std::vector<float> SafetensorsReader::read_floats(const SafetensorsTensor& tensor) const {
  TT_CHECK(tensor.dtype == "F32" || tensor.dtype == "BF16" || tensor.dtype == "F16",
           path_ + ": tensor " + tensor.name + " is " + tensor.dtype + ", expected F32, BF16 or F16");
  const uint64_t bytes = tensor.end - tensor.begin;
  const size_t count = bytes / static_cast<uint64_t>(safetensors_dtype_bytes(tensor.dtype));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + tensor.begin));
  std::vector<float> values(count);
  if (tensor.dtype == "F32") {
    in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
  } else {
    std::vector<uint16_t> raw(count);
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(bytes));
    for (size_t i = 0; i < count; ++i)
      values[i] = tensor.dtype == "BF16" ? bf16::to_float(raw[i]) : half_to_float(raw[i]);
  }
  TT_CHECK(in, path_ + ": cannot read the data of tensor " + tensor.name);
  return values;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (SafetensorsTensor& t : tensors_) {
    TT_ASSERT(t.dtype == "F32" || t.dtype == "BF16", "cannot write " + t.dtype + " tensors");
    t.begin = offset;
    t.end = offset + static_cast<uint64_t>(shape_numel(t.shape) * safetensors_dtype_bytes(t.dtype));
    offset = t.end;
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = header.dump();
  // Padded with spaces so that the data starts 8-byte aligned, as the format's own writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TT_CHECK(fd_ >= 0, "cannot create " + path + ": " + std::strerror(errno));
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  write_bytes(length, 8);
  write_bytes(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write_bytes(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    TT_CHECK(n > 0, "cannot write " + path_ + " (disk full?): " + std::strerror(n < 0 ? errno : ENOSPC));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void SafetensorsWriter::write(const std::string& name, const std::vector<float>& values) {
  TT_ASSERT(next_ < tensors_.size() && tensors_[next_].name == name,
            "tensor " + name + " written out of order to " + path_);
  const SafetensorsTensor& t = tensors_[next_];
  TT_ASSERT(static_cast<int64_t>(values.size()) == shape_numel(t.shape),
            "tensor " + name + " has " + std::to_string(values.size()) + " values, expected " +
                std::to_string(shape_numel(t.shape)));
  if (t.dtype == "F32") {
    write_bytes(values.data(), values.size() * sizeof(float));
  } else {
    std::vector<uint16_t> rounded(values.size());
    for (size_t i = 0; i < values.size(); ++i) rounded[i] = bf16::from_float(values[i]);
    write_bytes(rounded.data(), rounded.size() * sizeof(uint16_t));
  }
  ++next_;
}

void SafetensorsWriter::close() {
  TT_ASSERT(next_ == tensors_.size(), path_ + " closed with tensors missing");
  const bool synced = ::fsync(fd_) == 0;
  const int saved = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  TT_CHECK(synced && closed, "cannot write " + path_ + " (disk full?): " + std::strerror(saved));
}

uint64_t SafetensorsWriter::data_bytes() const {
  return tensors_.empty() ? 0 : tensors_.back().end;
}

std::map<std::string, std::string> read_safetensors_index(const std::string& path) {
  std::ifstream in(path);
  TT_CHECK(in, path + ": cannot be read");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json index = parse_json(text, path);
  TT_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
           path + ": weight_map is missing or not an object");
  std::map<std::string, std::string> files;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    TT_CHECK(file.is_string(), path + ": weight_map's entry for " + name + " is not a file name");
    const std::string value = file.get<std::string>();
    TT_CHECK(
        !value.empty() && value.find('/') == std::string::npos && value != "." && value != "..",
        path + ": weight_map's entry for " + name + " is '" + value + "', not a file in the same folder");
    files[name] = value;
  }
  return files;
}

std::string safetensors_index_json(uint64_t total_size,
                                   const std::map<std::string, std::string>& weight_map) {
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [name, file] : weight_map) index["weight_map"][name] = file;
  return index.dump(2) + "\n";
}

void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TT_CHECK(fd >= 0, "cannot create " + path + ": " + std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  int error = 0;
  while (left > 0 && !error) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (!error && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && !error) error = errno;
  TT_CHECK(!error, "cannot write " + path + " (disk full?): " + std::strerror(error));
}

}  // namespace tt::app
