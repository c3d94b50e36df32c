#include "core/pinned_upload.h"

#include <cstring>

#include "base/dtype.h"
#include "base/error.h"
#include "core/cuda_context.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt {

PinnedUpload::PinnedUpload(Device device, int slots) : device_(device) {
  TT_ASSERT(slots >= 1, "PinnedUpload needs a slot");
  if (device.is_cuda()) slots_.resize(static_cast<size_t>(slots));
}

PinnedUpload::~PinnedUpload() {
#ifdef TT_WITH_CUDA
  for (Slot& s : slots_) {
    // Errors are not thrown from a destructor; a failing CUDA runtime at exit has nothing left to lose.
    if (s.copied != nullptr) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(s.copied));
      cudaEventDestroy(static_cast<cudaEvent_t>(s.copied));
    }
    if (s.host != nullptr) cudaFreeHost(s.host);
  }
#endif
}

Tensor PinnedUpload::ints(const std::vector<int32_t>& values, const Shape& shape) {
  if (!device_.is_cuda()) return Tensor::from_ints(values, shape, device_);
  Tensor t = Tensor::empty(shape, DType::i32, device_);
  ints_into(values, t);  // checks the size against the shape
  return t;
}

void PinnedUpload::ints_into(const std::vector<int32_t>& values, Tensor& dst) {
  TT_ASSERT(dst.device() == device_ && dst.dtype() == DType::i32 && dst.is_contiguous() &&
                dst.numel() == static_cast<int64_t>(values.size()),
            "PinnedUpload::ints_into: the destination does not match the values");
  if (values.empty()) return;
  if (!device_.is_cuda()) {
    std::memcpy(dst.data<int32_t>(), values.data(), values.size() * sizeof(int32_t));
    return;
  }
#ifdef TT_WITH_CUDA
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  const size_t bytes = values.size() * sizeof(int32_t);
  if (s.copied == nullptr) {
    cudaEvent_t event = nullptr;
    TT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    s.copied = event;
  }
  TT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(s.copied)));  // the last copy from it is done
  if (s.capacity < bytes) {
    if (s.host != nullptr) TT_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    TT_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
    s.capacity = bytes;
  }
  std::memcpy(s.host, values.data(), bytes);
  const auto stream = static_cast<cudaStream_t>(compute_stream(device_.index));
  TT_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), s.host, bytes, cudaMemcpyHostToDevice, stream));
  TT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(s.copied), stream));
#endif
}

}  // namespace tt
