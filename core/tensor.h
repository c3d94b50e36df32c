// Tensor: a handle to shared storage plus shape, strides, offset, dtype and device. Copies of a Tensor
// share everything (like torch.Tensor objects); views share the storage. Autograd state (requires_grad,
// grad, grad_fn, hooks) lives in the shared TensorImpl.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "core/device.h"

namespace tt {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

class Node;
class Tensor;
struct TensorImpl;
using GradHook = std::function<void(Tensor&)>;
// Takes a weight's gradient in factored form, dW = dy^T x (autograd.h, set_factored_grad_consumer).
using FactoredGradConsumer = std::function<bool(const Tensor& dy, const Tensor& x)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- creation (uninitialised / filled / from host data) ---
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape,
                            Device device = Device::cpu());
  static Tensor from_doubles(const std::vector<double>& values, const Shape& shape,
                             Device device = Device::cpu());
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape,
                          Device device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;

  // Pointer to the first element (storage + offset). typed access checks the dtype.
  void* raw_data() const;
  template <class T>
  T* data() const;

  // --- views (no autograd; see ops.h for differentiable versions) ---
  Tensor view(const Shape& shape) const;  // requires contiguous; one dim may be -1
  Tensor transpose_view(int64_t d0, int64_t d1) const;
  Tensor narrow_view(int64_t dim, int64_t start, int64_t length) const;
  Tensor as_strided_view(const Shape& shape, const Shape& strides, int64_t offset) const;

  // --- copies (no autograd) ---
  Tensor to(Device device) const;  // contiguous copy on another device (or a clone on the same)
  Tensor clone() const;            // contiguous copy on the same device
  void copy_(const Tensor& src);   // same shape and dtype, any devices; this must be contiguous
  void fill_(double value);
  void zero_() { fill_(0.0); }
  std::vector<float> to_floats() const;    // host copy converted to f32
  std::vector<double> to_doubles() const;  // host copy converted to f64
  std::vector<int32_t> to_ints() const;
  double item() const;  // single element, as double

  // --- autograd ---
  bool requires_grad() const;
  Tensor& set_requires_grad(bool value);
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<Node>& grad_fn() const;
  void set_grad_fn(std::shared_ptr<Node> node) const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  // Runs backward from this tensor; a scalar gets gradient 1 when `grad` is undefined.
  void backward(const Tensor& grad = Tensor()) const;
  // Called once per backward pass when this leaf's gradient for that pass is complete. Returns a handle for
  // remove_grad_ready_hook (objects that install hooks take them out again when they go away).
  uint64_t register_grad_ready_hook(GradHook hook) const;
  void remove_grad_ready_hook(uint64_t handle) const;
  const std::string& name() const;
  Tensor& set_name(const std::string& name);
  // A bf16 copy of this tensor's values that whoever changes them keeps current or drops: FlatParameters'
  // bf16 mirror, written by AdamW with each update, and read by ops::linear computing in bf16 instead of
  // casting the weight; a residual stream's gradient written by RMSNorm's backward (the autograd engine drops
  // it before it lets a node add into that gradient), read by the matmul it feeds. Undefined unless set.
  const Tensor& low_precision_copy() const;
  void set_low_precision_copy(const Tensor& copy) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }
  std::string describe() const;  // "f32[2, 3] cuda:0"

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::f32;
  Device device;
  // autograd
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::weak_ptr<Node> grad_accumulator;                         // the unique AccumulateGrad node of a leaf
  std::vector<std::pair<uint64_t, GradHook>> grad_ready_hooks;  // (handle, hook) in registration order
  uint64_t next_hook_handle = 1;
  FactoredGradConsumer factored_grad_consumer;  // empty: none (autograd.h)
  // The backward pass (autograd.cpp's count) in which .grad is known to hold zeros (mark_grad_zeroed), or
  // kNoZeroPass when it is not known.
  static constexpr uint64_t kNoZeroPass = UINT64_MAX;
  uint64_t grad_zero_pass = kNoZeroPass;
  std::string name;
  Tensor low_precision_copy;
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};

template <class T>
T* Tensor::data() const {
  TT_CHECK(defined(), "data() on an undefined tensor");
  if (dtype() != dtype_of<T>::value) {
    throw Error(std::string("tensor dtype is ") + dtype_name(dtype()) + ", accessed as " +
                dtype_name(dtype_of<T>::value));
  }
  return static_cast<T*>(raw_data());
}

Shape contiguous_strides(const Shape& shape);

}  // namespace tt
