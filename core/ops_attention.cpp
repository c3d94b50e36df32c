// Attention: FlashAttention-2 (tiled, never materialises T x T; kernels/), the naive composite path, and
// attention over a key/value cache for generation (inference only).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ops_internal.h"
#include "core/profile.h"
#include "core/recompute.h"
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

namespace {

// ------------------------------------------------------------------------------------ fused q|k|v front
// Layout: the fused product qkv is (rows, 3n), rows = batch * seq; q, k and v are its column blocks, seen as
// (batch, heads, seq, d) with strides (seq * 3n, d, 3n). The heads' output is dense (batch, seq, heads, d).

// Column block i (n wide) of a (rows, 3n) buffer: where q, k or v (or their gradients) start.
[[maybe_unused]] void* column_block(const Tensor& t, int64_t i, int64_t n) {
  return static_cast<char*>(t.raw_data()) + static_cast<size_t>(i * n) * dtype_size(t.dtype());
}

AttentionProblem qkv_problem(int64_t batch, int64_t seq, int64_t heads, int64_t n, bool deterministic) {
  AttentionProblem p;
  p.batch = batch;
  p.heads = heads;
  p.seq = seq;
  p.d_head = n / heads;
  p.causal = true;
  p.deterministic = deterministic;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.d_head)));
  p.q = p.k = p.v = {seq * 3 * n, p.d_head, 3 * n};
  p.o = {seq * n, p.d_head, n};
  return p;
}

// RoPE on the q and k blocks of a (rows, 3n) buffer in place; inverse for the backward.
void rope_qk_in_place(Tensor& qkv, int64_t batch, int64_t seq, int64_t n, int64_t d_head, double theta,
                      bool inverse) {
  if (qkv.device().is_cuda()) {
    TT_CUDA_ONLY(cuda::rope(qkv.raw_data(), qkv.dtype(), qkv.raw_data(), qkv.dtype(), batch, seq, 2 * n,
                            d_head, theta, inverse, detail::stream_of(qkv), 3 * n, 3 * n));
  } else if (qkv.dtype() == DType::bf16) {
    // The CPU twin of the bf16 kernel: widen exactly, rotate in f32, round once.
    Tensor wide = cast(qkv, DType::f32);
    cpu::rope(wide.data<float>(), wide.data<float>(), batch, seq, 2 * n, d_head, theta, inverse, 3 * n,
              3 * n);
    qkv.copy_(cast(wide, DType::bf16));
  } else {
    detail::dispatch_float(qkv.dtype(), "attention_qkv", [&](auto t) {
      using T = decltype(t);
      cpu::rope(qkv.data<T>(), qkv.data<T>(), batch, seq, 2 * n, d_head, theta, inverse, 3 * n, 3 * n);
    });
  }
}

// Flash attention's forward on the fused layout; o dense (rows, n) in qkv's dtype. On the CPU a bf16 qkv is
// widened exactly and the output rounded once, as the GPU's f32 accumulation does.
Tensor qkv_attention_forward(const Tensor& qkv, const AttentionProblem& p, Tensor& o) {
  const int64_t rows = p.batch * p.seq, n = p.heads * p.d_head;
  Tensor lse;
  if (qkv.device().is_cuda()) {
    lse = Tensor::empty({p.batch * p.heads * p.seq}, DType::f32, qkv.device());
    TT_CUDA_ONLY(cuda::flash_attention_forward(p, qkv.dtype(), column_block(qkv, 0, n),
                                               column_block(qkv, 1, n), column_block(qkv, 2, n), o.raw_data(),
                                               lse.data<float>(), detail::stream_of(qkv)));
  } else if (qkv.dtype() == DType::bf16) {
    Tensor wide_o = Tensor::empty({rows, n}, DType::f32, qkv.device());
    lse = qkv_attention_forward(cast(qkv, DType::f32), p, wide_o);
    o.copy_(cast(wide_o, DType::bf16));
  } else {
    lse = Tensor::empty({p.batch * p.heads * p.seq}, qkv.dtype(), qkv.device());
    detail::dispatch_float(qkv.dtype(), "attention_qkv", [&](auto t) {
      using T = decltype(t);
      const T* q = qkv.data<T>();
      cpu::flash_attention_forward<T>(p, q, q + n, q + 2 * n, o.data<T>(), lse.data<T>());
    });
  }
  return lse;
}

