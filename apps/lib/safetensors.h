// The safetensors format (Hugging Face's weight files), read and written without its library: an 8-byte
// little-endian header length N, N bytes of JSON ({"NAME": {"dtype": "F32", "shape": [...], "data_offsets":
// [begin, end]}, ..., "__metadata__": {...}}, padded with spaces), then the tensors' little-endian bytes,
// offsets counted from the end of the header. Sharded weights add an index file naming each tensor's file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tt::app {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as stored: "F32", "BF16", "F16", ...
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

// Bytes per element of a safetensors dtype; 0 for a dtype this reader does not know.
int64_t safetensors_dtype_bytes(const std::string& dtype);
// A JSON parser's message for a user: without nlohmann's "[json.exception.parse_error.101] " prefix, and
// with bytes outside printable ASCII (a damaged file's) written as <0xNN>.
std::string json_error_message(const std::exception& e);

// One safetensors file, its header checked when opened. Every refusal is one line naming the file (and the
// tensor): shorter than its header, a header that is not a JSON object of entries with a known dtype, a
// shape and data_offsets, offsets that do not hold dtype x shape bytes, run past the end of the file,
// overlap, leave a gap, or leave bytes after the last tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  // The tensor's values as f32, from F32, BF16 or F16 (anything else is refused, naming the tensor).
  std::vector<float> read_floats(const SafetensorsTensor& tensor) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// Writes one file: the header of every tensor first (names, dtypes and shapes known up front; offsets are
// assigned in the order given), then each tensor's values in that order. The file is fsynced at close().
class SafetensorsWriter {
 public:
  // dtype of each tensor: F32 or BF16.
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensor> tensors,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // The next tensor's values (f32; BF16 tensors are rounded to nearest even). Throws for a name out of order
  // or a wrong number of values.
  void write(const std::string& name, const std::vector<float>& values);
  // Every tensor written: flush, fsync, close. Throws naming the file when the disk is full.
  void close();
  uint64_t data_bytes() const;

 private:
  void write_bytes(const void* data, size_t bytes);
  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  size_t next_ = 0;
  int fd_ = -1;
};

// model.safetensors.index.json: each tensor's file (a name in the same folder). Malformed JSON, a missing
// weight_map or a file name with a path in it are refused, naming the file.
std::map<std::string, std::string> read_safetensors_index(const std::string& path);
// Its text (Hugging Face's layout: metadata.total_size, then weight_map sorted by name).
std::string safetensors_index_json(uint64_t total_size, const std::map<std::string, std::string>& weight_map);

// Writes `text` to `path` and fsyncs it; a failed write (a full disk) throws naming the file.
void write_file_synced(const std::string& path, const std::string& text);

}  // namespace tt::app
