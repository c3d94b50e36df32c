// Matrix products: batched row-major GEMM on Eigen (CPU) or cuBLASLt (CUDA), and their gradients.
#include <cstring>

#include "core/ops_internal.h"
#include "core/recompute.h"

namespace tt::detail {

namespace {

struct GemmArgs {
  int64_t batch, m, n, k;
};

GemmArgs gemm_args(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  TT_CHECK(a.dim() >= 2 && b.dim() >= 2,
           "matmul needs at least 2-D inputs, got " + a.describe() + " and " + b.describe());
  TT_CHECK(a.dim() == b.dim(),
           "matmul: inputs must have the same number of dims, got " + a.describe() + " and " + b.describe());
  for (int64_t d = 0; d + 2 < a.dim(); ++d) {
    TT_CHECK(a.size(d) == b.size(d), "matmul: batch dims differ: " + a.describe() + " and " + b.describe());
  }
  GemmArgs g;
  g.m = trans_a ? a.size(-1) : a.size(-2);
  g.k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  g.n = trans_b ? b.size(-2) : b.size(-1);
  TT_CHECK(g.k == kb, "matmul: inner dimensions differ: " + a.describe() + " and " + b.describe());
  g.batch = a.numel() / std::max<int64_t>(1, a.size(-1) * a.size(-2));
  return g;
}

// The distance between rows of a GEMM operand: a 2-D operand may have rows wider than its columns (a slice of
// a wider matrix, such as one projection's columns of a fused q|k|v product); batched ones are dense.
int64_t row_stride(const Tensor& t) {
  if (t.dim() == 2) {
    TT_CHECK(t.strides()[1] == 1 && t.strides()[0] >= t.size(1),
             "matmul: a 2-D operand needs unit column stride, got " + t.describe());
    return t.strides()[0];
  }
  return t.size(-1);
}

}  // namespace

// out = alpha * op(a) op(b) + beta * out, for dense a, b of one dtype (2-D ones may be row-strided) and a
// dense `out` of the product's shape: f32/f64 for f32/f64 inputs; f32 or bf16 for bf16 inputs (bf16 only
// with beta = 0). With `addend` (dense, out's dtype and size), beta * addend is added instead of beta * out.
void gemm_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha, double beta,
               Tensor& out, const Tensor* addend) {
  const GemmArgs g = gemm_args(a, b, trans_a, trans_b);
  TT_CHECK(out.is_contiguous() && out.numel() == g.batch * g.m * g.n,
           "matmul: output " + out.describe() + " does not fit the product");
  if (addend != nullptr) {
    TT_CHECK(addend->is_contiguous() && addend->numel() == out.numel() && addend->dtype() == out.dtype(),
             "matmul: addend " + addend->describe() + " does not match the output " + out.describe());
    if (!a.device().is_cuda()) {
      // The CPU twin: the addend copied into the output, the product added to it.
      std::memcpy(out.raw_data(), addend->raw_data(), out.nbytes());
      addend = nullptr;
    }
  }
  const int64_t lda = row_stride(a), ldb = row_stride(b), ldc = g.n;
  const int64_t sa = a.size(-1) * a.size(-2), sb = b.size(-1) * b.size(-2), sc = g.m * g.n;
  const bool mixed = a.dtype() == DType::bf16;
  TT_CHECK(out.dtype() == a.dtype() || (mixed && out.dtype() == DType::f32),
           "matmul: output dtype " + std::string(dtype_name(out.dtype())) + " for " + dtype_name(a.dtype()) +
               " inputs");
  TT_CHECK(beta == 0.0 || out.dtype() != DType::bf16, "matmul: a bf16 output cannot be accumulated into");
  if (a.device().is_cuda()) {
    TT_CHECK(a.dtype() == DType::f32 || mixed, "matmul on CUDA supports f32 and bf16 inputs");
    TT_CUDA_ONLY(cuda::gemm(trans_a, trans_b, g.m, g.n, g.k, static_cast<float>(alpha), a.raw_data(), lda, sa,
                            b.raw_data(), ldb, sb, a.dtype(), static_cast<float>(beta), out.raw_data(),
                            out.dtype(), ldc, sc, g.batch, detail::stream_of(a),
                            addend != nullptr ? addend->raw_data() : nullptr));
  } else if (mixed) {
    // The CPU twin of a bf16 output: the f32 product, rounded to bf16 once (as the GPU epilogue does).
    Tensor wide = out.dtype() == DType::f32 ? out : Tensor::empty(out.shape(), DType::f32, out.device());
    cpu::gemm_bf16(trans_a, trans_b, g.m, g.n, g.k, static_cast<float>(alpha), a.data<bf16>(), lda, sa,
                   b.data<bf16>(), ldb, sb, static_cast<float>(beta), wide.data<float>(), ldc, sc, g.batch);
    if (out.dtype() == DType::bf16)
      cpu::cast(wide.raw_data(), DType::f32, out.raw_data(), DType::bf16, out.numel());
  } else {
    detail::dispatch_float(a.dtype(), "matmul", [&](auto t) {
      using T = decltype(t);
      cpu::gemm<T>(trans_a, trans_b, g.m, g.n, g.k, static_cast<T>(alpha), a.data<T>(), lda, sa, b.data<T>(),
                   ldb, sb, static_cast<T>(beta), out.data<T>(), ldc, sc, g.batch);
    });
  }
}

