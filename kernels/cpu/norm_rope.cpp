// Embedding gather/scatter, RMSNorm and rotary embedding on the CPU.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace tt::cpu {

template <class T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t n, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    const T* row = weight + static_cast<int64_t>(ids[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) out[i * dim + j] = row[j];
  }
}

template <class T>
void embedding_backward(const T* grad_out, const int32_t* ids, T* grad_weight, int64_t n, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    T* row = grad_weight + static_cast<int64_t>(ids[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += grad_out[i * dim + j];
  }
}

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, T* inv_rms, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T mean_sq = 0;
    for (int64_t j = 0; j < dim; ++j) mean_sq += xr[j] * xr[j];
    mean_sq /= static_cast<T>(dim);
    const T inv = T(1) / std::sqrt(mean_sq + static_cast<T>(eps));
    inv_rms[r] = inv;
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] = w[j] * (xr[j] * inv);
  }
}

template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const T* inv_rms, T* dx, T* dw, int64_t rows,
                       int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) dw[j] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const T inv = inv_rms[r];
    // dx = inv * (w*dy) - inv^3/dim * x * sum(w*dy*x)
    T dot = 0;
    for (int64_t j = 0; j < dim; ++j) dot += w[j] * dyr[j] * xr[j];
    const T coef = inv * inv * inv * dot / static_cast<T>(dim);
    for (int64_t j = 0; j < dim; ++j) {
      dx[r * dim + j] = inv * w[j] * dyr[j] - coef * xr[j];
      dw[j] += dyr[j] * xr[j] * inv;
    }
  }
}

template <class T>
void rope(const T* x, T* y, int64_t batch, int64_t seq, int64_t dim, int64_t d_head, double theta,
          bool inverse, int64_t ld_x, int64_t ld_y, const int32_t* starts) {
  const int64_t half = d_head / 2;
  if (ld_x == 0) ld_x = dim;
  if (ld_y == 0) ld_y = dim;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const T* xr = x + (b * seq + t) * ld_x;
      T* yr = y + (b * seq + t) * ld_y;
      for (int64_t i = 0; i < half; ++i) {
        // Same rounding steps as the CUDA kernel: inverse frequency in double, angle in T.
        const T inv_freq = static_cast<T>(std::pow(theta, -2.0 * static_cast<double>(i) / d_head));
        const T angle = static_cast<T>(t + (starts != nullptr ? starts[b] : 0)) * inv_freq;
        const T c = std::cos(angle);
        const T s = inverse ? -std::sin(angle) : std::sin(angle);
        for (int64_t h = 0; h < dim; h += d_head) {
          const T x0 = xr[h + 2 * i], x1 = xr[h + 2 * i + 1];
          yr[h + 2 * i] = x0 * c - x1 * s;
          yr[h + 2 * i + 1] = x0 * s + x1 * c;
        }
      }
    }
  }
}

#define TT_INSTANTIATE(T)                                                                                 \
  template void embedding_forward<T>(const T*, const int32_t*, T*, int64_t, int64_t);                     \
  template void embedding_backward<T>(const T*, const int32_t*, T*, int64_t, int64_t);                    \
  template void rms_norm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);                \
  template void rms_norm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t);   \
  template void rope<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, bool, int64_t, int64_t, \
                        const int32_t*);
TT_INSTANTIATE(float)
TT_INSTANTIATE(double)
#undef TT_INSTANTIATE

}  // namespace tt::cpu
