// The differentiable ops. Each picks the CPU or CUDA kernel by the inputs' device and, when grad mode is on
// and an input requires grad, records an autograd node. Inputs of different devices are an error.
// Floating tensors are f32 (f64 on CPU for gradient checks); bf16 appears as matmul/attention inputs.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tt::ops {

// --- elementwise and shape ---
Tensor add(const Tensor& a, const Tensor& b);                       // same shape and dtype
Tensor add_scaled(const Tensor& a, const Tensor& b, double alpha);  // a + alpha * b
Tensor scale(const Tensor& a, double s);
Tensor cast(const Tensor& a, DType dtype);  // the gradient is cast back to a's dtype
// dst = src converted to dst's dtype (same shape, dst contiguous); no autograd.
void cast_into(Tensor& dst, const Tensor& src);
Tensor contiguous(const Tensor& a);  // a itself when already contiguous
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor sum(const Tensor& a);                   // scalar (shape {1}), same dtype
Tensor mul(const Tensor& a, const Tensor& b);  // elementwise, for tests and losses

// In place, no autograd: dst += src (same shape; src may be of another float dtype on CPU; a bf16 dst takes
// the f32 sum rounded once).
void add_into(Tensor& dst, const Tensor& src);
void scale_(Tensor& t, double s);
double sum_squares(const Tensor& t);  // f32, f64 or bf16; reads the result back to the host
// The same on CUDA (f32 or bf16) without a read-back: the sum goes to `out`, one f32 on t's device.
void sum_squares_into(const Tensor& t, Tensor& out);

// --- matrix products ---
// Batched: a (..., m, k) [or (..., k, m) with trans_a], b (..., k, n) [or (..., n, k)] with equal leading
// dims (or b 2-D, shared by every batch). f32/f64 in -> same out; bf16 in -> f32 out.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              double alpha = 1.0);
// y = x W^T: x (..., in), weight (out, in), computed and returned in the weight's dtype.
Tensor linear(const Tensor& x, const Tensor& weight);
// Mixed precision: x and the weight are cast to `compute` (the weight's dtype or bf16) inside the op, the
// product accumulates in f32 and is returned as `out` (f32, or bf16 when the consumer takes bf16 anyway).
// x's gradient comes back in f32 (f64 for f64), so that several consumers' gradients of one x add up in
// f32; with narrow_x_grad a bf16 x's comes back in bf16, rounded once by the GEMM (for an x that feeds
// nothing else, whose gradient meets only bf16 consumers). The weight's gradient is added straight into the
// weight's .grad when it is a leaf with a dense .grad buffer (FlatParameters), else returned as usual.
Tensor linear(const Tensor& x, const Tensor& weight, DType compute, DType out, bool narrow_x_grad = false);
// residual + linear(x, weight, compute, f32 or f64): the residual (that dtype, the product's shape) is added
// in the GEMM's epilogue, so a transformer's residual addition costs no pass of its own. The residual's
// gradient is the incoming gradient itself, as add's is.
// sum_into (optional): a dense tensor outside autograd that already holds the residual's values, such as
// rms_norm's input_copy; the sum is then made in it in place (a GEMM adding into its own output, markedly
// faster in cuBLASLt than one reading a separate addend) and it is returned, carrying this op's history.
Tensor linear_residual(const Tensor& residual, const Tensor& x, const Tensor& weight, DType compute,
                       bool narrow_x_grad = false, const Tensor& sum_into = Tensor());

// --- model ops ---
Tensor embedding(const Tensor& weight, const Tensor& ids);  // ids i32 (...), out (..., dim)
// RMSNorm over the last dim, computed in f32; `out` may be bf16 (the cast fused into the norm, for a bf16
// consumer); the gradient of x is f32.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, DType out);
// The same, also writing a copy of x into *input_copy (a new dense tensor outside autograd) in the same
// pass: the buffer in which a following linear_residual over the residual x can make its sum in place.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, DType out, Tensor* input_copy);
// Rotary embedding (interleaved pairs) on x (batch, seq, heads*d_head), positions 0..seq-1.
Tensor rope(const Tensor& x, int64_t d_head, double theta);
// The same with the output rounded once to bf16 (x f32, rotated in f32), for a bf16 consumer (attention).
// x's gradient then comes back in bf16 too, rounded once: meant for an x made by a bf16 matmul, whose
// backward rounds its incoming gradient to bf16 anyway, so nothing is lost.
Tensor rope(const Tensor& x, int64_t d_head, double theta, DType out);
// Inference: row b of x holds the tokens at positions starts[b] .. starts[b] + seq - 1 (starts i32 (batch)
// on x's device, read there, so a CUDA graph replays with other positions): the values rope() gives those
// positions of a longer sequence. No autograd (an x that needs grad is refused).
Tensor rope_at(const Tensor& x, const Tensor& starts, int64_t d_head, double theta);
// silu(a) * b, computed in f32; a and b f32 (or f64), or bf16 with a bf16 result and bf16 gradients. The
// unfused reference the tests hold swiglu_projection to; the model runs swiglu_projection.
Tensor swiglu(const Tensor& a, const Tensor& b);
// The gate of a SwiGLU feed-forward layer, silu(x W1^T) * (x W3^T), as one op: both projections are one
// matmul each way over the two weights stacked (a view when they, or their bf16 mirrors, lie one after the
// other, as FlatParameters places them; else a copy). x (..., in), each weight (n, in); returns (..., n) in
// `compute` (the weights' dtype, or bf16: the projections rounded to bf16 as autocast's matmuls return
// them, the gate computed in f32 and rounded once). x's gradient is one product over all 2n columns, wide
// (f32), or with narrow_x_grad for a bf16 x rounded once to bf16 by the GEMM (as in ops::linear); each
// weight's gradient is offered in factored form (its n columns of the gate's gradient, and x).
Tensor swiglu_projection(const Tensor& x, const Tensor& w1, const Tensor& w3, DType compute,
                         bool narrow_x_grad = false);
