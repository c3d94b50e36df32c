// Helpers shared by the op implementations (not part of the public API).
#pragma once

#include <string>

#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::detail {

#ifdef TT_WITH_CUDA
inline cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(compute_stream(t.device().index));
}
#endif

// The kernels take dense buffers: `t` itself when it already is one, else a dense copy.
inline Tensor dense(const Tensor& t) {
  return t.is_contiguous() ? t : t.clone();
}

// Calls fn(T{}) with T = float or double for f32/f64 tensors on the CPU.
template <class Fn>
void dispatch_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      fn(float{});
      return;
    case DType::f64:
      fn(double{});
      return;
    default:
      throw Error(std::string(op) + ": unsupported dtype " + dtype_name(dtype));
  }
}

inline void require_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device()) {
    throw Error(std::string(op) + ": inputs on different devices (" + a.describe() + " and " + b.describe() +
                ")");
  }
}

inline void require_cuda_f32(const Tensor& t, const char* op) {
  if (t.dtype() != DType::f32) {
    throw Error(std::string(op) + " on CUDA supports f32 tensors, got " + t.describe());
  }
}

// Wraps a CUDA-only statement. Without CUDA no tensor can live on a GPU (allocation fails first), so the
// branch that holds it is unreachable there and the statement compiles away.
#ifdef TT_WITH_CUDA
#define TT_CUDA_ONLY(...) __VA_ARGS__
#else
#define TT_CUDA_ONLY(...) throw Error("this build has no CUDA support")
#endif

}  // namespace tt::detail
