// The model's ops: embedding, RMSNorm, RoPE, SwiGLU gate, masked softmax and cross-entropy.
#include <cmath>

#include "core/ops_internal.h"
#include "core/recompute.h"

namespace tt::ops {

using detail::dispatch_float;

namespace {

// ---------------------------------------------------------------------------------------------- embedding
struct EmbeddingNode : Node {
  Tensor ids;
  Shape weight_shape;
  DType dtype = DType::f32;
  const char* name() const override { return "Embedding"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    const Tensor g = detail::dense(grad);
    Tensor dw = Tensor::zeros(weight_shape, dtype, g.device());
    const int64_t n = ids.numel(), dim = weight_shape[1];
    if (g.device().is_cuda()) {
      TT_CUDA_ONLY(cuda::embedding_backward(g.data<float>(), ids.data<int32_t>(), dw.data<float>(), n, dim,
                                            detail::stream_of(g)));
    } else {
      dispatch_float(dtype, "embedding", [&](auto t) {
        using T = decltype(t);
        cpu::embedding_backward(g.data<T>(), ids.data<int32_t>(), dw.data<T>(), n, dim);
      });
    }
    return {dw};
  }
  void release_saved() override { ids = Tensor(); }
};

// ------------------------------------------------------------------------------------------------ RMSNorm
struct RmsNormNode : Node {
  Tensor x, weight, inv_rms;
  // The output was bf16, so the model computes in bf16: x's gradient (a residual stream's) then feeds the
  // previous sublayer's bf16 matmul, and the CUDA kernel hands it a bf16 copy as well (low_precision_copy),
  // which saves that matmul a cast.
  bool bf16_dx_copy = false;
  const char* name() const override { return "RMSNorm"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    // A bf16 gradient (from bf16 consumers that round theirs, as autocast's matmuls do) is read as it is by
    // the CUDA kernel and widened exactly; the CPU widens it first, which gives the same values.
    const bool bf16_grad_on_cuda = x.device().is_cuda() && grad.dtype() == DType::bf16;
    const Tensor g =
        detail::dense(grad.dtype() == x.dtype() || bf16_grad_on_cuda ? grad : cast(grad, x.dtype()));
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    // x's gradient added into the one already collected for x (the residual stream's), when there is one.
    GradientRoute dx_route;
    if (next[0]) dx_route = route_gradient(0, GradientRequest::collected(x.shape(), x.dtype()));
    const bool into_pending = dx_route.kind == GradientRoute::Kind::into_buffer;
    Tensor pending = dx_route.buffer;
    Tensor dx =
        into_pending && x.device().is_cuda() ? pending : Tensor::empty(x.shape(), x.dtype(), x.device());
    // The weight's gradient written straight into its .grad when that holds zeros (FlatParameters): in the
    // weight's dtype, or rounded once into a bf16 buffer (FlatParameters::set_grad_dtype).
    GradientRoute dw_route;
    if (next[1]) {
      GradientRequest request = GradientRequest::leaf(weight.shape(), weight.dtype(), /*or_bf16=*/true);
      request.leaf_only_if_zero = true;
      dw_route = route_gradient(1, request);
    }
    const bool direct_dw = dw_route.kind == GradientRoute::Kind::into_buffer;
    Tensor dw = direct_dw ? dw_route.buffer : Tensor::empty(weight.shape(), weight.dtype(), weight.device());
    Tensor copy;
    if (x.device().is_cuda()) {
      if (bf16_dx_copy) copy = Tensor::empty(x.shape(), DType::bf16, x.device());
      TT_CUDA_ONLY(cuda::rms_norm_backward(g.raw_data(), g.dtype(), x.data<float>(), weight.data<float>(),
                                           inv_rms.data<float>(), dx.data<float>(), dw.raw_data(), rows, dim,
                                           detail::stream_of(x), into_pending, dw.dtype(),
                                           copy.defined() ? copy.raw_data() : nullptr));
    } else {
      // A bf16 target takes the wide gradient rounded once, as on the GPU.
      Tensor dw_wide =
          dw.dtype() == weight.dtype() ? dw : Tensor::empty(weight.shape(), weight.dtype(), x.device());
      dispatch_float(x.dtype(), "rms_norm", [&](auto t) {
        using T = decltype(t);
        cpu::rms_norm_backward(g.data<T>(), x.data<T>(), weight.data<T>(), inv_rms.data<T>(), dx.data<T>(),
                               dw_wide.data<T>(), rows, dim);
      });
      if (dw_wide.raw_data() != dw.raw_data()) cast_into(dw, dw_wide);
      if (into_pending) add_into(pending, dx);  // the engine's own sum, done here
    }
    if (direct_dw) routed(1, dw_route);
    if (into_pending) routed(0, dx_route);
    Tensor dx_out = into_pending ? Tensor() : reshape(dx, x.shape());
    if (copy.defined()) (into_pending ? pending : dx_out).set_low_precision_copy(copy);
    return {dx_out, direct_dw ? Tensor() : dw};
  }
  void release_saved() override { x = weight = inv_rms = Tensor(); }
};

// --------------------------------------------------------------------------------------------------- RoPE
// y in `out` (x's dtype, or bf16 from f32): computed in f32 (f64 for f64) and rounded once. starts
// (optional, dense i32 (batch) on x's device): row b's positions start there (rope_at).
Tensor rope_raw(const Tensor& x, int64_t d_head, double theta, bool inverse, DType out,
                const Tensor& starts = Tensor()) {
  TT_CHECK(x.dim() == 3, "rope expects (batch, seq, heads*d_head), got " + x.describe());
  TT_CHECK(d_head % 2 == 0 && x.size(2) % d_head == 0, "rope: feature dim " + std::to_string(x.size(2)) +
                                                           " is not a multiple of an even d_head " +
                                                           std::to_string(d_head));
  const Tensor xc = detail::dense(x);
  Tensor y = Tensor::empty(x.shape(), out, x.device());
  if (x.device().is_cuda()) {
    TT_CUDA_ONLY(cuda::rope(xc.raw_data(), x.dtype(), y.raw_data(), out, x.size(0), x.size(1), x.size(2),
                            d_head, theta, inverse, detail::stream_of(x), 0, 0,
                            starts.defined() ? starts.data<int32_t>() : nullptr));
  } else if (x.dtype() == DType::bf16 || out == DType::bf16) {
    // The CPU twin of a bf16 side: widen exactly, rotate in f32, round once (casts inside the op, not nodes).
    NoGradGuard no_grad;
    const Tensor wide = rope_raw(x.dtype() == DType::f32 ? xc : cast(xc, DType::f32), d_head, theta, inverse,
                                 DType::f32, starts);
    return out == DType::f32 ? wide : cast(wide, out);
  } else {
    dispatch_float(x.dtype(), "rope", [&](auto t) {
      using T = decltype(t);
      cpu::rope(xc.data<T>(), y.data<T>(), x.size(0), x.size(1), x.size(2), d_head, theta, inverse, 0, 0,
                starts.defined() ? starts.data<int32_t>() : nullptr);
    });
  }
  return y;
}

struct RopeNode : Node {
  int64_t d_head = 0;
  double theta = 10000.0;
  DType grad_dtype = DType::f32;  // x's dtype, or bf16 when the output was bf16
  const char* name() const override { return "RoPE"; }
  // A rotation's gradient is the inverse rotation of the incoming gradient.
  std::vector<Tensor> apply(const Tensor& grad) override {
    return {rope_raw(grad, d_head, theta, true, grad_dtype)};
  }
};

// ------------------------------------------------------------------------------------------------- SwiGLU
struct SwiGluNode : Node {
  Tensor a, b;
  const char* name() const override { return "SwiGLU"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor da = Tensor::empty(a.shape(), a.dtype(), a.device());
    Tensor db = Tensor::empty(b.shape(), b.dtype(), b.device());
    if (a.device().is_cuda()) {
      const Tensor g = detail::dense(grad);
      TT_CUDA_ONLY(cuda::swiglu_backward(g.raw_data(), g.dtype(), a.raw_data(), b.raw_data(), da.raw_data(),
                                         db.raw_data(), a.dtype(), a.numel(), detail::stream_of(a)));
    } else if (a.dtype() == DType::bf16) {
      // CPU twin of the bf16 kernel: f32 arithmetic on the stored values, results rounded once.
      const Tensor g = detail::dense(grad.dtype() == DType::f32 ? grad : cast(grad, DType::f32));
      const Tensor af = cast(a, DType::f32), bf = cast(b, DType::f32);
      Tensor daf = Tensor::empty(a.shape(), DType::f32, a.device());
      Tensor dbf = Tensor::empty(b.shape(), DType::f32, b.device());
      cpu::swiglu_backward(g.data<float>(), af.data<float>(), bf.data<float>(), daf.data<float>(),
                           dbf.data<float>(), a.numel());
      cpu::cast(daf.raw_data(), DType::f32, da.raw_data(), DType::bf16, a.numel());
      cpu::cast(dbf.raw_data(), DType::f32, db.raw_data(), DType::bf16, b.numel());
    } else {
      const Tensor g = detail::dense(grad.dtype() == a.dtype() ? grad : cast(grad, a.dtype()));
      dispatch_float(a.dtype(), "swiglu", [&](auto t) {
        using T = decltype(t);
        cpu::swiglu_backward(g.data<T>(), a.data<T>(), b.data<T>(), da.data<T>(), db.data<T>(), a.numel());
      });
    }
    return {da, db};
  }
  void release_saved() override { a = b = Tensor(); }
};

// ---------------------------------------------------------------- SwiGLU over one matmul's two blocks
// ab (rows, 2n) holds a | b, the two projections side by side as one matmul over stacked weights wrote them.

// out (rows, n) = silu(a) * b.
void swiglu_rows_forward(const Tensor& ab, Tensor& out) {
  const int64_t rows = out.size(0), n = out.size(1);
  if (ab.device().is_cuda()) {
    TT_CUDA_ONLY(
        cuda::swiglu_forward_rows(ab.raw_data(), out.raw_data(), ab.dtype(), rows, n, detail::stream_of(ab)));
    return;
  }
  // A bf16 side: widened exactly, computed in f32 and rounded once, as the GPU does.
  const bool bf16 = ab.dtype() == DType::bf16;
  const Tensor wide = bf16 ? cast(ab, DType::f32) : ab;
  Tensor wide_out = bf16 ? Tensor::empty(out.shape(), DType::f32, out.device()) : out;
  dispatch_float(wide.dtype(), "swiglu_projection", [&](auto t) {
    using T = decltype(t);
    for (int64_t r = 0; r < rows; ++r) {
      const T* a = wide.data<T>() + r * 2 * n;
      cpu::swiglu_forward(a, a + n, wide_out.data<T>() + r * n, n);
    }
  });
  if (bf16) cpu::cast(wide_out.raw_data(), DType::f32, out.raw_data(), DType::bf16, out.numel());
}

// dab (rows, 2n) = da | db from g (rows, n: ab's dtype, or f32).
void swiglu_rows_backward(const Tensor& g, const Tensor& ab, Tensor& dab) {
  const int64_t rows = g.size(0), n = g.size(1);
  if (ab.device().is_cuda()) {
    TT_CUDA_ONLY(cuda::swiglu_backward_rows(g.raw_data(), g.dtype(), ab.raw_data(), dab.raw_data(),
                                            ab.dtype(), rows, n, detail::stream_of(ab)));
    return;
  }
  const bool bf16 = ab.dtype() == DType::bf16;
  const Tensor wide = bf16 ? cast(ab, DType::f32) : ab;
  const Tensor gw = g.dtype() == wide.dtype() ? g : cast(g, wide.dtype());
  Tensor wide_out = bf16 ? Tensor::empty(dab.shape(), DType::f32, dab.device()) : dab;
  dispatch_float(wide.dtype(), "swiglu_projection", [&](auto t) {
    using T = decltype(t);
    for (int64_t r = 0; r < rows; ++r) {
      const T* a = wide.data<T>() + r * 2 * n;
      T* da = wide_out.data<T>() + r * 2 * n;
      cpu::swiglu_backward(gw.data<T>() + r * n, a, a + n, da, da + n, n);
    }
  });
  if (bf16) cpu::cast(wide_out.raw_data(), DType::f32, dab.raw_data(), DType::bf16, dab.numel());
}

struct SwigluProjectionNode : Node {
  Tensor x2, ab;  // x2 (rows, in) and ab (rows, 2n) in the compute dtype
  // The two weights in the compute dtype, stacked again in backward: a saved stacked view would hold their
  // storage, which ZeRO-3 releases after the forward and gathers anew before the backward (re-pointing these
  // very tensors).
  Tensor w1, w3;
  Shape x_shape;
  DType dx_dtype = DType::f32, dw_dtype = DType::f32;
  const char* name() const override { return "SwigluProjection"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    const int64_t rows = ab.size(0), n = ab.size(1) / 2;
    const Tensor g = reshape(detail::dense(grad), {rows, n});
    Tensor dab = Tensor::empty(ab.shape(), ab.dtype(), ab.device());
    swiglu_rows_backward(g, ab, dab);
    std::vector<Tensor> out(3);
    // One input-gradient product over both weights' 2n columns; each weight's gradient is its n columns of
    // dab (rows 2n apart) against x.
    if (next[0]) {
      out[0] = detail::linear_input_grad(*this, 0, dab, detail::stacked_weights({w1, w3}, ab.dtype()),
                                         dx_dtype, x_shape);
    }
    for (size_t i = 0; i < 2; ++i) {
      if (next[i + 1]) {
        out[i + 1] = detail::linear_weight_grad(
            *this, i + 1, dab.narrow_view(1, static_cast<int64_t>(i) * n, n), x2, dw_dtype);
      }
    }
    return out;
  }
  void release_saved() override { x2 = ab = w1 = w3 = Tensor(); }
};

// ------------------------------------------------------------------------------------------------ softmax
struct SoftmaxNode : Node {
  Tensor p;
  double scale = 1.0;
  const char* name() const override { return "Softmax"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    const Tensor g = detail::dense(grad);
    Tensor ds = Tensor::empty(p.shape(), p.dtype(), p.device());
    const int64_t cols = p.size(-1), rows = p.size(-2), batch = p.numel() / (rows * cols);
    if (p.device().is_cuda()) {
      TT_CUDA_ONLY(cuda::softmax_backward(g.data<float>(), p.data<float>(), ds.data<float>(), batch, rows,
                                          cols, scale, detail::stream_of(p)));
    } else {
      dispatch_float(p.dtype(), "softmax", [&](auto t) {
        using T = decltype(t);
        cpu::softmax_backward(g.data<T>(), p.data<T>(), ds.data<T>(), batch, rows, cols, scale);
      });
    }
    return {ds};
  }
  void release_saved() override { p = Tensor(); }
};

// ---------------------------------------------------------------------------------------- cross-entropy
struct CrossEntropyNode : Node {
  Tensor logits, targets, lse;
  const char* name() const override { return "CrossEntropy"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    const int64_t n = logits.size(0), vocab = logits.size(1);
    Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    const Tensor g = detail::dense(grad);
    const double inv_n = 1.0 / static_cast<double>(n);
    if (logits.device().is_cuda()) {
      TT_CUDA_ONLY(cuda::cross_entropy_backward(logits.data<float>(), targets.data<int32_t>(),
                                                lse.data<float>(), g.data<float>(), inv_n,
                                                dlogits.data<float>(), n, vocab, detail::stream_of(logits)));
    } else {
      dispatch_float(logits.dtype(), "cross_entropy", [&](auto t) {
        using T = decltype(t);
        cpu::cross_entropy_backward(logits.data<T>(), targets.data<int32_t>(), lse.data<T>(), g.data<T>(),
                                    inv_n, dlogits.data<T>(), n, vocab);
      });
    }
    return {dlogits};
  }
  void release_saved() override { logits = targets = lse = Tensor(); }
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids_in) {
  TT_CHECK(weight.dim() == 2, "embedding: weight must be 2-D, got " + weight.describe());
  TT_CHECK(ids_in.dtype() == DType::i32, "embedding: ids must be i32, got " + ids_in.describe());
  detail::require_same_device(weight, ids_in, "embedding");
  const Tensor ids = detail::dense(ids_in);
  const Tensor w = detail::dense(weight);
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  const int64_t n = ids.numel(), dim = weight.size(1);
  if (weight.device().is_cuda()) {
    detail::require_cuda_f32(weight, "embedding");
    TT_CUDA_ONLY(cuda::embedding_forward(w.data<float>(), ids.data<int32_t>(), out.data<float>(), n, dim,
                                         detail::stream_of(weight)));
  } else {
    const int32_t* id = ids.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      TT_CHECK(id[i] >= 0 && id[i] < weight.size(0), "embedding: token id " + std::to_string(id[i]) +
                                                         " out of range for vocab " +
                                                         std::to_string(weight.size(0)));
    }
    dispatch_float(weight.dtype(), "embedding", [&](auto t) {
      using T = decltype(t);
      cpu::embedding_forward(w.data<T>(), id, out.data<T>(), n, dim);
    });
  }
  if (needs_grad({&weight})) {
    auto node = std::make_shared<EmbeddingNode>();
    node->ids = ids;
    node->weight_shape = weight.shape();
    node->dtype = weight.dtype();
    attach_node(out, node, {&weight});
  }
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return rms_norm(x, weight, eps, x.dtype());
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, DType out) {
  return rms_norm(x, weight, eps, out, nullptr);
}

Tensor rms_norm(const Tensor& x_in, const Tensor& weight, double eps, DType out, Tensor* input_copy) {
  detail::require_same_device(x_in, weight, "rms_norm");
  TT_CHECK(weight.dim() == 1 && x_in.size(-1) == weight.size(0),
           "rms_norm: weight " + weight.describe() + " does not match input " + x_in.describe());
  TT_CHECK(x_in.dtype() == weight.dtype(), "rms_norm: dtypes of input and weight differ");
  TT_CHECK(out == x_in.dtype() || out == DType::bf16,
           "rms_norm: the output is in the input's dtype or bf16, not " + std::string(dtype_name(out)));
  const Tensor x = detail::dense(x_in);
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  Tensor y = Tensor::empty(x.shape(), out, x.device());
  Tensor inv_rms = Tensor::empty({rows}, x.dtype(), x.device());
  if (input_copy != nullptr) *input_copy = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.device().is_cuda()) {
    detail::require_cuda_f32(x, "rms_norm");
    TT_CUDA_ONLY(cuda::rms_norm_forward(x.data<float>(), weight.data<float>(), y.raw_data(), out,
                                        inv_rms.data<float>(), rows, dim, eps, detail::stream_of(x),
                                        input_copy != nullptr ? input_copy->data<float>() : nullptr));
  } else {
    if (input_copy != nullptr) input_copy->copy_(x);
    // A bf16 output is the wide result rounded once, as on the GPU.
    Tensor wide = out == x.dtype() ? y : Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch_float(x.dtype(), "rms_norm", [&](auto t) {
      using T = decltype(t);
      cpu::rms_norm_forward(x.data<T>(), weight.data<T>(), wide.data<T>(), inv_rms.data<T>(), rows, dim, eps);
    });
    if (out != x.dtype()) cpu::cast(wide.raw_data(), x.dtype(), y.raw_data(), out, y.numel());
  }
  if (needs_grad({&x_in, &weight})) {
    auto node = std::make_shared<RmsNormNode>();
    node->x = x;
    node->weight = weight;
    node->inv_rms = inv_rms;
    node->bf16_dx_copy = out == DType::bf16 && x.dtype() == DType::f32;
    attach_node(y, node, {&x_in, &weight});
  }
  return y;
}

