// CPU reference kernels (Eigen and plain loops). Every function works on contiguous row-major buffers and
// is templated on the float type (float, double) so gradient checks can run in double precision. These are
// the twins the CUDA kernels are tested against.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace tt::cpu {

// C[i] = alpha * op(A[i]) op(B[i]) + beta * C[i] for i < batch, all row-major. op(A) is m x k: A is stored
// m x k (lda >= k) or, when trans_a, k x m (lda >= m). Likewise op(B) is k x n.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
          int64_t stride_c, int64_t batch);
// bf16 inputs, f32 output and accumulation (the mixed-precision matmul).
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
               int64_t lda, int64_t stride_a, const bf16* b, int64_t ldb, int64_t stride_b, float beta,
               float* c, int64_t ldc, int64_t stride_c, int64_t batch);

template <class T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t n, int64_t dim);
// grad_weight += scatter of grad_out rows by ids.
template <class T>
void embedding_backward(const T* grad_out, const int32_t* ids, T* grad_weight, int64_t n, int64_t dim);

// y = w * x / sqrt(mean(x^2) + eps) per row; inv_rms[row] saved for backward.
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, T* inv_rms, int64_t rows, int64_t dim, double eps);
// dx written, dw written (not accumulated).
template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const T* inv_rms, T* dx, T* dw, int64_t rows,
                       int64_t dim);

// Rotary embedding with interleaved pairs on x of shape (batch, seq, dim), heads of d_head features each.
// inverse=true rotates by the negative angle (the backward pass). ld_x, ld_y: the rows' strides in elements
// (0: dim, dense rows), for rows that are part of wider ones (a fused projection's output). starts
// (nullable, batch entries): row b's tokens are at positions starts[b] onwards instead of 0 (inference).
template <class T>
void rope(const T* x, T* y, int64_t batch, int64_t seq, int64_t dim, int64_t d_head, double theta,
          bool inverse, int64_t ld_x = 0, int64_t ld_y = 0, const int32_t* starts = nullptr);

// out = silu(a) * b, and its backward.
template <class T>
void swiglu_forward(const T* a, const T* b, T* out, int64_t n);
template <class T>
void swiglu_backward(const T* dout, const T* a, const T* b, T* da, T* db, int64_t n);

// P = softmax(scale * S) over the last dim of (batch, rows, cols); with causal, column j > row i is masked
// (the query index is the row, aligned to the end when rows != cols is not supported: rows == cols).
template <class T>
void softmax_forward(const T* s, T* p, int64_t batch, int64_t rows, int64_t cols, double scale, bool causal);
// dS = scale * P * (dP - rowsum(dP * P)).
template <class T>
void softmax_backward(const T* dp, const T* p, T* ds, int64_t batch, int64_t rows, int64_t cols,
                      double scale);

// Attention of new queries over a key/value cache (inference; ops::cached_attention). q (n, count, heads,
// d_head) and out dense; keys and values (cache rows, capacity, heads * d_head) dense. Entry i reads cache
// row rows[i], which holds starts[i] earlier tokens followed by the entry's `count` new ones: its query j
// sees positions 0 .. starts[i] + j. Scores and softmax(scale * scores) in T, then the probabilities times
// the values.
template <class T>
void cached_attention(const T* q, const T* keys, const T* values, T* out, const int64_t* rows,
                      const int64_t* starts, int64_t n, int64_t count, int64_t heads, int64_t d_head,
                      int64_t capacity, double scale);
// The same over bf16 (ops::naive_attention's steps): scores and softmax in f32, the probabilities rounded
// to bf16 before their f32 product with the values, the output rounded once.
void cached_attention_bf16(const bf16* q, const bf16* keys, const bf16* values, bf16* out,
                           const int64_t* rows, const int64_t* starts, int64_t n, int64_t count,
                           int64_t heads, int64_t d_head, int64_t capacity, double scale);
// store[rows[i], starts[i] + t, :] = src[i, t, :] for i < n, t < count: store (cache rows, capacity, dim)
// and src (n, count, dim) dense, elements of elem_bytes bytes.
void cache_append(void* store, const void* src, int64_t elem_bytes, const int64_t* rows,
                  const int64_t* starts, int64_t n, int64_t count, int64_t capacity, int64_t dim);

// Per-row loss = logsumexp(logits) - logits[target]; lse saved for backward.
template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, T* lse, int64_t n,
                           int64_t vocab);
// dlogits = (softmax(logits) - onehot(target)) * (*dloss) * scale.
template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, const T* dloss,
                            double scale, T* dlogits, int64_t n, int64_t vocab);
// The fused classifier's loss over a chunk of n rows of logits, `ld` elements apart (ld >= vocab; the
// columns past vocab are padding, ops::linear_cross_entropy): losses[i] = logsumexp(row i) - row_i[target].
// With dlogits (nullable; rows ld apart, and it may be `logits` itself), also the gradient
// (softmax(row) - onehot(target)) * grad_scale, with zeros in the padding columns.
template <class T>
void cross_entropy_rows(const T* logits, int64_t ld, const int32_t* targets, T* losses, T* dlogits,
                        double grad_scale, int64_t n, int64_t vocab);
// The same over bf16 logits (a bf16 model's product, rounded once as autocast's matmul output is), computed
// in f32 as cross_entropy_rows<float> on the widened row: f32 losses, the gradient rounded once to bf16
// (dlogits may be `logits` itself).
void cross_entropy_rows_bf16(const bf16* logits, int64_t ld, const int32_t* targets, float* losses,
                             bf16* dlogits, double grad_scale, int64_t n, int64_t vocab);

template <class T>
void add(const T* a, const T* b, T* out, int64_t n, double alpha);  // out = a + alpha * b
template <class T>
void scale(const T* a, T* out, int64_t n, double s);
template <class T>
void fill(T* x, int64_t n, double value);
template <class T>
double sum(const T* x, int64_t n);
template <class T>
double sum_squares(const T* x, int64_t n);
// dst = (inputs[0] + ... + inputs[count - 1]) * scale, f32 or bf16 (added in that order and scaled in f32,
// rounded once); dst may be one of the inputs. The CUDA twin is the reduction step of the copy-engine
// all-reduce.
void add_ranks_scaled(void* dst, const void* const* inputs, int count, DType type, int64_t n, float scale);
// Converts n elements between any two of f32, f64, bf16, i32 (float -> int truncates).
void cast(const void* in, DType in_type, void* out, DType out_type, int64_t n);
// Gathers a strided view (ndim <= 8) into a contiguous buffer; elem_bytes is 2, 4 or 8.
void strided_copy(const void* in, void* out, int64_t elem_bytes, int ndim, const int64_t* shape,
                  const int64_t* in_strides);

// torch.optim.AdamW update over flat buffers; step counts from 1.
template <class T>
void adamw(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr, double beta1,
           double beta2, double eps, double weight_decay, int64_t step);

}  // namespace tt::cpu
