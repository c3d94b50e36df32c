// FlashAttention-2 on the CPU: the same tiled algorithm the CUDA kernels run, written as plain loops so that
// it can be read next to the FlashAttention-2 paper's Algorithms 1 and 2 and used as the reference the GPU is
// tested against.
//
// Forward, per (batch, head) and per tile of tile_q queries: walk the key tiles left to right keeping, per
// query row, the running max m of the scaled scores, the running sum l of exp(score - m) and an
// unnormalised output acc. A new tile may raise the max; then everything accumulated so far was
// computed against a too-small m and is rescaled by exp(m_old - m_new) before the tile is added. The
// full attention matrix never exists: only one tile_q x tile_k block of scores at a time.
//
// Causal mask: key j is visible to query i iff j <= i. Key tiles that start after the tile's last query
// are skipped entirely; the mask itself is only evaluated on tiles that straddle the diagonal, every other
// visited tile is fully visible.
//
// Backward (FA2 order): the outer loop is over key tiles, so dK and dV of a tile are accumulated in one
// place and written once; the inner loop visits the query tiles that can see the key tile, recomputes
// P = exp(S - L) from the saved L (no softmax normalisation pass needed) and adds this tile's share to dQ.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/error.h"
#include "kernels/flash_attention.h"

namespace tt::cpu {

namespace {

void check_problem(const AttentionProblem& p, int64_t tile_q, int64_t tile_k) {
  TT_CHECK(p.batch >= 1 && p.heads >= 1 && p.seq >= 1 && p.d_head >= 1,
           "flash_attention: batch, heads, seq and d_head must be positive");
  TT_ASSERT(tile_q >= 1 && tile_k >= 1, "flash_attention: tile sizes must be positive");
}

// Pointer to row 0 of one (batch, head) slice of a tensor with the given layout.
template <class P>
P* head_base(P* base, const AttentionStrides& s, int64_t b, int64_t h) {
  return base + b * s.batch + h * s.head;
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += a[e] * b[e];
  return sum;
}

}  // namespace

template <class T>
void flash_attention_forward(const AttentionProblem& p, const T* q, const T* k, const T* v, T* o, T* lse,
                             int64_t tile_q, int64_t tile_k) {
  check_problem(p, tile_q, tile_k);
  const int64_t n = p.seq, d = p.d_head;
  const T scale = static_cast<T>(p.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores(tile_q * tile_k), acc(tile_q * d), row_max(tile_q), row_sum(tile_q);

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* qh = head_base(q, p.q, b, h);
      const T* kh = head_base(k, p.k, b, h);
      const T* vh = head_base(v, p.v, b, h);
      T* oh = head_base(o, p.o, b, h);
      T* lh = lse + (b * p.heads + h) * n;

      for (int64_t q0 = 0; q0 < n; q0 += tile_q) {
        const int64_t rows = std::min(tile_q, n - q0);
        std::fill(row_max.begin(), row_max.end(), neg_inf);
        std::fill(row_sum.begin(), row_sum.end(), T(0));
        std::fill(acc.begin(), acc.end(), T(0));
        // With the causal mask no query of this tile sees a key at or past q0 + rows.
        const int64_t key_end = p.causal ? q0 + rows : n;

        for (int64_t k0 = 0; k0 < key_end; k0 += tile_k) {
          const int64_t cols = std::min(tile_k, n - k0);
          // Only a tile whose last key lies after its first query can hold hidden entries.
          const bool on_diagonal = p.causal && k0 + cols - 1 > q0;
          for (int64_t i = 0; i < rows; ++i) {
            const T* qi = qh + (q0 + i) * p.q.seq;
            T* srow = &scores[i * tile_k];
            for (int64_t j = 0; j < cols; ++j) {
              const bool hidden = on_diagonal && k0 + j > q0 + i;
              srow[j] = hidden ? neg_inf : dot(qi, kh + (k0 + j) * p.k.seq, d) * scale;
            }
          }
          for (int64_t i = 0; i < rows; ++i) {
            const T* srow = &scores[i * tile_k];
            T tile_max = neg_inf;
            for (int64_t j = 0; j < cols; ++j) tile_max = std::max(tile_max, srow[j]);
            const T new_max = std::max(row_max[i], tile_max);
            if (new_max == neg_inf) continue;  // nothing visible to this row yet
            // Rescale what was accumulated against the old max (exp(-inf) = 0 on the first tile).
            const T correction = std::exp(row_max[i] - new_max);
            T* acc_row = &acc[i * d];
            for (int64_t e = 0; e < d; ++e) acc_row[e] *= correction;
            T tile_sum = 0;
            for (int64_t j = 0; j < cols; ++j) {
              const T pij = std::exp(srow[j] - new_max);  // 0 for hidden keys
              tile_sum += pij;
              const T* vj = vh + (k0 + j) * p.v.seq;
              for (int64_t e = 0; e < d; ++e) acc_row[e] += pij * vj[e];
            }
            row_sum[i] = row_sum[i] * correction + tile_sum;
            row_max[i] = new_max;
          }
        }

        for (int64_t i = 0; i < rows; ++i) {
          T* oi = oh + (q0 + i) * p.o.seq;
          const T inv_sum = T(1) / row_sum[i];
          for (int64_t e = 0; e < d; ++e) oi[e] = acc[i * d + e] * inv_sum;
          lh[q0 + i] = row_max[i] + std::log(row_sum[i]);
        }
      }
    }
  }
}