Tensor rope(const Tensor& x, int64_t d_head, double theta) {
  return rope(x, d_head, theta, x.dtype());
}

Tensor rope_at(const Tensor& x, const Tensor& starts_in, int64_t d_head, double theta) {
  TT_CHECK(x.dim() == 3, "rope_at expects (batch, seq, heads*d_head), got " + x.describe());
  TT_CHECK(starts_in.dtype() == DType::i32 && starts_in.dim() == 1 && starts_in.size(0) == x.size(0),
           "rope_at: starts must be i32 (" + std::to_string(x.size(0)) + "), got " + starts_in.describe());
  detail::require_same_device(x, starts_in, "rope_at");
  TT_CHECK(x.device().is_cpu() || x.dtype() != DType::f64, "rope on CUDA takes f32 or bf16");
  TT_CHECK(!needs_grad({&x}), "rope_at is for inference: x must not need grad");
  const Tensor starts = detail::dense(starts_in);
  if (x.device().is_cpu()) {
    const int32_t* s = starts.data<int32_t>();
    for (int64_t b = 0; b < x.size(0); ++b)
      TT_CHECK(s[b] >= 0 && s[b] <= (1 << 24) - x.size(1),
               "rope_at: row " + std::to_string(b) + " starts at " + std::to_string(s[b]) +
                   ", outside 0..2^24 (the positions f32 holds exactly)");
  }
  return rope_raw(x, d_head, theta, false, x.dtype(), starts);
}

