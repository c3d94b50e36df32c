// Masked softmax (the naive attention's middle step), cross-entropy and AdamW on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace tt::cpu {

template <class T>
void softmax_forward(const T* s, T* p, int64_t batch, int64_t rows, int64_t cols, double scale, bool causal) {
  const T sc = static_cast<T>(scale);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      const T* sr = s + (b * rows + i) * cols;
      T* pr = p + (b * rows + i) * cols;
      const int64_t valid = causal ? i + 1 : cols;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, sr[j] * sc);
      T total = 0;
      for (int64_t j = 0; j < valid; ++j) {
        pr[j] = std::exp(sr[j] * sc - mx);
        total += pr[j];
      }
      for (int64_t j = 0; j < valid; ++j) pr[j] /= total;
      for (int64_t j = valid; j < cols; ++j) pr[j] = 0;
    }
  }
}

template <class T>
void softmax_backward(const T* dp, const T* p, T* ds, int64_t batch, int64_t rows, int64_t cols,
                      double scale) {
  const T sc = static_cast<T>(scale);
  for (int64_t r = 0; r < batch * rows; ++r) {
    const T* dpr = dp + r * cols;
    const T* pr = p + r * cols;
    T dot = 0;
    for (int64_t j = 0; j < cols; ++j) dot += dpr[j] * pr[j];
    for (int64_t j = 0; j < cols; ++j) ds[r * cols + j] = sc * pr[j] * (dpr[j] - dot);
  }
}

namespace {
// log(sum(exp(row))) over `vocab` logits, the exponentials in T, their sum in double: a running f32 sum of
// tens of thousands of small terms drifts (5e-5 relative over 50257 logits), more than the CUDA kernels'
// tree of partial sums, which this file is the reference for.
template <class T>
T row_logsumexp(const T* row, int64_t vocab) {
  T mx = row[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
  double total = 0;
  for (int64_t j = 0; j < vocab; ++j) total += static_cast<double>(std::exp(row[j] - mx));
  return static_cast<T>(static_cast<double>(mx) + std::log(total));
}
}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, T* lse, int64_t n,
                           int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * vocab;
    lse[i] = row_logsumexp(row, vocab);
    losses[i] = lse[i] - row[targets[i]];
  }
}

template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, const T* dloss,
                            double scale, T* dlogits, int64_t n, int64_t vocab) {
  const T g = *dloss * static_cast<T>(scale);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < vocab; ++j) {
      const T prob = std::exp(logits[i * vocab + j] - lse[i]);
      dlogits[i * vocab + j] = g * (prob - (j == targets[i] ? T(1) : T(0)));
    }
  }
}

template <class T>
void cross_entropy_rows(const T* logits, int64_t ld, const int32_t* targets, T* losses, T* dlogits,
                        double grad_scale, int64_t n, int64_t vocab) {
  const T scale = static_cast<T>(grad_scale);
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * ld;
    const T lse = row_logsumexp(row, vocab);
    losses[i] = lse - row[targets[i]];
    if (dlogits == nullptr) continue;
    // Read before written: dlogits may be the logits themselves.
    T* grad = dlogits + i * ld;
    for (int64_t j = 0; j < vocab; ++j)
      grad[j] = (std::exp(row[j] - lse) - (j == targets[i] ? T(1) : T(0))) * scale;
    for (int64_t j = vocab; j < ld; ++j) grad[j] = 0;
  }
}

void cross_entropy_rows_bf16(const bf16* logits, int64_t ld, const int32_t* targets, float* losses,
                             bf16* dlogits, double grad_scale, int64_t n, int64_t vocab) {
  std::vector<float> row(static_cast<size_t>(ld));
  for (int64_t i = 0; i < n; ++i) {
    const bf16* in = logits + i * ld;
    for (int64_t j = 0; j < ld; ++j) row[j] = static_cast<float>(in[j]);
    cross_entropy_rows<float>(row.data(), ld, targets + i, losses + i,
                              dlogits != nullptr ? row.data() : nullptr, grad_scale, 1, vocab);
    if (dlogits == nullptr) continue;
    bf16* grad = dlogits + i * ld;
    for (int64_t j = 0; j < ld; ++j) grad[j] = bf16(row[j]);
  }
}

template <class T>
void adamw(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr, double beta1,
           double beta2, double eps, double weight_decay, int64_t step) {
  // Scalars in double, the update in T, the same order of operations as torch.optim.AdamW.
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const T step_size = static_cast<T>(lr / bias1);
  const T bias2_sqrt = static_cast<T>(std::sqrt(bias2));
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), e = static_cast<T>(eps);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    param[i] *= decay;
    exp_avg[i] = b1 * exp_avg[i] + (T(1) - b1) * g;
    exp_avg_sq[i] = b2 * exp_avg_sq[i] + (T(1) - b2) * g * g;
    const T denom = std::sqrt(exp_avg_sq[i]) / bias2_sqrt + e;
    param[i] -= step_size * exp_avg[i] / denom;
  }
}

#define TT_INSTANTIATE(T)                                                                                    \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t, double, bool);                   \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, double);              \
  template void cross_entropy_forward<T>(const T*, const int32_t*, T*, T*, int64_t, int64_t);                \
  template void cross_entropy_backward<T>(const T*, const int32_t*, const T*, const T*, double, T*, int64_t, \
                                          int64_t);                                                          \
  template void cross_entropy_rows<T>(const T*, int64_t, const int32_t*, T*, T*, double, int64_t, int64_t);  \
  template void adamw<T>(T*, const T*, T*, T*, int64_t, double, double, double, double, double, int64_t);
TT_INSTANTIATE(float)
TT_INSTANTIATE(double)
#undef TT_INSTANTIATE

}  // namespace tt::cpu