// Its backward: dq, dk, dv into the column blocks of dqkv (rows, 3n), qkv's dtype.
void qkv_attention_backward(const Tensor& qkv, const Tensor& o, const Tensor& d_o, const Tensor& lse,
                            const AttentionProblem& p, Tensor& dqkv) {
  const int64_t n = p.heads * p.d_head;
  if (qkv.device().is_cuda()) {
    TT_CUDA_ONLY(cuda::flash_attention_backward(
        p, qkv.dtype(), column_block(qkv, 0, n), column_block(qkv, 1, n), column_block(qkv, 2, n),
        o.raw_data(), d_o.raw_data(), lse.data<float>(), column_block(dqkv, 0, n), column_block(dqkv, 1, n),
        column_block(dqkv, 2, n), detail::stream_of(qkv)));
  } else if (qkv.dtype() == DType::bf16) {
    Tensor wide = Tensor::empty(dqkv.shape(), DType::f32, dqkv.device());
    qkv_attention_backward(cast(qkv, DType::f32), cast(o, DType::f32), cast(d_o, DType::f32), lse, p, wide);
    dqkv.copy_(cast(wide, DType::bf16));
  } else {
    detail::dispatch_float(qkv.dtype(), "attention_qkv", [&](auto t) {
      using T = decltype(t);
      const T* q = qkv.data<T>();
      T* g = dqkv.data<T>();
      cpu::flash_attention_backward<T>(p, q, q + n, q + 2 * n, o.data<T>(), d_o.data<T>(), lse.data<T>(), g,
                                       g + n, g + 2 * n);
    });
  }
}

struct AttentionQkvNode : Node {
  Tensor x2, qkv, o, lse;  // x2 (rows, in) in the compute dtype; qkv with q, k rotated
  // The three weights in the compute dtype, stacked again in backward: a saved stacked view would hold their
  // storage, which ZeRO-3 releases after the forward and gathers anew before the backward (re-pointing these
  // very tensors).
  Tensor wq, wk, wv;
  Shape x_shape;
  AttentionProblem p;
  double theta = 10000.0;
  DType dx_dtype = DType::f32, dw_dtype = DType::f32;
  const char* name() const override { return "AttentionQkv"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    const int64_t rows = x2.size(0), n = p.heads * p.d_head;
    const Tensor d_o = reshape(detail::dense(detail::in_dtype(grad, o.dtype())), {rows, n});
    Tensor dqkv = Tensor::empty({rows, 3 * n}, qkv.dtype(), qkv.device());
    qkv_attention_backward(qkv, o, d_o, lse, p, dqkv);
    rope_qk_in_place(dqkv, p.batch, p.seq, n, p.d_head, theta, true);
    std::vector<Tensor> out(4);
    // One input-gradient product over all 3n columns; each weight's gradient is its n columns of dqkv (rows
    // 3n apart) against x.
    if (next[0]) {
      const Tensor w = detail::stacked_weights({wq, wk, wv}, qkv.dtype());
      out[0] = detail::linear_input_grad(*this, 0, dqkv, w, dx_dtype, x_shape);
    }
    for (size_t i = 0; i < 3; ++i) {
      if (next[i + 1]) {
        out[i + 1] = detail::linear_weight_grad(
            *this, i + 1, dqkv.narrow_view(1, static_cast<int64_t>(i) * n, n), x2, dw_dtype);
      }
    }
    return out;
  }
  void release_saved() override { x2 = wq = wk = wv = qkv = o = lse = Tensor(); }
};

}  // namespace

