// Elementwise and shape ops with their autograd nodes.
#include "core/ops_internal.h"

namespace tt::ops {

using detail::dispatch_float;
using detail::require_same_device;

namespace {

Tensor add_raw(const Tensor& a, const Tensor& b, double alpha) {
  require_same_device(a, b, "add");
  TT_CHECK(a.shape() == b.shape(), "add: shapes differ: " + a.describe() + " and " + b.describe());
  TT_CHECK(a.dtype() == b.dtype(), "add: dtypes differ: " + a.describe() + " and " + b.describe());
  const Tensor ac = detail::dense(a);
  const Tensor bc = detail::dense(b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.device().is_cuda()) {
    detail::require_cuda_f32(a, "add");
    TT_CUDA_ONLY(cuda::add(ac.data<float>(), bc.data<float>(), out.data<float>(), out.numel(), alpha,
                           detail::stream_of(a)));
  } else {
    dispatch_float(a.dtype(), "add", [&](auto t) {
      using T = decltype(t);
      cpu::add(ac.data<T>(), bc.data<T>(), out.data<T>(), out.numel(), alpha);
    });
  }
  return out;
}

Tensor scale_raw(const Tensor& a, double s) {
  const Tensor ac = detail::dense(a);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.device().is_cuda()) {
    detail::require_cuda_f32(a, "scale");
    TT_CUDA_ONLY(cuda::scale(ac.data<float>(), out.data<float>(), out.numel(), s, detail::stream_of(a)));
  } else {
    dispatch_float(a.dtype(), "scale", [&](auto t) {
      using T = decltype(t);
      cpu::scale(ac.data<T>(), out.data<T>(), out.numel(), s);
    });
  }
  return out;
}

Tensor cast_raw(const Tensor& a, DType dtype) {
  const Tensor ac = detail::dense(a);
  Tensor out = Tensor::empty(a.shape(), dtype, a.device());
  if (a.device().is_cuda()) {
    TT_CUDA_ONLY(
        cuda::cast(ac.raw_data(), a.dtype(), out.raw_data(), dtype, a.numel(), detail::stream_of(a)));
  } else {
    cpu::cast(ac.raw_data(), a.dtype(), out.raw_data(), dtype, a.numel());
  }
  return out;
}

struct AddNode : Node {
  double alpha = 1.0;
  const char* name() const override { return "Add"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {g, alpha == 1.0 ? g : scale_raw(g, alpha)}; }
};

struct ScaleNode : Node {
  double s = 1.0;
  const char* name() const override { return "Scale"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {scale_raw(g, s)}; }
};

struct CastNode : Node {
  DType input_dtype = DType::f32;
  const char* name() const override { return "Cast"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    return {g.dtype() == input_dtype ? g : cast_raw(g, input_dtype)};
  }
};

// Shape-only ops: the gradient is the incoming one seen through the inverse view.
struct ReshapeNode : Node {
  Shape input_shape;
  const char* name() const override { return "Reshape"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor gc = detail::dense(g);
    return {gc.view(input_shape)};
  }
};

struct TransposeNode : Node {
  int64_t d0 = 0, d1 = 0;
  const char* name() const override { return "Transpose"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {g.transpose_view(d0, d1)}; }
};

struct ContiguousNode : Node {
  const char* name() const override { return "Contiguous"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {g}; }
};

struct SumNode : Node {
  Shape input_shape;
  const char* name() const override { return "Sum"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // Only used for losses and tests: reading one value back is fine here.
    return {Tensor::full(input_shape, g.item(), g.dtype(), g.device())};
  }
};

struct MulNode : Node {
  Tensor a, b;
  const char* name() const override { return "Mul"; }
  std::vector<Tensor> apply(const Tensor& g) override { return {mul(g, b), mul(g, a)}; }
  void release_saved() override { a = b = Tensor(); }
};

}  // namespace

Tensor add_scaled(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = add_raw(a, b, alpha);
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<AddNode>();
    node->alpha = alpha;
    attach_node(out, node, {&a, &b});
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return add_scaled(a, b, 1.0);
}

Tensor scale(const Tensor& a, double s) {
  Tensor out = scale_raw(a, s);
  if (needs_grad({&a})) {
    auto node = std::make_shared<ScaleNode>();
    node->s = s;
    attach_node(out, node, {&a});
  }
  return out;
}

Tensor cast(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  Tensor out = cast_raw(a, dtype);
  if (needs_grad({&a})) {
    auto node = std::make_shared<CastNode>();
    node->input_dtype = a.dtype();
    attach_node(out, node, {&a});
  }
  return out;
}

void cast_into(Tensor& dst, const Tensor& src) {
  require_same_device(dst, src, "cast_into");
  TT_CHECK(dst.shape() == src.shape(),
           "cast_into: shapes differ: " + dst.describe() + " and " + src.describe());
  TT_CHECK(dst.is_contiguous(), "cast_into: destination must be contiguous");
  const Tensor s = detail::dense(src);
  if (dst.device().is_cuda()) {
    TT_CUDA_ONLY(
        cuda::cast(s.raw_data(), s.dtype(), dst.raw_data(), dst.dtype(), s.numel(), detail::stream_of(dst)));
  } else {
    cpu::cast(s.raw_data(), s.dtype(), dst.raw_data(), dst.dtype(), s.numel());
  }
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = a.clone();
  if (needs_grad({&a})) attach_node(out, std::make_shared<ContiguousNode>(), {&a});
  return out;
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  const Tensor src = detail::dense(a);
  Tensor out = src.view(shape);
  if (needs_grad({&a})) {
    auto node = std::make_shared<ReshapeNode>();
    node->input_shape = a.shape();
    attach_node(out, node, {&a});
  }
  return out;
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  Tensor out = a.transpose_view(d0, d1);
  if (needs_grad({&a})) {
    auto node = std::make_shared<TransposeNode>();
    node->d0 = d0;
    node->d1 = d1;
    attach_node(out, node, {&a});
  }
  return out;
}

