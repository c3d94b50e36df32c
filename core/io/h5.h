// A small RAII layer over the HDF5 C API: files, groups created on demand, f32 datasets from tensors and
// vectors, and scalar attributes. Every call is checked; failures throw tt::Error naming the call and the
// dataset. Datasets are written contiguous with a CRC-32 of their bytes in an attribute (crc32), so reading
// damaged data fails ("checksum mismatch") instead of returning it; so do HDF5's own Fletcher32 checksums of
// chunked datasets (earlier checkpoints). atomic_write() produces a file that is either complete or absent.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tt::io {

// HDF5 prints its error stack by default, and (built thread-safe, as Debian's is) keeps that setting per
// thread: a thread other than the main one calls this before its first HDF5 call, so that its failures
// surface only as tt::Error.
void quiet_hdf5_errors_on_this_thread();

class H5File {
 public:
  static H5File create(const std::string& path);     // truncates
  static H5File open_read(const std::string& path);  // throws a clear error when missing or not HDF5
  ~H5File();
  H5File(H5File&& other) noexcept;
  H5File& operator=(H5File&&) = delete;
  H5File(const H5File&) = delete;

  const std::string& path() const { return path_; }
  bool exists(const std::string& object) const;  // "/model/lm_head.weight"
  bool is_dataset(const std::string& object) const;
  Shape dataset_shape(const std::string& dataset) const;
  // The stored element type in NumPy's spelling: "float32" (either byte order), "int32", "float64", ...
  std::string dataset_dtype(const std::string& dataset) const;
  std::vector<std::string> children(const std::string& group) const;

  // f32 datasets: any tensor (any device, any float dtype) is written as host f32 in its shape.
  void write_tensor(const std::string& dataset, const Tensor& tensor);
  // Reads into `dst` (contiguous, f32/f64, any device); refuses missing datasets and other shapes.
  void read_into(const std::string& dataset, Tensor& dst) const;
  // Any numeric dataset, converted to f32. Data whose checksum does not match throws "checkpoint PATH is
  // damaged: checksum mismatch in DATASET".
  std::vector<float> read_floats(const std::string& dataset, Shape* shape = nullptr) const;

  void set_attr(const std::string& object, const std::string& name, int64_t value);
  void set_attr(const std::string& object, const std::string& name, double value);
  void set_attr(const std::string& object, const std::string& name, const std::string& value);
  bool has_attr(const std::string& object, const std::string& name) const;
  bool has_checksum(const std::string& dataset) const;  // the CRC-32 write_tensor stores
  // Each refuses a missing attribute, one that is not a single value, and one of another kind (an integer
  // for attr_int, a floating-point number for attr_double, a string for attr_string), naming it.
  int64_t attr_int(const std::string& object, const std::string& name) const;
  double attr_double(const std::string& object, const std::string& name) const;
  std::string attr_string(const std::string& object, const std::string& name) const;

  void flush();
  void close();  // explicit close, so errors surface before a rename

 private:
  H5File(long long id, std::string path) : id_(id), path_(std::move(path)) {}
  void ensure_group(const std::string& group);
  long long id_ = -1;
  std::string path_;
};

// Writes `path` through `writer` into a temporary file next to it, flushes and fsyncs it, then renames it
// over `path` (and fsyncs the folder). On any failure the temporary file is removed, `path` is untouched, and
// the error rethrown. `check` (optional) reads the closed temporary file (its path is passed) before the
// rename: a file that fails it never takes `path`'s name.
void atomic_write(const std::string& path, const std::function<void(H5File&)>& writer,
                  const std::function<void(const std::string&)>& check = {});

// Whether `path` starts with HDF5's 8-byte signature (a file HDF5 wrote, whole or not).
bool has_hdf5_signature(const std::string& path);

}  // namespace tt::io