Tensor rope(const Tensor& x, int64_t d_head, double theta, DType out) {
  TT_CHECK(out == x.dtype() || (out == DType::bf16 && x.dtype() == DType::f32),
           std::string("rope: the output is x's dtype or bf16 from f32, not ") + dtype_name(out) + " from " +
               dtype_name(x.dtype()));
  TT_CHECK(x.device().is_cpu() || x.dtype() != DType::f64, "rope on CUDA takes f32 or bf16");
  Tensor y = rope_raw(x, d_head, theta, false, out);
  if (needs_grad({&x})) {
    auto node = std::make_shared<RopeNode>();
    node->d_head = d_head;
    node->theta = theta;
    node->grad_dtype = out;
    attach_node(y, node, {&x});
  }
  return y;
}

Tensor swiglu(const Tensor& a_in, const Tensor& b_in) {
  detail::require_same_device(a_in, b_in, "swiglu");
  TT_CHECK(a_in.shape() == b_in.shape() && a_in.dtype() == b_in.dtype(), "swiglu: inputs must match");
  const Tensor a = detail::dense(a_in), b = detail::dense(b_in);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.device().is_cuda()) {
    TT_CUDA_ONLY(cuda::swiglu_forward(a.raw_data(), b.raw_data(), out.raw_data(), a.dtype(), a.numel(),
                                      detail::stream_of(a)));
  } else if (a.dtype() == DType::bf16) {
    NoGradGuard no_grad;
    const Tensor af = cast(a, DType::f32), bf = cast(b, DType::f32);
    Tensor wide = Tensor::empty(a.shape(), DType::f32, a.device());
    cpu::swiglu_forward(af.data<float>(), bf.data<float>(), wide.data<float>(), a.numel());
    cpu::cast(wide.raw_data(), DType::f32, out.raw_data(), DType::bf16, out.numel());
  } else {
    dispatch_float(a.dtype(), "swiglu", [&](auto t) {
      using T = decltype(t);
      cpu::swiglu_forward(a.data<T>(), b.data<T>(), out.data<T>(), a.numel());
    });
  }
  if (needs_grad({&a_in, &b_in})) {
    auto node = std::make_shared<SwiGluNode>();
    node->a = a;
    node->b = b;
    attach_node(out, node, {&a_in, &b_in});
  }
  return out;
}