Tensor attention_qkv(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv, int64_t heads,
                     double rope_theta, DType compute, bool deterministic, bool narrow_x_grad) {
  TT_CHECK(x.dim() == 3, "attention_qkv: x must be (batch, seq, in), got " + x.describe());
  TT_CHECK(wq.dim() == 2 && wq.shape() == wk.shape() && wq.shape() == wv.shape() && wq.size(1) == x.size(2),
           "attention_qkv: weights " + wq.describe() + ", " + wk.describe() + ", " + wv.describe() +
               " do not fit x " + x.describe());
  TT_CHECK(wq.dtype() == wk.dtype() && wq.dtype() == wv.dtype(), "attention_qkv: the weights' dtypes differ");
  TT_CHECK(compute == wq.dtype() || compute == DType::bf16,
           std::string("attention_qkv: computes in the weights' dtype or bf16, not ") + dtype_name(compute));
  detail::require_same_device(x, wq, "attention_qkv");
  detail::require_same_device(wq, wk, "attention_qkv");
  detail::require_same_device(wq, wv, "attention_qkv");
  const int64_t batch = x.size(0), seq = x.size(1), in = x.size(2), n = wq.size(0), rows = batch * seq;
  TT_CHECK(heads >= 1 && n % heads == 0 && (n / heads) % 2 == 0,
           "attention_qkv: " + std::to_string(n) + " features do not split into " + std::to_string(heads) +
               " heads of an even size");
  const AttentionProblem p = qkv_problem(batch, seq, heads, n, deterministic);
  Tensor x2, w, qkv, o, lse, wq_c, wk_c, wv_c;
  {
    NoGradGuard no_grad;
    x2 = reshape(detail::dense(x.dtype() == compute ? x : cast(x, compute)), {rows, in});
    wq_c = detail::in_dtype(wq, compute);
    wk_c = detail::in_dtype(wk, compute);
    wv_c = detail::in_dtype(wv, compute);
    std::vector<Tensor> kept;
    if (detail::kept_results("attention_qkv", wq, kept)) {
      qkv = kept[0];  // a selective recomputation's second run (core/recompute.h)
      o = kept[1];
      lse = kept[2];
    } else {
      w = detail::stacked_weights({wq_c, wk_c, wv_c}, compute);
      qkv = Tensor::empty({rows, 3 * n}, compute, x.device());
      detail::gemm_into(x2, w, false, true, 1.0, 0.0, qkv);
      rope_qk_in_place(qkv, batch, seq, n, n / heads, rope_theta, false);
      o = Tensor::empty({rows, n}, compute, x.device());
      lse = qkv_attention_forward(qkv, p, o);
      detail::keep_results("attention_qkv", wq, qkv, o, lse);
    }
  }
  Tensor out = o.view({batch, seq, n});
  if (needs_grad({&x, &wq, &wk, &wv})) {
    auto node = std::make_shared<AttentionQkvNode>();
    node->x2 = x2;
    node->wq = wq_c;
    node->wk = wk_c;
    node->wv = wv_c;
    node->qkv = qkv;
    node->o = o;  // the (rows, n) view: saving `out` itself would make out -> node -> out a reference cycle
    node->lse = lse;
    node->x_shape = x.shape();
    node->p = p;
    node->theta = rope_theta;
    node->dx_dtype = detail::input_grad_dtype(x.dtype(), compute, narrow_x_grad);
    node->dw_dtype = wq.dtype();
    attach_node(out, node, {&x, &wq, &wk, &wv});
  }
  return out;
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

// ------------------------------------------------------------------------- attention over a KV cache

namespace {

// The entries' rows and start positions against the cache's shape, each one named when refused.
void check_cache_entries(const char* op, const Tensor& store, const CacheEntries& entries, int64_t n,
                         int64_t count) {
  const std::vector<int64_t>& rows = entries.rows;
  const std::vector<int64_t>& starts = entries.starts;
  TT_CHECK(static_cast<int64_t>(rows.size()) == n && static_cast<int64_t>(starts.size()) == n,
           std::string(op) + ": " + std::to_string(n) + " entries but " + std::to_string(rows.size()) +
               " rows and " + std::to_string(starts.size()) + " starts");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[static_cast<size_t>(i)], start = starts[static_cast<size_t>(i)];
    TT_CHECK(row >= 0 && row < store.size(0), std::string(op) + ": entry " + std::to_string(i) + "'s row " +
                                                  std::to_string(row) + " is outside the cache's " +
                                                  std::to_string(store.size(0)) + " rows");
    TT_CHECK(start >= 0 && start + count <= store.size(1),
             std::string(op) + ": entry " + std::to_string(i) + " starts at " + std::to_string(start) +
                 " with " + std::to_string(count) + " new tokens, beyond the cache's " +
                 std::to_string(store.size(1)) + " positions");
  }
  if (store.device().is_cuda()) {
    TT_CHECK(entries.table.defined() && entries.table.dtype() == DType::i32 && entries.table.dim() == 2 &&
                 entries.table.size(0) == 2 && entries.table.size(1) == n && entries.table.is_contiguous() &&
                 entries.table.device() == store.device(),
             std::string(op) + ": the entries' table must be a dense i32 (2, " + std::to_string(n) + ") on " +
                 store.device().str() + ", got " +
                 (entries.table.defined() ? entries.table.describe() : std::string("none")));
  }
}

}  // namespace

