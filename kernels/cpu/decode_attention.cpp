// Attention over a key/value cache (inference) and the cache's batched write, as plain loops: the twins of
// kernels/cuda/decode_attention.cu and the reference it is tested against. The attention takes the steps of
// ops::naive_attention for each query: every score, the softmax over them, the weighted sum of the values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace tt::cpu {

namespace {

// A probability as the second product reads it: ops::naive_attention casts the f32 probabilities to the
// inputs' dtype first, so bf16 inputs meet bf16 probabilities.
template <class T, class Acc>
Acc as_operand(Acc p) {
  if constexpr (std::is_same_v<T, bf16>) {
    return static_cast<float>(bf16(p));
  } else {
    return p;
  }
}

// T is the storage type, Acc the type scores, softmax and sums are computed in (f32 for bf16).
template <class T, class Acc>
void attend_cached(const T* q, const T* keys, const T* values, T* out, const int64_t* rows,
                   const int64_t* starts, int64_t n, int64_t count, int64_t heads, int64_t d_head,
                   int64_t capacity, double scale) {
  const int64_t dim = heads * d_head;
  const Acc sc = static_cast<Acc>(scale);
  std::vector<Acc> query(static_cast<size_t>(d_head)), acc(static_cast<size_t>(d_head));
  std::vector<Acc> probs(static_cast<size_t>(capacity));
  for (int64_t i = 0; i < n; ++i) {
    const T* row_keys = keys + rows[i] * capacity * dim;
    const T* row_values = values + rows[i] * capacity * dim;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t seen = starts[i] + j + 1;
      for (int64_t h = 0; h < heads; ++h) {
        const T* qh = q + ((i * count + j) * heads + h) * d_head;
        for (int64_t e = 0; e < d_head; ++e) query[e] = static_cast<Acc>(qh[e]);
        Acc max_score = -std::numeric_limits<Acc>::infinity();
        for (int64_t t = 0; t < seen; ++t) {
          const T* k = row_keys + t * dim + h * d_head;
          Acc dot = 0;
          for (int64_t e = 0; e < d_head; ++e) dot += query[e] * static_cast<Acc>(k[e]);
          probs[t] = dot * sc;
          max_score = std::max(max_score, probs[t]);
        }
        Acc total = 0;
        for (int64_t t = 0; t < seen; ++t) {
          probs[t] = std::exp(probs[t] - max_score);
          total += probs[t];
        }
        std::fill(acc.begin(), acc.end(), Acc{0});
        for (int64_t t = 0; t < seen; ++t) {
          const Acc p = as_operand<T>(probs[t] / total);
          const T* v = row_values + t * dim + h * d_head;
          for (int64_t e = 0; e < d_head; ++e) acc[e] += p * static_cast<Acc>(v[e]);
        }
        T* oh = out + ((i * count + j) * heads + h) * d_head;
        for (int64_t e = 0; e < d_head; ++e) oh[e] = static_cast<T>(acc[e]);
      }
    }
  }
}

}  // namespace

template <class T>
void cached_attention(const T* q, const T* keys, const T* values, T* out, const int64_t* rows,
                      const int64_t* starts, int64_t n, int64_t count, int64_t heads, int64_t d_head,
                      int64_t capacity, double scale) {
  attend_cached<T, T>(q, keys, values, out, rows, starts, n, count, heads, d_head, capacity, scale);
}

void cached_attention_bf16(const bf16* q, const bf16* keys, const bf16* values, bf16* out,
                           const int64_t* rows, const int64_t* starts, int64_t n, int64_t count,
                           int64_t heads, int64_t d_head, int64_t capacity, double scale) {
  attend_cached<bf16, float>(q, keys, values, out, rows, starts, n, count, heads, d_head, capacity, scale);
}

void cache_append(void* store, const void* src, int64_t elem_bytes, const int64_t* rows,
                  const int64_t* starts, int64_t n, int64_t count, int64_t capacity, int64_t dim) {
  const size_t span_bytes = static_cast<size_t>(count * dim * elem_bytes);
  for (int64_t i = 0; i < n; ++i) {
    char* dst = static_cast<char*>(store) + (rows[i] * capacity + starts[i]) * dim * elem_bytes;
    std::memcpy(dst, static_cast<const char*>(src) + static_cast<size_t>(i) * span_bytes, span_bytes);
  }
}

template void cached_attention<float>(const float*, const float*, const float*, float*, const int64_t*,
                                      const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, double);
template void cached_attention<double>(const double*, const double*, const double*, double*, const int64_t*,
                                       const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, double);

}  // namespace tt::cpu
