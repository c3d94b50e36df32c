#include "core/io/h5.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "core/ops.h"

namespace tt::io {

void quiet_hdf5_errors_on_this_thread() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {

// HDF5 prints its own error stack by default; the project reports one line instead. And it must not clean up
// at exit: HDF5 1.10 keeps a file whose close failed (a flush that hit a full disk) registered with its
// internals already freed, and its exit handler then closes it again and crashes. Everything the project
// opens is closed by its owner, so the handler has nothing left to do. (Set before HDF5 initialises, which
// the first call below does.)
struct ConfigureHdf5 {
  ConfigureHdf5() {
    H5dont_atexit();
    quiet_hdf5_errors_on_this_thread();  // the main thread's
  }
};
const ConfigureHdf5 g_configure;

// The attribute holding the CRC-32 (zlib's) of a dataset's stored bytes, f32 little-endian in row-major
// order.
constexpr const char* kChecksumAttr = "crc32";

// CRC-32 of `bytes` at `data`, in pieces of at least 64 MiB on up to one thread each, combined: the checksum
// of a 7b checkpoint's 81 GB must not take longer than writing it. (HDF5's Fletcher32 filter runs at under
// 1 GB/s on one thread inside each write and read.)
uint32_t crc32_of(const void* data, size_t bytes) {
  constexpr size_t kPiece = size_t{64} << 20;
  const auto* p = static_cast<const Bytef*>(data);
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  const size_t pieces = std::clamp<size_t>(bytes / kPiece, 1, threads);
  if (pieces == 1) return static_cast<uint32_t>(crc32_z(0, p, bytes));
  const size_t per = bytes / pieces;
  std::vector<uLong> crcs(pieces);
  std::vector<std::thread> workers;
  for (size_t i = 0; i < pieces; ++i) {
    const size_t begin = i * per, size = i + 1 == pieces ? bytes - begin : per;
    auto piece = [&crcs, p, i, begin, size] { crcs[i] = crc32_z(0, p + begin, size); };
    try {
      workers.emplace_back(piece);
    } catch (const std::system_error&) {
      piece();  // no thread to be had (a process limit): this one does it
    }
  }
  for (std::thread& w : workers) w.join();
  uLong crc = crcs[0];
  for (size_t i = 1; i < pieces; ++i) {
    const size_t size = i + 1 == pieces ? bytes - i * per : per;
    crc = crc32_combine(crc, crcs[i], static_cast<z_off_t>(size));
  }
  return static_cast<uint32_t>(crc);
}

// The operating system's reason for a failed call (HDF5's file driver puts errno's text into its message:
// "File too large", "No space left on device"), or that a checksum did not match; "" when neither.
std::string hdf5_reason() {
  std::string reason;
  auto visit = [](unsigned, const H5E_error2_t* error, void* out) -> herr_t {
    std::string& found = *static_cast<std::string*>(out);
    const std::string desc = error->desc ? error->desc : "";
    const std::string key = "error message = '";
    const size_t at = desc.find(key);
    if (at != std::string::npos && found.empty()) {
      const size_t end = desc.find('\'', at + key.size());
      found = desc.substr(at + key.size(), end == std::string::npos ? end : end - at - key.size());
    } else if (desc.find("checksum") != std::string::npos && found.empty()) {
      found = "checksum mismatch";
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, visit, &reason);
  return reason;
}

[[noreturn]] void fail(const char* call, const std::string& what) {
  const std::string reason = hdf5_reason();
  throw Error(std::string("HDF5 error in ") + call + " (" + what + ")" +
              (reason.empty() ? "" : ": " + reason));
}

template <class T>
T checked(T result, const char* call, const std::string& what) {
  if (result < 0) fail(call, what);
  return result;
}

// RAII for any hid_t with its matching close function.
class Handle {
 public:
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~Handle() {
    if (id_ >= 0) closer_(id_);
  }
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  herr_t (*closer_)(hid_t);
};

std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// NumPy's name for an HDF5 element type ("float32", "int64"), or the HDF5 class for what NumPy lacks.
std::string type_name(hid_t type) {
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    default:
      return "HDF5 type class " + std::to_string(static_cast<int>(H5Tget_class(type)));
  }
}

bool has_fletcher32(hid_t dataset) {
  Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  if (dcpl.get() < 0) return false;
  unsigned flags = 0;
  size_t count = 0;
  return H5Pget_filter_by_id2(dcpl.get(), H5Z_FILTER_FLETCHER32, &flags, &count, nullptr, 0, nullptr,
                              nullptr) >= 0;
}

}  // namespace

H5File H5File::create(const std::string& path) {
  // The HDF5 1.8 file format: its object headers, attributes and superblock carry checksums too (the
  // earliest format has none), and every HDF5 reader since 1.8 opens it.
  Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", path), H5Pclose);
  checked(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), "H5Pset_libver_bounds", path);
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) {
    const std::string reason = hdf5_reason();
    throw Error("cannot create HDF5 file '" + path + "'" + (reason.empty() ? "" : ": " + reason));
  }
  return H5File(id, path);
}

