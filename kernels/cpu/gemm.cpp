// Batched row-major GEMM on Eigen maps: no copies for f32/f64, one conversion to float for bf16.
#include <Eigen/Dense>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace tt::cpu {

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;

template <class T>
void gemm_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const ConstMap<T> A(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  const ConstMap<T> B(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  MutMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    C.setZero();
  } else if (beta != T(1)) {
    C *= beta;
  }
  if (!trans_a && !trans_b) C.noalias() += alpha * (A * B);
  if (!trans_a && trans_b) C.noalias() += alpha * (A * B.transpose());
  if (trans_a && !trans_b) C.noalias() += alpha * (A.transpose() * B);
  if (trans_a && trans_b) C.noalias() += alpha * (A.transpose() * B.transpose());
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
          int64_t stride_c, int64_t batch) {
  for (int64_t i = 0; i < batch; ++i) {
    gemm_one(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
             c + i * stride_c, ldc);
  }
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
               int64_t lda, int64_t stride_a, const bf16* b, int64_t ldb, int64_t stride_b, float beta,
               float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  std::vector<float> af(static_cast<size_t>(a_rows * a_cols)), bf(static_cast<size_t>(b_rows * b_cols));
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < a_rows; ++r)
      for (int64_t col = 0; col < a_cols; ++col)
        af[r * a_cols + col] = static_cast<float>(a[i * stride_a + r * lda + col]);
    for (int64_t r = 0; r < b_rows; ++r)
      for (int64_t col = 0; col < b_cols; ++col)
        bf[r * b_cols + col] = static_cast<float>(b[i * stride_b + r * ldb + col]);
    gemm_one<float>(trans_a, trans_b, m, n, k, alpha, af.data(), a_cols, bf.data(), b_cols, beta,
                    c + i * stride_c, ldc);
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t,
                          const float*, int64_t, int64_t, float, float*, int64_t, int64_t, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, int64_t,
                           const double*, int64_t, int64_t, double, double*, int64_t, int64_t, int64_t);

}  // namespace tt::cpu