Tensor sum(const Tensor& a) {
  const Tensor ac = detail::dense(a);
  Tensor out = Tensor::empty({1}, a.dtype(), a.device());
  if (a.device().is_cuda()) {
    detail::require_cuda_f32(a, "sum");
    TT_CUDA_ONLY(cuda::sum(ac.data<float>(), a.numel(), false, out.data<float>(), detail::stream_of(a)));
  } else {
    dispatch_float(a.dtype(), "sum", [&](auto t) {
      using T = decltype(t);
      out.data<T>()[0] = static_cast<T>(cpu::sum(ac.data<T>(), a.numel()));
    });
  }
  if (needs_grad({&a})) {
    auto node = std::make_shared<SumNode>();
    node->input_shape = a.shape();
    attach_node(out, node, {&a});
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  TT_CHECK(a.device().is_cpu() && b.device().is_cpu(), "mul is implemented on the CPU only");
  TT_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), "mul: inputs must match in shape and dtype");
  const Tensor ac = detail::dense(a);
  const Tensor bc = detail::dense(b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float(a.dtype(), "mul", [&](auto t) {
    using T = decltype(t);
    for (int64_t i = 0; i < a.numel(); ++i) out.data<T>()[i] = ac.data<T>()[i] * bc.data<T>()[i];
  });
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<MulNode>();
    node->a = a;
    node->b = b;
    attach_node(out, node, {&a, &b});
  }
  return out;
}

void add_into(Tensor& dst, const Tensor& src) {
  require_same_device(dst, src, "add_into");
  TT_CHECK(dst.shape() == src.shape(),
           "add_into: shapes differ: " + dst.describe() + " and " + src.describe());
  TT_CHECK(dst.is_contiguous(), "add_into: destination must be contiguous");
  const Tensor s = src.dtype() == dst.dtype() ? detail::dense(src) : cast_raw(src, dst.dtype());
  if (dst.dtype() == DType::bf16) {
    // Added in f32 and rounded once (a bf16 gradient shard taking a micro-batch's part).
    const void* inputs[2] = {dst.raw_data(), s.raw_data()};
    if (dst.device().is_cuda()) {
      TT_CUDA_ONLY(cuda::add_ranks_scaled(dst.raw_data(), inputs, 2, DType::bf16, dst.numel(), 1.0f,
                                          detail::stream_of(dst)));
    } else {
      cpu::add_ranks_scaled(dst.raw_data(), inputs, 2, DType::bf16, dst.numel(), 1.0f);
    }
    return;
  }
  if (dst.device().is_cuda()) {
    detail::require_cuda_f32(dst, "add_into");
    TT_CUDA_ONLY(cuda::add(dst.data<float>(), s.data<float>(), dst.data<float>(), dst.numel(), 1.0,
                           detail::stream_of(dst)));
  } else {
    dispatch_float(dst.dtype(), "add_into", [&](auto t) {
      using T = decltype(t);
      cpu::add(dst.data<T>(), s.data<T>(), dst.data<T>(), dst.numel(), 1.0);
    });
  }
}

void scale_(Tensor& t, double s) {
  TT_CHECK(t.is_contiguous(), "scale_: tensor must be contiguous");
  if (t.device().is_cuda()) {
    detail::require_cuda_f32(t, "scale_");
    TT_CUDA_ONLY(cuda::scale(t.data<float>(), t.data<float>(), t.numel(), s, detail::stream_of(t)));
  } else {
    dispatch_float(t.dtype(), "scale_", [&](auto tag) {
      using T = decltype(tag);
      cpu::scale(t.data<T>(), t.data<T>(), t.numel(), s);
    });
  }
}

void sum_squares_into(const Tensor& t, Tensor& out) {
  TT_CHECK(
      t.device().is_cuda() && out.device() == t.device() && out.dtype() == DType::f32 && out.numel() == 1,
      "sum_squares_into: a CUDA tensor and a one-element f32 result on its device, got " + t.describe() +
          " and " + out.describe());
  const Tensor tc = detail::dense(t);
  if (t.dtype() == DType::bf16) {
    TT_CUDA_ONLY(cuda::sum(tc.data<bf16>(), t.numel(), true, out.data<float>(), detail::stream_of(t)));
  } else {
    detail::require_cuda_f32(t, "sum_squares");
    TT_CUDA_ONLY(cuda::sum(tc.data<float>(), t.numel(), true, out.data<float>(), detail::stream_of(t)));
  }
}

double sum_squares(const Tensor& t) {
  if (t.device().is_cuda()) {
    Tensor out = Tensor::empty({1}, DType::f32, t.device());
    sum_squares_into(t, out);
    return out.item();
  }
  const Tensor tc = detail::dense(t);
  if (t.dtype() == DType::bf16) return sum_squares(cast_raw(tc, DType::f32));  // widened exactly
  double result = 0;
  dispatch_float(t.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    result = cpu::sum_squares(tc.data<T>(), t.numel());
  });
  return result;
}

}  // namespace tt::ops