CacheEntries cache_entries(const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
                           Device device) {
  std::vector<int32_t> flat;
  for (const std::vector<int64_t>* half : {&rows, &starts})
    for (int64_t v : *half)
      flat.push_back(v >= INT32_MIN && v <= INT32_MAX ? static_cast<int32_t>(v) : -1);  // -1: refused later
  const auto n = static_cast<int64_t>(std::min(rows.size(), starts.size()));
  flat.resize(static_cast<size_t>(2 * n));  // mismatched lengths are refused by the op, on the vectors
  return CacheEntries{rows, starts, Tensor::from_ints(flat, {2, n}, device)};
}

Tensor cached_attention(const Tensor& q_in, const Tensor& keys, const Tensor& values,
                        const CacheEntries& entries) {
  const char* op = "cached_attention";
  TT_CHECK(q_in.dim() == 4, "cached_attention: q must be (n, count, heads, d_head), got " + q_in.describe());
  const int64_t n = q_in.size(0), count = q_in.size(1), heads = q_in.size(2), d_head = q_in.size(3);
  const int64_t dim = heads * d_head;
  TT_CHECK(keys.dim() == 3 && keys.shape() == values.shape() && keys.size(2) == dim,
           "cached_attention: keys and values must be (cache rows, capacity, " + std::to_string(dim) +
               ") for q " + q_in.describe() + ", got " + keys.describe() + " and " + values.describe());
  TT_CHECK(keys.is_contiguous() && values.is_contiguous(), "cached_attention: the cache must be dense");
  TT_CHECK(q_in.dtype() == keys.dtype() && q_in.dtype() == values.dtype(),
           "cached_attention: q, keys and values dtypes differ: " + q_in.describe() + ", " + keys.describe() +
               ", " + values.describe());
  detail::require_same_device(q_in, keys, op);
  detail::require_same_device(q_in, values, op);
  TT_CHECK(!needs_grad({&q_in, &keys, &values}),
           "cached_attention is for inference: no inputs that need grad");
  check_cache_entries(op, keys, entries, n, count);
  const int64_t* rows = entries.rows.data();
  const int64_t* starts = entries.starts.data();
  const Tensor q = detail::dense(q_in);
  Tensor out = Tensor::empty({n, count, dim}, q.dtype(), q.device());
  const int64_t capacity = keys.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_head));
  if (q.device().is_cuda()) {
    TT_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
             "cached_attention on CUDA takes f32 or bf16");
    TT_CUDA_ONLY(cuda::cached_attention(q.raw_data(), keys.raw_data(), values.raw_data(), out.raw_data(),
                                        q.dtype(), entries.table.data<int32_t>(), n, count, heads, d_head,
                                        capacity, scale, detail::stream_of(q)));
  } else if (q.dtype() == DType::bf16) {
    cpu::cached_attention_bf16(q.data<bf16>(), keys.data<bf16>(), values.data<bf16>(), out.data<bf16>(), rows,
                               starts, n, count, heads, d_head, capacity, scale);
  } else {
    detail::dispatch_float(q.dtype(), op, [&](auto t) {
      using T = decltype(t);
      cpu::cached_attention<T>(q.data<T>(), keys.data<T>(), values.data<T>(), out.data<T>(), rows, starts, n,
                               count, heads, d_head, capacity, scale);
    });
  }
  return out;
}

