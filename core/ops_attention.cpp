// Attention: FlashAttention-2 (tiled, never materialises T x T; kernels/) and the naive composite path.
#include <cmath>

#include "core/ops_internal.h"
#include "core/profile.h"
#include "kernels/flash_attention.h"

namespace tt::ops {

namespace {

// Layouts the attention kernels take without copies: dense (B, H, T, d) or a (B, T, H, d) buffer seen
// through a transpose (what splitting a projection into heads gives).
bool is_head_interleaved(const Tensor& t) {
  return t.transpose_view(1, 2).is_contiguous();
}

Tensor as_attention_layout(const Tensor& t) {
  if (t.is_contiguous() || is_head_interleaved(t)) return t;
  return t.clone();
}

// A new uninitialised tensor with the same dense layout as `like` (one of the two accepted above).
Tensor empty_with_layout(const Tensor& like, DType dtype) {
  if (like.is_contiguous()) return Tensor::empty(like.shape(), dtype, like.device());
  const Shape& s = like.shape();
  return Tensor::empty({s[0], s[2], s[1], s[3]}, dtype, like.device()).transpose_view(1, 2);
}

AttentionStrides strides_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2]};
}

AttentionProblem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, bool causal,
                              bool deterministic = false) {
  AttentionProblem p;
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.seq = q.size(2);
  p.d_head = q.size(3);
  p.causal = causal;
  p.deterministic = deterministic;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.d_head)));
  p.q = strides_of(q);
  p.k = strides_of(k);
  p.v = strides_of(v);
  p.o = strides_of(o);
  return p;
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  TT_CHECK(q.dim() == 4, "attention expects (batch, heads, seq, d_head), got " + q.describe());
  TT_CHECK(q.shape() == k.shape() && q.shape() == v.shape(),
           "attention: q, k, v shapes differ: " + q.describe() + ", " + k.describe() + ", " + v.describe());
  TT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "attention: q, k, v dtypes differ");
  detail::require_same_device(q, k, "attention");
  detail::require_same_device(q, v, "attention");
}

struct FlashAttentionNode : Node {
  Tensor q, k, v, o, lse;
  bool causal = true, deterministic = false;
  const char* name() const override { return "FlashAttention"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    // The kernels read dO through O's strides, so dO takes O's layout: dense, or head-interleaved (the
    // model's layout, where dO arrives as a transposed view of a dense (batch, seq, heads, d) gradient).
    auto in_o_dtype = [&](const Tensor& t) {
      return t.dtype() == o.dtype() ? detail::dense(t) : cast(t, o.dtype());
    };
    const Tensor d_o =
        o.is_contiguous() ? in_o_dtype(grad) : in_o_dtype(grad.transpose_view(1, 2)).transpose_view(1, 2);
    Tensor dq = empty_with_layout(q, q.dtype()), dk = empty_with_layout(k, k.dtype());
    Tensor dv = empty_with_layout(v, v.dtype());
    const AttentionProblem p = make_problem(q, k, v, o, causal, deterministic);
    if (q.device().is_cuda()) {
      TT_CUDA_ONLY(cuda::flash_attention_backward(
          p, q.dtype(), q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(), d_o.raw_data(),
          lse.data<float>(), dq.raw_data(), dk.raw_data(), dv.raw_data(), detail::stream_of(q)));
    } else {
      detail::dispatch_float(q.dtype(), "flash_attention", [&](auto t) {
        using T = decltype(t);
        cpu::flash_attention_backward<T>(p, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), d_o.data<T>(),
                                         lse.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>());
      });
    }
    return {dq, dk, dv};
  }
  void release_saved() override { q = k = v = o = lse = Tensor(); }
};

}  // namespace

Tensor flash_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool causal,
                       bool deterministic) {
  check_qkv(q_in, k_in, v_in);
  if (q_in.device().is_cpu() && q_in.dtype() == DType::bf16) {
    // The CPU has no bf16 arithmetic: compute in f32 and round the output, like the GPU's f32 accumulation.
    return cast(flash_attention(cast(q_in, DType::f32), cast(k_in, DType::f32), cast(v_in, DType::f32),
                                causal, deterministic),
                DType::bf16);
  }
  const Tensor q = as_attention_layout(q_in), k = as_attention_layout(k_in), v = as_attention_layout(v_in);
  // O in q's layout: a head-interleaved O is already the (batch, seq, heads * d) the output projection
  // reads, so merging the heads copies nothing.
  Tensor o = empty_with_layout(q, q.dtype());
  const AttentionProblem p = make_problem(q, k, v, o, causal);
  const int64_t rows = p.batch * p.heads * p.seq;
  Tensor lse;
  if (q.device().is_cuda()) {
    TT_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
             "flash_attention on CUDA takes f32 or bf16");
    lse = Tensor::empty({rows}, DType::f32, q.device());
    TT_CUDA_ONLY(cuda::flash_attention_forward(p, q.dtype(), q.raw_data(), k.raw_data(), v.raw_data(),
                                               o.raw_data(), lse.data<float>(), detail::stream_of(q)));
  } else {
    lse = Tensor::empty({rows}, q.dtype(), q.device());
    detail::dispatch_float(q.dtype(), "flash_attention", [&](auto t) {
      using T = decltype(t);
      cpu::flash_attention_forward<T>(p, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), lse.data<T>());
    });
  }
  if (needs_grad({&q_in, &k_in, &v_in})) {
    auto node = std::make_shared<FlashAttentionNode>();
    node->q = q;
    node->k = k;
    node->v = v;
    // An alias without autograd state: saving `o` itself would make o -> node -> o a reference cycle.
    node->o = o.as_strided_view(o.shape(), o.strides(), o.offset());
    node->lse = lse;
    node->causal = causal;
    node->deterministic = deterministic;
    attach_node(o, node, {&q_in, &k_in, &v_in});
  }
  return o;
}

Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  check_qkv(q, k, v);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), d_head = q.size(3);
  const Shape flat{batch * heads, seq, d_head};
  const Tensor q3 = reshape(contiguous(q), flat), k3 = reshape(contiguous(k), flat);
  const Tensor v3 = reshape(contiguous(v), flat);
  Tensor scores, probs, out;
  {
    const NvtxRange range("scores");
    scores = matmul(q3, k3, false, true);  // f32 (also for bf16 inputs)
  }
  {
    const NvtxRange range("softmax");
    probs = softmax(scores, 1.0 / std::sqrt(static_cast<double>(d_head)), causal);
  }
  {
    const NvtxRange range("PV");
    out = matmul(cast(probs, q.dtype()), v3);
  }
  return reshape(cast(out, q.dtype()), q.shape());
}

}  // namespace tt::ops
