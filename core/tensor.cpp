#include "core/tensor.h"

#include <algorithm>
#include <cmath>

#include <cstring>
#include <sstream>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocate_bytes(device, bytes);
}
Storage::~Storage() {
  free_bytes(device_, data_, bytes_);
}

namespace {
#ifdef TT_WITH_CUDA
cudaStream_t stream_of(Device d) {
  return static_cast<cudaStream_t>(compute_stream(d.index));
}
#endif

std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) TT_CHECK(s >= 0, "negative dimension in shape " + shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  impl->storage =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return impl;
}

// Copies raw contiguous bytes between any two devices, ordered on the compute stream.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef TT_WITH_CUDA
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  cudaStream_t stream = stream_of(gpu);
  TT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  // Host memory may be pageable or about to be freed: wait when the host is involved.
  if (dst_device.is_cpu() || src_device.is_cpu()) TT_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  throw Error("this build has no CUDA support");
#endif
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return Tensor(make_impl(shape, dtype, device));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, Device device) {
  TT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_floats: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DType::f32, device);
  copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), values.size() * 4);
  return t;
}

Tensor Tensor::from_doubles(const std::vector<double>& values, const Shape& shape, Device device) {
  TT_CHECK(device.is_cpu(), "f64 tensors exist on the CPU only");
  TT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_doubles: size does not match shape");
  Tensor t = empty(shape, DType::f64, device);
  std::memcpy(t.raw_data(), values.data(), values.size() * 8);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape, Device device) {
  TT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_ints: size does not match shape");
  Tensor t = empty(shape, DType::i32, device);
  copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), values.size() * 4);
  return t;
}

const Shape& Tensor::shape() const {
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  return impl_->strides;
}
int64_t Tensor::numel() const {
  return shape_numel(impl_->shape);
}
int64_t Tensor::offset() const {
  return impl_->offset;
}
DType Tensor::dtype() const {
  return impl_->dtype;
}
Device Tensor::device() const {
  return impl_->device;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl_->storage;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  TT_CHECK(d >= 0 && d < n, "dimension " + std::to_string(d) + " out of range for " + describe());
  return impl_->shape[d];
}

bool Tensor::is_contiguous() const {
  const Shape expected = contiguous_strides(impl_->shape);
  for (size_t i = 0; i < expected.size(); ++i) {
    if (impl_->shape[i] != 1 && impl_->strides[i] != expected[i]) return false;
  }
  return true;
}

void* Tensor::raw_data() const {
  TT_CHECK(defined(), "raw_data() on an undefined tensor");
  // ZeRO leaves a sharded parameter without storage where it is not gathered (and a matmul weight's f32
  // values without any in bf16 training): reading it then is a bug to report, not memory to read.
  TT_ASSERT(impl_->storage != nullptr, "raw_data() on " + describe() + ", which has no storage");
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * static_cast<int64_t>(dtype_size(impl_->dtype));
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " " + device().str();
}

Tensor Tensor::as_strided_view(const Shape& shape, const Shape& strides, int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  return Tensor(impl);
}

Tensor Tensor::view(const Shape& shape) const {
  TT_CHECK(is_contiguous(), "view() needs a contiguous tensor, got " + describe());
  Shape resolved = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      TT_CHECK(infer < 0, "view(): only one dimension may be -1");
      infer = static_cast<int64_t>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (infer >= 0) resolved[infer] = known == 0 ? 0 : numel() / known;
  TT_CHECK(shape_numel(resolved) == numel(),
           "view(): cannot view " + describe() + " as shape " + shape_str(shape));
  return as_strided_view(resolved, contiguous_strides(resolved), offset());
}

Tensor Tensor::transpose_view(int64_t d0, int64_t d1) const {
  const int64_t n = dim();
  if (d0 < 0) d0 += n;
  if (d1 < 0) d1 += n;
  TT_CHECK(d0 >= 0 && d0 < n && d1 >= 0 && d1 < n, "transpose: dimension out of range for " + describe());
  Shape shape = impl_->shape, strides = impl_->strides;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return as_strided_view(shape, strides, offset());
}

Tensor Tensor::narrow_view(int64_t d, int64_t start, int64_t length) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  TT_CHECK(d >= 0 && d < n, "narrow: dimension out of range for " + describe());
  TT_CHECK(start >= 0 && length >= 0 && start + length <= impl_->shape[d],
           "narrow: range [" + std::to_string(start) + ", " + std::to_string(start + length) +
               ") out of bounds for " + describe());
  Shape shape = impl_->shape;
  shape[d] = length;
  return as_strided_view(shape, impl_->strides, offset() + start * impl_->strides[d]);
}

namespace {
// Contiguous copy of `src` on its own device.
Tensor contiguous_copy(const Tensor& src) {
  Tensor out = Tensor::empty(src.shape(), src.dtype(), src.device());
  if (src.numel() == 0) return out;
  if (src.is_contiguous()) {
    copy_bytes(out.raw_data(), out.device(), src.raw_data(), src.device(), src.nbytes());
    return out;
  }
  const int ndim = static_cast<int>(src.dim());
  const int64_t elem = static_cast<int64_t>(dtype_size(src.dtype()));
  if (src.device().is_cpu()) {
    cpu::strided_copy(src.raw_data(), out.raw_data(), elem, ndim, src.shape().data(), src.strides().data());
  } else {
#ifdef TT_WITH_CUDA
    cuda::strided_copy(src.raw_data(), out.raw_data(), elem, ndim, src.shape().data(), src.strides().data(),
                       stream_of(src.device()));
#endif
  }
  return out;
}
}  // namespace