// The dtype of a product when the caller does not choose: f32 for bf16 inputs (f32 accumulation), else the
// inputs' own.
DType wide_dtype(DType in) {
  return in == DType::bf16 ? DType::f32 : in;
}

DType input_grad_dtype(DType x, DType compute, bool narrow_x_grad) {
  return narrow_x_grad && x == DType::bf16 && compute == DType::bf16 ? DType::bf16 : wide_dtype(x);
}

// t in `dtype`: itself, the bf16 copy kept beside it (Tensor::low_precision_copy: a weight's mirror, a
// residual gradient's copy from RMSNorm) when that is the dtype asked for, or else a cast.
Tensor in_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  const Tensor& kept = t.low_precision_copy();
  return kept.defined() && kept.dtype() == dtype ? kept : ops::cast(t, dtype);
}

}  // namespace tt::detail

namespace tt::ops {

using detail::gemm_args;
using detail::gemm_into;
using detail::GemmArgs;
using detail::in_dtype;
using detail::wide_dtype;

namespace {

// out = alpha * op(a) op(b), out allocated here.
Tensor matmul_raw(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b, double alpha,
                  DType out_dtype) {
  detail::require_same_device(a_in, b_in, "matmul");
  TT_CHECK(a_in.dtype() == b_in.dtype(),
           "matmul: input dtypes differ: " + a_in.describe() + " and " + b_in.describe());
  const Tensor a = detail::dense(a_in);
  const Tensor b = detail::dense(b_in);
  const GemmArgs g = gemm_args(a, b, trans_a, trans_b);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(g.m);
  out_shape.push_back(g.n);
  Tensor out = Tensor::empty(out_shape, out_dtype, a.device());
  gemm_into(a, b, trans_a, trans_b, alpha, 0.0, out);
  return out;
}

Tensor matmul_raw(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  return matmul_raw(a, b, trans_a, trans_b, alpha, wide_dtype(a.dtype()));
}

struct MatmulNode : Node {
  Tensor a, b;
  bool trans_a = false, trans_b = false;
  double alpha = 1.0;
  const char* name() const override { return "Matmul"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    // The gradient meets the inputs in their precision (bf16 stays bf16, accumulating in f32).
    const Tensor g = a.dtype() == DType::bf16 ? cast(grad, DType::bf16) : grad;
    Tensor da, db;
    if (next[0]) {
      da = trans_a ? matmul_raw(b, g, trans_b, true, alpha) : matmul_raw(g, b, false, !trans_b, alpha);
    }
    if (next[1]) {
      db = trans_b ? matmul_raw(g, a, true, trans_a, alpha) : matmul_raw(a, g, !trans_a, false, alpha);
    }
    return {da, db};
  }
  void release_saved() override { a = b = Tensor(); }
};

// y = x W^T with the operands saved in the compute dtype. The weight's gradient g^T x goes straight into the
// weight's .grad buffer (GEMM with beta = 1, or 0 when the buffer is known to hold zeros; a bf16 buffer only
// when it holds zeros) when the weight is a leaf that has one, as FlatParameters arranges: no temporary, no
// separate add; the accumulator still runs, so grad-ready hooks fire as usual.
struct LinearNode : Node {
  Tensor x2, w;  // (rows, in) and (out, in)
  Shape x_shape;
  DType dx_dtype = DType::f32, dw_dtype = DType::f32;
  bool residual = false;  // a third input added to the product (linear_residual): its gradient is grad
  const char* name() const override { return "Linear"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    const int64_t out_features = w.size(0);
    const Tensor g = reshape(detail::dense(in_dtype(grad, w.dtype())), {x2.size(0), out_features});
    Tensor dx, dw;
    if (next[0]) dx = detail::linear_input_grad(*this, 0, g, w, dx_dtype, x_shape);
    if (next[1]) dw = detail::linear_weight_grad(*this, 1, g, x2, dw_dtype);
    if (residual) return {dx, dw, grad};
    return {dx, dw};
  }
  void release_saved() override { x2 = w = Tensor(); }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  Tensor out = matmul_raw(a, b, trans_a, trans_b, alpha);
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<MatmulNode>();
    node->a = a;
    node->b = b;
    node->trans_a = trans_a;
    node->trans_b = trans_b;
    node->alpha = alpha;
    attach_node(out, node, {&a, &b});
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight) {
  // Like matmul: bf16 operands give an f32 result.
  return linear(x, weight, weight.dtype(), wide_dtype(weight.dtype()));
}

namespace {
// y = x W^T in `out`, computed in `compute`; with a residual (out's dtype, y's shape) y = residual + x W^T,
// the residual added by the GEMM's epilogue and its gradient the incoming one. `op` names the caller in
// errors.
Tensor linear_impl(const char* op, const Tensor& x, const Tensor& weight, DType compute, DType out,
                   const Tensor* residual, bool narrow_x_grad, const Tensor& sum_into = Tensor()) {
  const std::string name(op);
  TT_CHECK(weight.dim() == 2, name + ": weight must be 2-D, got " + weight.describe());
  TT_CHECK(x.size(-1) == weight.size(1), name + ": input features " + std::to_string(x.size(-1)) +
                                             " do not match weight " + weight.describe());
  detail::require_same_device(x, weight, op);
  TT_CHECK(compute == weight.dtype() || compute == DType::bf16,
           name + ": computes in the weight's dtype or in bf16, not " + dtype_name(compute));
  const int64_t in = weight.size(1), rows = x.numel() / std::max<int64_t>(1, in);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(weight.size(0));
  if (residual != nullptr) {
    detail::require_same_device(x, *residual, op);
    TT_CHECK(residual->shape() == out_shape && residual->dtype() == out,
             name + ": the residual must be " + dtype_name(out) + " " + shape_str(out_shape) + ", got " +
                 residual->describe());
    if (sum_into.defined()) {
      TT_CHECK(sum_into.shape() == out_shape && sum_into.dtype() == out && sum_into.device() == x.device() &&
                   sum_into.is_contiguous() && !sum_into.requires_grad() && sum_into.is_leaf() &&
                   sum_into.raw_data() != residual->raw_data(),
               name + ": sum_into must be a dense " + dtype_name(out) + " " + shape_str(out_shape) +
                   " tensor on the input's device outside autograd, apart from the residual, got " +
                   sum_into.describe());
    }
  }
  const bool record = residual != nullptr ? needs_grad({&x, &weight, residual}) : needs_grad({&x, &weight});
  Tensor x2, w, y;
  {
    // The operands in the compute dtype; these casts are part of this op, not nodes of their own.
    NoGradGuard no_grad;
    x2 = reshape(detail::dense(x.dtype() == compute ? x : cast(x, compute)), {rows, in});
    // A kept-current bf16 copy of the weight (FlatParameters' mirror) saves the cast.
    w = detail::dense(in_dtype(weight, compute));
    std::vector<Tensor> kept;
    if (detail::kept_results(op, weight, kept)) {
      y = kept[0];  // a selective recomputation's second run (core/recompute.h)
      TT_ASSERT(y.shape() == out_shape && y.dtype() == out, name + ": a kept result of another shape");
    } else if (sum_into.defined()) {
      y = sum_into;  // holds the residual already: the GEMM adds into its own output
      gemm_into(x2, w, false, true, 1.0, 1.0, y);
    } else if (residual != nullptr) {
      const Tensor r = detail::dense(*residual);
      y = Tensor::empty(out_shape, out, x.device());
      gemm_into(x2, w, false, true, 1.0, 1.0, y, &r);
    } else {
      y = reshape(matmul_raw(x2, w, false, true, 1.0, out), out_shape);
    }
    if (kept.empty()) detail::keep_results(op, weight, y);
  }
  if (record) {
    auto node = std::make_shared<LinearNode>();
    node->x2 = x2;
    node->w = w;
    node->x_shape = x.shape();
    node->dx_dtype = detail::input_grad_dtype(x.dtype(), compute, narrow_x_grad);
    node->dw_dtype = weight.dtype();
    node->residual = residual != nullptr;
    if (residual != nullptr) {
      attach_node(y, node, {&x, &weight, residual});
    } else {
      attach_node(y, node, {&x, &weight});
    }
  }
  return y;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, DType compute, DType out, bool narrow_x_grad) {
  return linear_impl("linear", x, weight, compute, out, nullptr, narrow_x_grad);
}

Tensor linear_residual(const Tensor& residual, const Tensor& x, const Tensor& weight, DType compute,
                       bool narrow_x_grad, const Tensor& sum_into) {
  return linear_impl("linear_residual", x, weight, compute, wide_dtype(compute), &residual, narrow_x_grad,
                     sum_into);
}

}  // namespace tt::ops

namespace tt::detail {

Tensor linear_input_grad(Node& node, size_t input, const Tensor& g, const Tensor& w, DType dx_dtype,
                         const Shape& x_shape) {
  // The product's own wide dtype, then x's if x came in another (an f64 x against f32 weights).
  const DType product = wide_dtype(w.dtype());
  if (product == dx_dtype) {
    GradientRoute route = node.route_gradient(input, GradientRequest::collected(x_shape, dx_dtype));
    if (route.kind == GradientRoute::Kind::into_buffer) {
      // Added into the gradient already collected for x (beta = 1): the inputs of q, k and v, of w1 and w3
      // sum their gradients without a separate addition.
      gemm_into(g, w, false, false, 1.0, 1.0, route.buffer);
      node.routed(input, route);
      return Tensor();
    }
  }
  // A bf16 dx is rounded by the GEMM itself (the same single rounding a cast would do).
  Tensor dx =
      Tensor::empty({g.size(0), w.size(1)}, dx_dtype == DType::bf16 ? DType::bf16 : product, w.device());
  gemm_into(g, w, false, false, 1.0, 0.0, dx);
  if (dx.dtype() != dx_dtype) dx = ops::cast(dx, dx_dtype);
  return ops::reshape(dx, x_shape);
}

Tensor stacked_weights(const std::vector<Tensor>& weights, DType compute) {
  TT_ASSERT(!weights.empty(), "stacked_weights: no weights");
  std::vector<Tensor> w;
  for (const Tensor& t : weights) w.push_back(in_dtype(t, compute));
  const int64_t n = w[0].size(0), in = w[0].size(1), count = static_cast<int64_t>(w.size());
  bool adjacent = true;
  for (size_t i = 0; i < w.size() && adjacent; ++i) {
    adjacent = w[i].is_contiguous() && w[i].storage() == w[0].storage() &&
               w[i].offset() == w[0].offset() + static_cast<int64_t>(i) * w[0].numel();
  }
  if (adjacent) return w[0].as_strided_view({count * n, in}, {in, 1}, w[0].offset());
  Tensor stacked = Tensor::empty({count * n, in}, compute, w[0].device());
  for (int64_t i = 0; i < count; ++i) stacked.narrow_view(0, i * n, n).copy_(w[static_cast<size_t>(i)]);
  return stacked;
}

Tensor linear_weight_grad(Node& node, size_t input, const Tensor& g, const Tensor& x2, DType dw_dtype) {
  const Shape w_shape{g.size(1), x2.size(1)};
  // A bf16 .grad of an f32 weight computed in bf16 (FlatParameters::set_grad_dtype) takes the product rounded
  // once by the GEMM's epilogue (which needs bf16 operands), when it holds zeros; otherwise the accumulator
  // adds.
  GradientRequest request = GradientRequest::leaf(w_shape, dw_dtype, /*or_bf16=*/g.dtype() == DType::bf16);
  request.dy = &g;  // an optimizer update fused into the matmul may take dW = g^T x2 as it is
  request.x = &x2;
  GradientRoute route = node.route_gradient(input, request);
  if (route.kind == GradientRoute::Kind::taken) return Tensor();
  if (route.kind == GradientRoute::Kind::into_buffer) {
    // Overwrite a buffer known to hold zeros (no read of it), else add.
    gemm_into(g, x2, true, false, 1.0, route.overwrite ? 0.0 : 1.0, route.buffer);
    node.routed(input, route);
    return Tensor();
  }
  // The product in dw_dtype where the GEMM can write it, else in its wide dtype, then cast.
  const DType product =
      dw_dtype == DType::bf16 && g.dtype() == DType::bf16 ? dw_dtype : wide_dtype(g.dtype());
  Tensor dw = Tensor::empty(w_shape, product, g.device());
  gemm_into(g, x2, true, false, 1.0, 0.0, dw);
  return dw.dtype() == dw_dtype ? dw : ops::cast(dw, dw_dtype);
}

}  // namespace tt::detail