// softmax(scale * s) over the last dim of (batch, T, T), causal mask optional.
Tensor softmax(const Tensor& s, double scale, bool causal);
// Mean cross-entropy of logits (N, V) against i32 targets (N); returns shape {1}. The unfused reference the
// tests hold linear_cross_entropy to; the model runs linear_cross_entropy.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// cross_entropy(linear(x, weight, compute, f32), targets) as one op that never holds the logits of all rows:
// x (..., in) with N rows, weight (V, in), targets i32 (N); returns the mean loss, shape {1}, f32 (f64 for
// f64). Rows go through in chunks of chunk_rows (0: as many as take about 1 GiB of f32 logits): per chunk
// the logits (from `compute` operands: the weight's dtype or bf16, x and the weight cast or the weight's
// bf16 mirror, as ops::linear reads them; bf16 logits for bf16 operands, rounded once as autocast's matmul
// returns them, f32 otherwise), the loss in f32 and, when a gradient is wanted, the logits' gradient in
// the compute dtype, which goes straight into x's and the weight's gradients (f32; f64 for f64). Backward
// then only scales them by the incoming gradient; the weight's gradient reaches its .grad through the usual
// accumulation. Out-of-range targets throw on the CPU and give a NaN loss on CUDA, as in cross_entropy.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets, DType compute,
                            int64_t chunk_rows = 0);

// --- attention ---
// q, k, v: (batch, heads, seq, d_head), any strides with a contiguous last dim. Returns O with the same
// dtype as q, (batch, heads, seq, d_head): contiguous, or head-interleaved (a transposed view of a dense
// (batch, seq, heads, d_head) buffer) when q is, so that merging the heads afterwards is free.
// deterministic: bit-identical gradients run to run (slower CUDA backward without atomics).
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                       bool deterministic = false);
// The front of a causal self-attention sublayer as one op: q, k, v = x Wq^T, x Wk^T, x Wv^T as one matmul
// over the three weights stacked (a view when they, or their bf16 mirrors, lie one after another in memory,
// as FlatParameters places them; else a copy), RoPE (interleaved pairs, positions 0..seq-1) on q and k, and
// causal flash attention over `heads` heads. x (batch, seq, in), each weight (n, in); returns the heads'
// merged output (batch, seq, n) in `compute` (the weights' dtype, or bf16: the projections rounded to bf16,
// q and k rotated in f32 and rounded again). One matmul each way instead of three: its backward computes
// x's gradient with one product over all 3n columns and offers each weight its gradient in factored form
// (that projection's columns of the fused gradient, and x), as ops::linear does. x's gradient is wide (f32),
// or with narrow_x_grad for a bf16 x rounded once to bf16 by the GEMM (as in ops::linear).
Tensor attention_qkv(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv, int64_t heads,
                     double rope_theta, DType compute, bool deterministic = false,
                     bool narrow_x_grad = false);
// The textbook path: S = QK^T, masked softmax, O = PV (materialises T x T); same contract as above.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

// --- attention over a key/value cache (inference; no autograd: inputs that need grad are refused) ---
// Where each of a batch's n entries sits in the cache: its new tokens continue cache row rows[i] after its
// starts[i] earlier tokens. On CUDA the kernels read `table`, the same values as i32 (2, n) on the cache's
// device (rows, then starts), so a CUDA graph replays with new entries copied into it; the vectors, the
// values at the call, serve the checks (and the CPU twins). The decode step's rope_at reads the table's
// starts on either device, so the table must hold the vectors' values.
struct CacheEntries {
  std::vector<int64_t> rows, starts;
  Tensor table;
};
// Entries with their table on `device` (a plain copy from the host; nn::KVCache::entries makes its own
// without making the host wait). Values outside i32 are refused by the ops that read them.
CacheEntries cache_entries(const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
                           Device device);
// keys, values: dense (cache rows, capacity, heads * d_head), one row per sequence. q (n, count, heads,
// d_head): entry i's `count` new queries, whose own keys and values are already stored at positions
// starts[i] .. starts[i] + count - 1 of row rows[i]. Query j of entry i attends causally to positions
// 0 .. starts[i] + j of that row, scale 1/sqrt(d_head). Returns (n, count, heads * d_head) in q's dtype,
// dense. The values of naive_attention's steps (f32 scores and softmax; for bf16, probabilities rounded to
// bf16 before the product with the values; the CUDA kernel's online softmax leaves them unrounded).
Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                        const CacheEntries& entries);
// store[rows[i], starts[i] : starts[i] + count] = new_values[i] for each of the n entries, in place: store
// dense (cache rows, capacity, dim), new_values (n, count, dim) of store's dtype. The rows must differ.
void cache_append(Tensor& store, const CacheEntries& entries, const Tensor& new_values);
// A decoding step's queries and keys rotated and its keys and values stored, in one pass on CUDA: returns
// rope_at(q) and does cache_append(keys, entries, rope_at(k)) and cache_append(values, entries, v), each
// entry's positions read from entries.table (the same values as those ops give). q, k, v (n, count,
// heads * d_head) of the cache's dtype.
Tensor rope_into_cache(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& keys, Tensor& values,
                       const CacheEntries& entries, int64_t d_head, double theta);

}  // namespace tt::ops