template <class T>
void flash_attention_backward(const AttentionProblem& p, const T* q, const T* k, const T* v, const T* o,
                              const T* d_o, const T* lse, T* dq, T* dk, T* dv, int64_t tile_q,
                              int64_t tile_k) {
  check_problem(p, tile_q, tile_k);
  const int64_t n = p.seq, d = p.d_head;
  const T scale = static_cast<T>(p.scale);
  std::vector<T> delta(n), prob(tile_q * tile_k), dscore(tile_q * tile_k), dk_acc(tile_k * d),
      dv_acc(tile_k * d);

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* qh = head_base(q, p.q, b, h);
      const T* kh = head_base(k, p.k, b, h);
      const T* vh = head_base(v, p.v, b, h);
      const T* oh = head_base(o, p.o, b, h);
      const T* doh = head_base(d_o, p.o, b, h);
      const T* lh = lse + (b * p.heads + h) * n;
      T* dqh = head_base(dq, p.q, b, h);
      T* dkh = head_base(dk, p.k, b, h);
      T* dvh = head_base(dv, p.v, b, h);

      // D_i = rowsum(dO * O) equals rowsum(P * dP) and lets dS be formed tile by tile.
      for (int64_t i = 0; i < n; ++i) delta[i] = dot(doh + i * p.o.seq, oh + i * p.o.seq, d);
      for (int64_t i = 0; i < n; ++i) std::fill(dqh + i * p.q.seq, dqh + i * p.q.seq + d, T(0));

      for (int64_t k0 = 0; k0 < n; k0 += tile_k) {
        const int64_t cols = std::min(tile_k, n - k0);
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        // Causal: queries before k0 see none of these keys; start at the query tile holding k0.
        const int64_t q_start = p.causal ? (k0 / tile_q) * tile_q : 0;

        for (int64_t q0 = q_start; q0 < n; q0 += tile_q) {
          const int64_t rows = std::min(tile_q, n - q0);
          const bool on_diagonal = p.causal && k0 + cols - 1 > q0;
          for (int64_t i = 0; i < rows; ++i) {
            const T* qi = qh + (q0 + i) * p.q.seq;
            const T* doi = doh + (q0 + i) * p.o.seq;
            for (int64_t j = 0; j < cols; ++j) {
              T pij = 0, dsij = 0;
              if (!(on_diagonal && k0 + j > q0 + i)) {
                // P recomputed from the saved log-sum-exp: already normalised.
                pij = std::exp(dot(qi, kh + (k0 + j) * p.k.seq, d) * scale - lh[q0 + i]);
                const T dpij = dot(doi, vh + (k0 + j) * p.v.seq, d);
                dsij = pij * (dpij - delta[q0 + i]);
              }
              prob[i * tile_k + j] = pij;
              dscore[i * tile_k + j] = dsij;
            }
          }
          // dV += P^T dO and dK += dS^T Q * scale (this key tile's rows).
          for (int64_t j = 0; j < cols; ++j) {
            for (int64_t i = 0; i < rows; ++i) {
              const T pij = prob[i * tile_k + j], dsij = dscore[i * tile_k + j] * scale;
              const T* doi = doh + (q0 + i) * p.o.seq;
              const T* qi = qh + (q0 + i) * p.q.seq;
              for (int64_t e = 0; e < d; ++e) {
                dv_acc[j * d + e] += pij * doi[e];
                dk_acc[j * d + e] += dsij * qi[e];
              }
            }
          }
          // dQ += dS K * scale (this query tile's rows; other key tiles add their share).
          for (int64_t i = 0; i < rows; ++i) {
            T* dqi = dqh + (q0 + i) * p.q.seq;
            for (int64_t j = 0; j < cols; ++j) {
              const T dsij = dscore[i * tile_k + j] * scale;
              const T* kj = kh + (k0 + j) * p.k.seq;
              for (int64_t e = 0; e < d; ++e) dqi[e] += dsij * kj[e];
            }
          }
        }

        for (int64_t j = 0; j < cols; ++j) {
          std::copy(&dk_acc[j * d], &dk_acc[j * d] + d, dkh + (k0 + j) * p.k.seq);
          std::copy(&dv_acc[j * d], &dv_acc[j * d] + d, dvh + (k0 + j) * p.v.seq);
        }
      }
    }
  }
}

#define TT_INSTANTIATE_FLASH_CPU(T)                                                                          \
  template void flash_attention_forward<T>(const AttentionProblem&, const T*, const T*, const T*, T*, T*,    \
                                           int64_t, int64_t);                                                \
  template void flash_attention_backward<T>(const AttentionProblem&, const T*, const T*, const T*, const T*, \
                                            const T*, const T*, T*, T*, T*, int64_t, int64_t);
TT_INSTANTIATE_FLASH_CPU(float)
TT_INSTANTIATE_FLASH_CPU(double)
#undef TT_INSTANTIATE_FLASH_CPU

}  // namespace tt::cpu