Tensor swiglu_projection(const Tensor& x, const Tensor& w1, const Tensor& w3, DType compute,
                         bool narrow_x_grad) {
  TT_CHECK(x.dim() >= 1 && w1.dim() == 2 && w1.shape() == w3.shape() && w1.size(1) == x.size(-1),
           "swiglu_projection: weights " + w1.describe() + " and " + w3.describe() + " do not fit x " +
               x.describe());
  TT_CHECK(w1.dtype() == w3.dtype(), "swiglu_projection: the weights' dtypes differ");
  TT_CHECK(
      compute == w1.dtype() || compute == DType::bf16,
      std::string("swiglu_projection: computes in the weights' dtype or bf16, not ") + dtype_name(compute));
  detail::require_same_device(x, w1, "swiglu_projection");
  detail::require_same_device(w1, w3, "swiglu_projection");
  const int64_t in = w1.size(1), n = w1.size(0), rows = x.numel() / std::max<int64_t>(1, in);
  Tensor x2, ab, out, w1_c, w3_c;
  {
    NoGradGuard no_grad;
    x2 = reshape(detail::dense(x.dtype() == compute ? x : cast(x, compute)), {rows, in});
    w1_c = detail::in_dtype(w1, compute);
    w3_c = detail::in_dtype(w3, compute);
    std::vector<Tensor> kept;
    if (detail::kept_results("swiglu_projection", w1, kept)) {
      ab = kept[0];  // a selective recomputation's second run (core/recompute.h)
      TT_ASSERT(ab.shape() == Shape({rows, 2 * n}) && ab.dtype() == compute,
                "swiglu_projection: a kept result of another shape");
    } else {
      ab = Tensor::empty({rows, 2 * n}, compute, x.device());
      detail::gemm_into(x2, detail::stacked_weights({w1_c, w3_c}, compute), false, true, 1.0, 0.0, ab);
      detail::keep_results("swiglu_projection", w1, ab);
    }
    out = Tensor::empty({rows, n}, compute, x.device());
    swiglu_rows_forward(ab, out);
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(n);
  out = out.view(out_shape);
  if (needs_grad({&x, &w1, &w3})) {
    auto node = std::make_shared<SwigluProjectionNode>();
    node->x2 = x2;
    node->ab = ab;
    node->w1 = w1_c;
    node->w3 = w3_c;
    node->x_shape = x.shape();
    node->dx_dtype = detail::input_grad_dtype(x.dtype(), compute, narrow_x_grad);
    node->dw_dtype = w1.dtype();
    attach_node(out, node, {&x, &w1, &w3});
  }
  return out;
}

Tensor softmax(const Tensor& s_in, double scale, bool causal) {
  TT_CHECK(s_in.dim() >= 2, "softmax needs at least 2 dims");
  const Tensor s = detail::dense(s_in);
  const int64_t cols = s.size(-1), rows = s.size(-2), batch = s.numel() / std::max<int64_t>(1, rows * cols);
  TT_CHECK(!causal || rows == cols, "causal softmax needs square score matrices, got " + s.describe());
  Tensor p = Tensor::empty(s.shape(), s.dtype(), s.device());
  if (s.device().is_cuda()) {
    detail::require_cuda_f32(s, "softmax");
    TT_CUDA_ONLY(cuda::softmax_forward(s.data<float>(), p.data<float>(), batch, rows, cols, scale, causal,
                                       detail::stream_of(s)));
  } else {
    dispatch_float(s.dtype(), "softmax", [&](auto t) {
      using T = decltype(t);
      cpu::softmax_forward(s.data<T>(), p.data<T>(), batch, rows, cols, scale, causal);
    });
  }
  if (needs_grad({&s_in})) {
    auto node = std::make_shared<SoftmaxNode>();
    // An alias without autograd state: saving `p` itself would make p -> node -> p a reference cycle.
    node->p = p.as_strided_view(p.shape(), p.strides(), p.offset());
    node->scale = scale;
    attach_node(p, node, {&s_in});
  }
  return p;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in) {
  TT_CHECK(logits_in.dim() == 2, "cross_entropy: logits must be (N, V), got " + logits_in.describe());
  TT_CHECK(targets_in.dtype() == DType::i32 && targets_in.numel() == logits_in.size(0),
           "cross_entropy: targets must be i32 with one entry per row, got " + targets_in.describe());
  detail::require_same_device(logits_in, targets_in, "cross_entropy");
  const Tensor logits = detail::dense(logits_in), targets = detail::dense(targets_in);
  const int64_t n = logits.size(0), vocab = logits.size(1);
  Tensor losses = Tensor::empty({n}, logits.dtype(), logits.device());
  Tensor lse = Tensor::empty({n}, logits.dtype(), logits.device());
  Tensor out = Tensor::empty({1}, logits.dtype(), logits.device());
  if (logits.device().is_cuda()) {
    detail::require_cuda_f32(logits, "cross_entropy");
    TT_CUDA_ONLY({
      cudaStream_t stream = detail::stream_of(logits);
      cuda::cross_entropy_forward(logits.data<float>(), targets.data<int32_t>(), losses.data<float>(),
                                  lse.data<float>(), n, vocab, stream);
      cuda::sum(losses.data<float>(), n, false, out.data<float>(), stream);
      cuda::scale(out.data<float>(), out.data<float>(), 1, 1.0 / static_cast<double>(n), stream);
    });
  } else {
    const int32_t* tg = targets.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      TT_CHECK(tg[i] >= 0 && tg[i] < vocab, "cross_entropy: target id " + std::to_string(tg[i]) +
                                                " out of range for vocab " + std::to_string(vocab));
    }
    dispatch_float(logits.dtype(), "cross_entropy", [&](auto t) {
      using T = decltype(t);
      cpu::cross_entropy_forward(logits.data<T>(), tg, losses.data<T>(), lse.data<T>(), n, vocab);
      out.data<T>()[0] = static_cast<T>(cpu::sum(losses.data<T>(), n) / static_cast<double>(n));
    });
  }
  if (needs_grad({&logits_in})) {
    auto node = std::make_shared<CrossEntropyNode>();
    node->logits = logits;
    node->targets = targets;
    node->lse = lse;
    attach_node(out, node, {&logits_in});
  }
  return out;
}

}  // namespace tt::ops
