// Matrix products: batched row-major GEMM on Eigen (CPU) or cuBLASLt (CUDA), and their gradients.
#include "core/ops_internal.h"

namespace tt::ops {

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

// out = alpha * op(a) op(b), out allocated here (f32 for bf16 inputs).
Tensor matmul_raw(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b, double alpha) {
  detail::require_same_device(a_in, b_in, "matmul");
  TT_CHECK(a_in.dtype() == b_in.dtype(),
           "matmul: input dtypes differ: " + a_in.describe() + " and " + b_in.describe());
  const Tensor a = detail::dense(a_in);
  const Tensor b = detail::dense(b_in);
  const GemmArgs g = gemm_args(a, b, trans_a, trans_b);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(g.m);
  out_shape.push_back(g.n);
  const DType out_dtype = a.dtype() == DType::bf16 ? DType::f32 : a.dtype();
  Tensor out = Tensor::empty(out_shape, out_dtype, a.device());
  const int64_t lda = a.size(-1), ldb = b.size(-1), ldc = g.n;
  const int64_t sa = a.size(-1) * a.size(-2), sb = b.size(-1) * b.size(-2), sc = g.m * g.n;
  if (a.device().is_cuda()) {
    TT_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::bf16,
             "matmul on CUDA supports f32 and bf16 inputs");
    TT_CUDA_ONLY(cuda::gemm(trans_a, trans_b, g.m, g.n, g.k, static_cast<float>(alpha), a.raw_data(), lda, sa,
                            b.raw_data(), ldb, sb, a.dtype(), 0.0f, out.data<float>(), ldc, sc, g.batch,
                            detail::stream_of(a)));
  } else if (a.dtype() == DType::bf16) {
    cpu::gemm_bf16(trans_a, trans_b, g.m, g.n, g.k, static_cast<float>(alpha), a.data<bf16>(), lda, sa,
                   b.data<bf16>(), ldb, sb, 0.0f, out.data<float>(), ldc, sc, g.batch);
  } else {
    detail::dispatch_float(a.dtype(), "matmul", [&](auto t) {
      using T = decltype(t);
      cpu::gemm<T>(trans_a, trans_b, g.m, g.n, g.k, static_cast<T>(alpha), a.data<T>(), lda, sa, b.data<T>(),
                   ldb, sb, T(0), out.data<T>(), ldc, sc, g.batch);
    });
  }
  return out;
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
  TT_CHECK(weight.dim() == 2, "linear: weight must be 2-D, got " + weight.describe());
  TT_CHECK(x.size(-1) == weight.size(1), "linear: input features " + std::to_string(x.size(-1)) +
                                             " do not match weight " + weight.describe());
  const Tensor x2 = reshape(x, {-1, x.size(-1)});
  const Tensor y2 = matmul(x2, weight, false, true);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(weight.size(0));
  return reshape(y2, out_shape);
}

}  // namespace tt::ops
