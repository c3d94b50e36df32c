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

// The GEMM every product goes through (core/ops_matmul.cpp): out = alpha * op(a) op(b) + beta * out for dense
// a, b of one dtype (2-D ones may have rows wider than their columns: slices of a wider matrix) and a dense
// `out` of the product's shape: f32/f64 for f32/f64 inputs; f32 or bf16 for bf16 inputs (bf16 only with
// beta = 0). With `addend` (dense, out's dtype and size), beta * addend is added instead of beta * out.
void gemm_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha, double beta,
               Tensor& out, const Tensor* addend = nullptr);
// The dtype of a product when the caller does not choose: f32 for bf16 inputs, else the inputs' own.
DType wide_dtype(DType in);
// The dtype of x's gradient from a product computed in `compute`: wide_dtype(x's), or with narrow_x_grad bf16
// where x and the product are bf16 (the GEMM rounds it once; for an x whose only consumer is that product).
DType input_grad_dtype(DType x, DType compute, bool narrow_x_grad);
// t in `dtype`: itself, the bf16 copy kept beside it (Tensor::low_precision_copy) when that is the dtype
// asked for, or else a cast.
Tensor in_dtype(const Tensor& t, DType dtype);

// Weights of one shape (n, in), in `compute`, as one (count * n, in) matrix: a view when they (or their bf16
// mirrors) lie one after another in one storage, as FlatParameters places a module's parameters, else a copy.
Tensor stacked_weights(const std::vector<Tensor>& weights, DType compute);

// The backward of y = x W^T (core/ops_matmul.cpp), shared by the ops built on it. g: y's gradient (rows, out)
// in the compute dtype (2-D, rows may be further apart than out); w (out, in) and x2 (rows, in): the operands
// as the forward used them.
// x's gradient g W for input `input` of `node`: added into the gradient collected for x so far
// (GradientRequest::into_collected) and an undefined tensor returned, when that buffer has x's shape and
// dx_dtype and the product is already in dx_dtype; else returned in dx_dtype (a bf16 one rounded by the GEMM
// itself) with x's shape.
Tensor linear_input_grad(Node& node, size_t input, const Tensor& g, const Tensor& w, DType dx_dtype,
                         const Shape& x_shape);
// W's gradient g^T x2 for input `input` of `node` (a leaf): taken in factored form by its consumer (an
// optimizer update fused into the matmul), or written into its .grad buffer (beta = 0 when that holds zeros;
// a bf16 one rounded once by the GEMM), which returns an undefined tensor; else returned in dw_dtype.
Tensor linear_weight_grad(Node& node, size_t input, const Tensor& g, const Tensor& x2, DType dw_dtype);

// Wraps a CUDA-only statement. Without CUDA no tensor can live on a GPU (allocation fails first), so the
// branch that holds it is unreachable there and the statement compiles away.
#ifdef TT_WITH_CUDA
#define TT_CUDA_ONLY(...) __VA_ARGS__
#else
#define TT_CUDA_ONLY(...) throw Error("this build has no CUDA support")
#endif

}  // namespace tt::detail