void cache_append(Tensor& store, const CacheEntries& entries, const Tensor& new_values) {
  const char* op = "cache_append";
  TT_CHECK(store.dim() == 3 && store.is_contiguous(),
           "cache_append: the store must be dense (cache rows, capacity, dim), got " + store.describe());
  TT_CHECK(new_values.dim() == 3 && new_values.size(2) == store.size(2),
           "cache_append: new values " + new_values.describe() + " do not fit the store " + store.describe());
  TT_CHECK(new_values.dtype() == store.dtype(), "cache_append: new values " + new_values.describe() +
                                                    " are not of the store's dtype " + store.describe());
  TT_CHECK(store.dtype() != DType::i32, "cache_append: the store must be of a float dtype");
  detail::require_same_device(store, new_values, op);
  TT_CHECK(!needs_grad({&new_values}), "cache_append is for inference: the new values must not need grad");
  const int64_t n = new_values.size(0), count = new_values.size(1), dim = new_values.size(2);
  check_cache_entries(op, store, entries, n, count);
  const std::vector<int64_t>& rows = entries.rows;
  const std::vector<int64_t>& starts = entries.starts;
  // Two entries on one row would write the same positions (or race on the GPU).
  std::vector<int64_t> sorted = rows;
  std::sort(sorted.begin(), sorted.end());
  TT_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
           "cache_append: a cache row is given twice");
  const Tensor src = detail::dense(new_values);
  const auto elem_bytes = static_cast<int64_t>(dtype_size(store.dtype()));
  if (store.device().is_cuda()) {
    TT_CUDA_ONLY(cuda::cache_append(store.raw_data(), src.raw_data(), elem_bytes,
                                    entries.table.data<int32_t>(), n, count, store.size(1), dim,
                                    detail::stream_of(store)));
  } else {
    cpu::cache_append(store.raw_data(), src.raw_data(), elem_bytes, rows.data(), starts.data(), n, count,
                      store.size(1), dim);
  }
}

Tensor rope_into_cache(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& keys, Tensor& values,
                       const CacheEntries& entries, int64_t d_head, double theta) {
  const char* op = "rope_into_cache";
  TT_CHECK(q.dim() == 3 && k.shape() == q.shape() && v.shape() == q.shape(),
           "rope_into_cache: q, k and v must be one (n, count, dim) shape, got " + q.describe() + ", " +
               k.describe() + ", " + v.describe());
  TT_CHECK(d_head > 0 && d_head % 2 == 0 && q.size(2) % d_head == 0,
           "rope_into_cache: feature dim " + std::to_string(q.size(2)) +
               " is not a multiple of an even d_head " + std::to_string(d_head));
  TT_CHECK(entries.table.defined(),
           "rope_into_cache: the entries need their table (positions are read there)");
  const Tensor starts =
      reshape(entries.table.narrow_view(0, 1, 1), {static_cast<int64_t>(entries.table.size(1))});
  if (!q.device().is_cuda()) {  // the definition, op by op
    const Tensor q_rotated = rope_at(q, starts, d_head, theta);
    cache_append(keys, entries, rope_at(k, starts, d_head, theta));
    cache_append(values, entries, v);
    return q_rotated;
  }
  for (const Tensor* t : {&q, &k, &v, static_cast<const Tensor*>(&values)}) {
    TT_CHECK(t->dtype() == keys.dtype(),
             "rope_into_cache: " + t->describe() + " is not of the cache's dtype " + keys.describe());
    detail::require_same_device(*t, keys, op);
  }
  TT_CHECK(keys.dim() == 3 && keys.shape() == values.shape() && keys.size(2) == q.size(2) &&
               keys.is_contiguous() && values.is_contiguous(),
           "rope_into_cache: keys and values must be dense (cache rows, capacity, " +
               std::to_string(q.size(2)) + "), got " + keys.describe() + " and " + values.describe());
  TT_CHECK(keys.dtype() == DType::f32 || keys.dtype() == DType::bf16,
           "rope_into_cache on CUDA takes f32 or bf16");
  TT_CHECK(!needs_grad({&q, &k, &v}), "rope_into_cache is for inference: no inputs that need grad");
  const int64_t n = q.size(0), count = q.size(1), dim = q.size(2);
  check_cache_entries(op, keys, entries, n, count);
  std::vector<int64_t> sorted = entries.rows;
  std::sort(sorted.begin(), sorted.end());
  TT_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
           "rope_into_cache: a cache row is given twice");
  const Tensor qc = detail::dense(q), kc = detail::dense(k), vc = detail::dense(v);
  Tensor q_out = Tensor::empty(q.shape(), q.dtype(), q.device());
  TT_CUDA_ONLY(cuda::rope_into_cache(qc.raw_data(), kc.raw_data(), vc.raw_data(), q_out.raw_data(),
                                     keys.raw_data(), values.raw_data(), keys.dtype(),
                                     entries.table.data<int32_t>(), n, count, dim, d_head, theta,
                                     keys.size(1), detail::stream_of(q)));
  return q_out;
}

}  // namespace tt::ops