bool has_hdf5_signature(const std::string& path) {
  char signature[8] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool whole = ::read(fd, signature, sizeof(signature)) == sizeof(signature);
  ::close(fd);
  return whole && std::memcmp(signature, "\x89HDF\r\n\x1a\n", sizeof(signature)) == 0;
}

H5File H5File::open_read(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error("checkpoint '" + path + "' does not exist");
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    // With HDF5's signature: a file HDF5 wrote, now damaged (cut short by a full disk or a copy,
    // overwritten); without it, some other file.
    const bool hdf5 = has_hdf5_signature(path);
    std::error_code size_error;
    const bool empty = std::filesystem::file_size(path, size_error) == 0 && !size_error;
    throw Error("'" + path + "' " +
                (hdf5    ? "is damaged (cut short or overwritten?): HDF5 cannot open it"
                 : empty ? "is empty (a write cut short?)"
                         : "is not a readable HDF5 file (not a checkpoint?)"));
  }
  return H5File(id, path);
}

H5File::H5File(H5File&& other) noexcept : id_(other.id_), path_(std::move(other.path_)) {
  other.id_ = -1;
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

void H5File::close() {
  if (id_ >= 0) {
    const hid_t id = id_;
    id_ = -1;
    checked(H5Fclose(id), "H5Fclose", path_);
  }
}

void H5File::flush() {
  checked(H5Fflush(id_, H5F_SCOPE_GLOBAL), "H5Fflush", path_);
}

bool H5File::exists(const std::string& object) const {
  if (object == "/") return true;
  // Check each level, as H5Lexists requires the parent to exist.
  size_t pos = 1;
  while (true) {
    const size_t slash = object.find('/', pos);
    const std::string prefix = object.substr(0, slash);
    // Negative is an error (a damaged file), not absence.
    if (checked(H5Lexists(id_, prefix.c_str(), H5P_DEFAULT), "H5Lexists", prefix) == 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

bool H5File::is_dataset(const std::string& object) const {
  if (!exists(object)) return false;
  Handle obj(checked(H5Oopen(id_, object.c_str(), H5P_DEFAULT), "H5Oopen", object), H5Oclose);
  return H5Iget_type(obj.get()) == H5I_DATASET;
}

void H5File::ensure_group(const std::string& group) {
  if (exists(group)) return;
  Handle props(checked(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", group), H5Pclose);
  checked(H5Pset_create_intermediate_group(props.get(), 1), "H5Pset_create_intermediate_group", group);
  Handle g(
      checked(H5Gcreate2(id_, group.c_str(), props.get(), H5P_DEFAULT, H5P_DEFAULT), "H5Gcreate2", group),
      H5Gclose);
}

Shape H5File::dataset_shape(const std::string& dataset) const {
  if (!exists(dataset)) throw Error("dataset " + dataset + " is missing in " + path_);
  Handle d(checked(H5Dopen2(id_, dataset.c_str(), H5P_DEFAULT), "H5Dopen2", dataset), H5Dclose);
  Handle space(checked(H5Dget_space(d.get()), "H5Dget_space", dataset), H5Sclose);
  const int rank = checked(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", dataset);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  checked(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims", dataset);
  return Shape(dims.begin(), dims.end());
}

std::string H5File::dataset_dtype(const std::string& dataset) const {
  if (!exists(dataset)) throw Error("dataset " + dataset + " is missing in " + path_);
  Handle d(checked(H5Dopen2(id_, dataset.c_str(), H5P_DEFAULT), "H5Dopen2", dataset), H5Dclose);
  Handle type(checked(H5Dget_type(d.get()), "H5Dget_type", dataset), H5Tclose);
  return type_name(type.get());
}

std::vector<std::string> H5File::children(const std::string& group) const {
  std::vector<std::string> names;
  if (!exists(group)) return names;
  Handle g(checked(H5Gopen2(id_, group.c_str(), H5P_DEFAULT), "H5Gopen2", group), H5Gclose);
  H5G_info_t info;
  checked(H5Gget_info(g.get(), &info), "H5Gget_info", group);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string name(static_cast<size_t>(checked(len, "H5Lget_name_by_idx", group)), '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size() + 1,
                       H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
}

bool H5File::has_checksum(const std::string& dataset) const {
  return has_attr(dataset, kChecksumAttr);
}

void H5File::write_tensor(const std::string& dataset, const Tensor& tensor) {
  ensure_group(parent_of(dataset));
  // A host f32 tensor is written from its own memory; anything else through one f32 copy.
  const bool direct = tensor.device().is_cpu() && tensor.dtype() == DType::f32 && tensor.is_contiguous();
  const std::vector<float> copy = direct ? std::vector<float>() : tensor.to_floats();
  const float* host = direct ? tensor.data<float>() : copy.data();
  const Shape& shape = tensor.shape();
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                       "H5Screate_simple", dataset),
               H5Sclose);
  // Contiguous storage, no filter: the bytes go to the file as they are, and the checksum is ours.
  Handle d(checked(H5Dcreate2(id_, dataset.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT),
                   "H5Dcreate2", dataset),
           H5Dclose);
  checked(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host), "H5Dwrite", dataset);
  const int64_t crc = crc32_of(host, static_cast<size_t>(tensor.numel()) * sizeof(float));
  set_attr(dataset, kChecksumAttr, crc);
}

std::vector<float> H5File::read_floats(const std::string& dataset, Shape* shape_out) const {
  const Shape shape = dataset_shape(dataset);
  std::vector<float> host(static_cast<size_t>(shape_numel(shape)));
  Handle d(checked(H5Dopen2(id_, dataset.c_str(), H5P_DEFAULT), "H5Dopen2", dataset), H5Dclose);
  if (H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()) < 0) {
    const std::string reason = hdf5_reason();
    // A read that succeeds without checksum verification failed on the checksum alone.
    if (has_fletcher32(d.get())) {
      Handle dxpl(checked(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate", dataset), H5Pclose);
      checked(H5Pset_edc_check(dxpl.get(), H5Z_DISABLE_EDC), "H5Pset_edc_check", dataset);
      if (H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, dxpl.get(), host.data()) >= 0)
        throw Error("checkpoint " + path_ + " is damaged: checksum mismatch in " + dataset);
    }
    throw Error("HDF5 error in H5Dread (" + dataset + ")" + (reason.empty() ? "" : ": " + reason));
  }
  // Ours (format 3): the CRC-32 of the stored f32 bytes, which these are on a little-endian host.
  if (has_attr(dataset, kChecksumAttr) && dataset_dtype(dataset) == "float32") {
    const int64_t expected = attr_int(dataset, kChecksumAttr);
    if (crc32_of(host.data(), host.size() * sizeof(float)) != expected)
      throw Error("checkpoint " + path_ + " is damaged: checksum mismatch in " + dataset);
  }
  if (shape_out) *shape_out = shape;
  return host;
}

void H5File::read_into(const std::string& dataset, Tensor& dst) const {
  const Shape shape = dataset_shape(dataset);
  if (shape != dst.shape()) {
    throw Error("checkpoint " + path_ + ": dataset " + dataset + " has shape " + shape_str(shape) +
                ", the model expects " + shape_str(dst.shape()));
  }
  const Tensor host = Tensor::from_floats(read_floats(dataset), shape);
  if (dst.dtype() == DType::f32) {
    dst.copy_(host.to(dst.device()));
  } else {
    dst.copy_(ops::cast(host, dst.dtype()).to(dst.device()));
  }
}

namespace {
Handle open_object(hid_t file, const std::string& object) {
  return Handle(checked(H5Oopen(file, object.c_str(), H5P_DEFAULT), "H5Oopen", object), H5Oclose);
}

void write_attr(hid_t file, const std::string& object, const std::string& name, hid_t type,
                const void* value) {
  Handle obj = open_object(file, object);
  if (H5Aexists(obj.get(), name.c_str()) > 0) H5Adelete(obj.get(), name.c_str());
  Handle space(checked(H5Screate(H5S_SCALAR), "H5Screate", name), H5Sclose);
  Handle attr(checked(H5Acreate2(obj.get(), name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      "H5Acreate2", object + "@" + name),
              H5Aclose);
  checked(H5Awrite(attr.get(), type, value), "H5Awrite", object + "@" + name);
}
}  // namespace

void H5File::set_attr(const std::string& object, const std::string& name, int64_t value) {
  ensure_group(object);
  write_attr(id_, object, name, H5T_NATIVE_INT64, &value);
}

void H5File::set_attr(const std::string& object, const std::string& name, double value) {
  ensure_group(object);
  write_attr(id_, object, name, H5T_NATIVE_DOUBLE, &value);
}

void H5File::set_attr(const std::string& object, const std::string& name, const std::string& value) {
  ensure_group(object);
  Handle type(checked(H5Tcopy(H5T_C_S1), "H5Tcopy", name), H5Tclose);
  checked(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), "H5Tset_size", name);
  checked(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "H5Tset_strpad", name);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_attr(id_, object, name, type.get(), padded.data());
}

bool H5File::has_attr(const std::string& object, const std::string& name) const {
  if (!exists(object)) return false;
  Handle obj = open_object(id_, object);
  return checked(H5Aexists(obj.get(), name.c_str()), "H5Aexists", object + "@" + name) > 0;
}

namespace {
// Opens OBJECT@NAME after checking that it exists, holds one value and is of `expected_class`
// (`expected` names it in the message).
Handle open_attr(hid_t file, const std::string& path, const std::string& object, const std::string& name,
                 H5T_class_t expected_class, const char* expected) {
  const std::string what = object + "@" + name;
  if (object != "/" && checked(H5Lexists(file, object.c_str(), H5P_DEFAULT), "H5Lexists", object) == 0)
    throw Error("checkpoint " + path + ": " + object + " is missing");
  Handle obj = open_object(file, object);
  if (checked(H5Aexists(obj.get(), name.c_str()), "H5Aexists", what) == 0)
    throw Error("checkpoint " + path + ": attribute " + what + " is missing");
  Handle attr(checked(H5Aopen(obj.get(), name.c_str(), H5P_DEFAULT), "H5Aopen", what), H5Aclose);
  Handle type(checked(H5Aget_type(attr.get()), "H5Aget_type", what), H5Tclose);
  if (H5Tget_class(type.get()) != expected_class) {
    throw Error("checkpoint " + path + ": attribute " + what + " is " + type_name(type.get()) +
                ", expected " + expected);
  }
  Handle space(checked(H5Aget_space(attr.get()), "H5Aget_space", what), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    throw Error("checkpoint " + path + ": attribute " + what + " holds several values, expected one");
  return attr;
}
}  // namespace

int64_t H5File::attr_int(const std::string& object, const std::string& name) const {
  Handle attr = open_attr(id_, path_, object, name, H5T_INTEGER, "an integer");
  int64_t value = 0;
  checked(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), "H5Aread", object + "@" + name);
  return value;
}

double H5File::attr_double(const std::string& object, const std::string& name) const {
  Handle attr = open_attr(id_, path_, object, name, H5T_FLOAT, "a floating-point number");
  double value = 0;
  checked(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value), "H5Aread", object + "@" + name);
  return value;
}

std::string H5File::attr_string(const std::string& object, const std::string& name) const {
  Handle attr = open_attr(id_, path_, object, name, H5T_STRING, "a string");
  const std::string what = object + "@" + name;
  Handle type(checked(H5Aget_type(attr.get()), "H5Aget_type", what), H5Tclose);
  if (H5Tis_variable_str(type.get()) > 0) {  // as h5py writes a str
    Handle memory(checked(H5Tcopy(H5T_C_S1), "H5Tcopy", what), H5Tclose);
    checked(H5Tset_size(memory.get(), H5T_VARIABLE), "H5Tset_size", what);
    checked(H5Tset_cset(memory.get(), H5Tget_cset(type.get())), "H5Tset_cset", what);  // h5py's are UTF-8
    char* text = nullptr;
    checked(H5Aread(attr.get(), memory.get(), &text), "H5Aread", what);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(type.get()), '\0');
  checked(H5Aread(attr.get(), type.get(), value.data()), "H5Aread", what);
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

void atomic_write(const std::string& path, const std::function<void(H5File&)>& writer,
                  const std::function<void(const std::string&)>& check) {
  const std::string tmp = path + ".tmp";
  try {
    {
      H5File file = H5File::create(tmp);
      writer(file);
      file.flush();
      file.close();
    }
    const int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      throw Error("cannot fsync '" + tmp + "'");
    }
    ::close(fd);
    if (check) check(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("cannot rename '" + tmp + "' to '" + path + "'");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  // The rename itself survives a power loss only once the folder is synced too. Best effort: the file is in
  // place either way, and some file systems cannot sync a folder.
  const std::string folder = std::filesystem::path(path).parent_path().string();
  const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

}  // namespace tt::io