Tensor Tensor::clone() const {
  return contiguous_copy(*this);
}

Tensor Tensor::to(Device device) const {
  const Tensor src = is_contiguous() ? *this : contiguous_copy(*this);
  Tensor out = empty(shape(), dtype(), device);
  copy_bytes(out.raw_data(), device, src.raw_data(), src.device(), src.nbytes());
  return out;
}

void Tensor::copy_(const Tensor& src) {
  TT_CHECK(shape() == src.shape() && dtype() == src.dtype(),
           "copy_: destination " + describe() + " does not match source " + src.describe());
  TT_CHECK(is_contiguous(), "copy_: destination must be contiguous");
  const Tensor s = src.is_contiguous() ? src : contiguous_copy(src);
  copy_bytes(raw_data(), device(), s.raw_data(), s.device(), nbytes());
}

void Tensor::fill_(double value) {
  TT_CHECK(is_contiguous(), "fill_ needs a contiguous tensor");
  const int64_t n = numel();
  if (device().is_cpu()) {
    switch (dtype()) {
      case DType::f32:
        cpu::fill(data<float>(), n, value);
        break;
      case DType::f64:
        cpu::fill(data<double>(), n, value);
        break;
      case DType::i32:
        cpu::fill(data<int32_t>(), n, value);
        break;
      case DType::bf16: {
        const bf16 v(static_cast<float>(value));
        bf16* p = data<bf16>();
        for (int64_t i = 0; i < n; ++i) p[i] = v;
        break;
      }
    }
    return;
  }
#ifdef TT_WITH_CUDA
  if (value == 0.0 && !std::signbit(value) && n > 0) {
    // All-zero bits are zero in every dtype: a memset (gradient buffers are zeroed every step).
    TT_CUDA_CHECK(cudaMemsetAsync(raw_data(), 0, nbytes(), stream_of(device())));
    return;
  }
  switch (dtype()) {
    case DType::f32:
      cuda::fill(data<float>(), n, value, stream_of(device()));
      break;
    case DType::bf16: {
      const Tensor wide = Tensor::full(shape(), value, DType::f32, device());
      cuda::cast(wide.raw_data(), DType::f32, raw_data(), DType::bf16, n, stream_of(device()));
      break;
    }
    case DType::i32:
      cuda::fill_i32(data<int32_t>(), n, static_cast<int32_t>(value), stream_of(device()));
      break;
    default:
      throw Error(std::string("fill_ on CUDA supports f32, bf16 and i32, not ") + dtype_name(dtype()));
  }
#endif
}

std::vector<float> Tensor::to_floats() const {
  const Tensor host = device().is_cpu() && is_contiguous() ? *this : to(Device::cpu());
  std::vector<float> out(static_cast<size_t>(numel()));
  cpu::cast(host.raw_data(), dtype(), out.data(), DType::f32, numel());
  return out;
}

std::vector<double> Tensor::to_doubles() const {
  const Tensor host = device().is_cpu() && is_contiguous() ? *this : to(Device::cpu());
  std::vector<double> out(static_cast<size_t>(numel()));
  cpu::cast(host.raw_data(), dtype(), out.data(), DType::f64, numel());
  return out;
}

std::vector<int32_t> Tensor::to_ints() const {
  TT_CHECK(dtype() == DType::i32, "to_ints on a " + describe() + " tensor");
  const Tensor host = device().is_cpu() && is_contiguous() ? *this : to(Device::cpu());
  const int32_t* p = host.data<int32_t>();
  return std::vector<int32_t>(p, p + numel());
}

double Tensor::item() const {
  TT_CHECK(numel() == 1, "item() needs a single-element tensor, got " + describe());
  return to_doubles()[0];
}

bool Tensor::requires_grad() const {
  return impl_ && impl_->requires_grad;
}
Tensor& Tensor::set_requires_grad(bool value) {
  impl_->requires_grad = value;
  return *this;
}
Tensor Tensor::grad() const {
  return impl_->grad;
}
void Tensor::set_grad(const Tensor& grad) const {
  impl_->grad = grad;
  impl_->grad_zero_pass = TensorImpl::kNoZeroPass;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const {
  return impl_->grad_fn;
}
void Tensor::set_grad_fn(std::shared_ptr<Node> node) const {
  impl_->grad_fn = std::move(node);
}
uint64_t Tensor::register_grad_ready_hook(GradHook hook) const {
  const uint64_t handle = impl_->next_hook_handle++;
  impl_->grad_ready_hooks.emplace_back(handle, std::move(hook));
  return handle;
}
void Tensor::remove_grad_ready_hook(uint64_t handle) const {
  auto& hooks = impl_->grad_ready_hooks;
  hooks.erase(
      std::remove_if(hooks.begin(), hooks.end(), [handle](const auto& h) { return h.first == handle; }),
      hooks.end());
}
const Tensor& Tensor::low_precision_copy() const {
  return impl_->low_precision_copy;
}
void Tensor::set_low_precision_copy(const Tensor& copy) const {
  TT_ASSERT(!copy.defined() ||
                (copy.shape() == shape() && copy.device() == device() && copy.dtype() == DType::bf16),
            "set_low_precision_copy: " + (copy.defined() ? copy.describe() : std::string("?")) +
                " is not a bf16 tensor of the shape and device of " + describe());
  impl_->low_precision_copy = copy;
}

const std::string& Tensor::name() const {
  return impl_->name;
}
Tensor& Tensor::set_name(const std::string& name) {
  impl_->name = name;
  return *this;
}

void Tensor::backward(const Tensor& grad) const {
  run_backward(*this, grad);
}

}  // namespace tt
