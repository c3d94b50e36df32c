// The simple FlashAttention kernels: plain f32 FMA arithmetic, any element type (f32 or bf16 storage),
// written to be obviously correct rather than fast. They serve the f32 path, shapes the tensor-core
// kernels do not take (unaligned rows), and bf16 too when AttentionKernels::simple asks for them (tests).
//
// Work split: a block of 4 warps owns 16 rows (queries in the forward and the dQ pass, keys in the dK/dV
// pass), 4 rows per warp. The block streams the other side (keys or queries) through shared memory in
// tiles of 32, converted to f32. Inside a tile lane t handles element t of the tile: it computes one score
// (a full dot product over d_head, reading its own padded shared-memory row), the warp reduces max and sum
// with shuffles, and the per-lane probabilities go through a small shared buffer so that every lane can
// then update its slice of the output row (dims lane, lane + 32, ...).
// The forward keeps the online-softmax state (max m, sum l, unnormalised O) per row exactly as the CPU
// reference does, just with a tile of 32 keys. The backward needs no atomics: one kernel owns query rows
// and produces dQ, a second one owns key rows and produces dK and dV; both recompute P = exp(S - L).
// The causal mask (key j visible to query i iff j <= i) is tested per element, and tiles beyond the last
// visible key (or before the first query that sees a key) are never loaded.
#pragma once

#include <cmath>

#include "kernels/cuda/flash_attention_common.cuh"

namespace tt::cuda::flash {

constexpr int kSimpleWarps = 4;
constexpr int kSimpleThreads = 32 * kSimpleWarps;
constexpr int kSimpleRowsPerWarp = 4;
constexpr int kSimpleRows = kSimpleWarps * kSimpleRowsPerWarp;  // rows owned by one block
constexpr int kSimpleTile = 32;                                 // streamed rows per step, one per lane

// Output dims a lane owns: lane, lane + 32, ... (the last slot may run past d_head).
template <int D>
constexpr int kLaneSlots = (D + 31) / 32;

__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// rows x D values from global (row stride `row_stride`) into f32 shared memory with row pitch `pitch`;
// rows at or past valid_rows become zeros.
template <class T, int D>
__device__ inline void load_rows_f32(float* smem, int pitch, const T* gmem, int64_t row_stride, int rows,
                                     int64_t valid_rows) {
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int row = idx / D, e = idx % D;
    smem[row * pitch + e] = row < valid_rows ? to_float(gmem[row * row_stride + e]) : 0.0f;
  }
}

template <int D>
__device__ inline float dot_f32(const float* a, const float* b) {
  float sum = 0;
#pragma unroll 16
  for (int e = 0; e < D; ++e) sum += a[e] * b[e];
  return sum;
}

// Shared memory of the forward: K and V tiles (rows padded to D + 1 floats so that 32 lanes reading 32
// different rows hit 32 different banks), the block's Q rows and one probability row per warp.
template <int D>
constexpr size_t simple_forward_smem_bytes() {
  return sizeof(float) * (2 * kSimpleTile * (D + 1) + kSimpleRows * D + kSimpleWarps * kSimpleTile);
}

template <class T, int D>
__global__ void __launch_bounds__(kSimpleThreads) simple_forward_kernel(const Params p) {
  extern __shared__ float smem[];
  float* k_tile = smem;
  float* v_tile = k_tile + kSimpleTile * (D + 1);
  float* q_rows = v_tile + kSimpleTile * (D + 1);
  float* probs = q_rows + kSimpleRows * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, seq = p.seq, q0 = int64_t{blockIdx.x} * kSimpleRows;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.sq, bh, p.heads);
  const T* k = static_cast<const T*>(p.k) + head_offset(p.sk, bh, p.heads);
  const T* v = static_cast<const T*>(p.v) + head_offset(p.sv, bh, p.heads);
  T* o = static_cast<T*>(p.o) + head_offset(p.so, bh, p.heads);

  load_rows_f32<T, D>(q_rows, D, q + q0 * p.sq.seq, p.sq.seq, kSimpleRows, seq - q0);
  float row_max[kSimpleRowsPerWarp], row_sum[kSimpleRowsPerWarp], acc[kSimpleRowsPerWarp][kLaneSlots<D>];
#pragma unroll
  for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0;
#pragma unroll
    for (int c = 0; c < kLaneSlots<D>; ++c) acc[r][c] = 0;
  }

  const int64_t key_end = p.causal ? min(seq, q0 + kSimpleRows) : seq;
  for (int64_t k0 = 0; k0 < key_end; k0 += kSimpleTile) {
    __syncthreads();  // the previous tile is consumed (and q_rows is visible on the first pass)
    load_rows_f32<T, D>(k_tile, D + 1, k + k0 * p.sk.seq, p.sk.seq, kSimpleTile, seq - k0);
    load_rows_f32<T, D>(v_tile, D + 1, v + k0 * p.sv.seq, p.sv.seq, kSimpleTile, seq - k0);
    __syncthreads();
    const int64_t key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
      const int row = warp * kSimpleRowsPerWarp + r;
      const int64_t query = q0 + row;
      const bool visible = key < seq && (!p.causal || key <= query);
      const float score =
          visible ? dot_f32<D>(q_rows + row * D, k_tile + lane * (D + 1)) * p.scale : -INFINITY;
      const float new_max = fmaxf(row_max[r], warp_max(score));
      if (new_max == -INFINITY) continue;  // the whole warp agrees: nothing visible yet
      const float correction = expf(row_max[r] - new_max);
      const float prob = expf(score - new_max);
      row_sum[r] = row_sum[r] * correction + warp_sum(prob);
      row_max[r] = new_max;
      probs[warp * kSimpleTile + lane] = prob;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kLaneSlots<D>; ++c) {
        const int e = lane + 32 * c;
        if (e < D) {
          float pv = 0;
          for (int t = 0; t < kSimpleTile; ++t) pv += probs[warp * kSimpleTile + t] * v_tile[t * (D + 1) + e];
          acc[r][c] = acc[r][c] * correction + pv;
        }
      }
      __syncwarp();  // probs is rewritten by the next row
    }
  }

#pragma unroll
  for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
    const int64_t query = q0 + warp * kSimpleRowsPerWarp + r;
    if (query >= seq) continue;
#pragma unroll
    for (int c = 0; c < kLaneSlots<D>; ++c) {
      const int e = lane + 32 * c;
      if (e < D) o[query * p.so.seq + e] = from_float<T>(acc[r][c] / row_sum[r]);
    }
    if (lane == 0) p.lse[bh * seq + query] = row_max[r] + logf(row_sum[r]);
  }
}

// dQ pass: like the forward (rows = queries, streaming keys), with P = exp(S - L) recomputed exactly and
// dS = P * (dO.V - D); lane t's dS goes through shared memory and every lane adds dS K to its dims.
template <int D>
constexpr size_t simple_dq_smem_bytes() {
  return sizeof(float) * (2 * kSimpleTile * (D + 1) + 2 * kSimpleRows * D + kSimpleWarps * kSimpleTile);
}

template <class T, int D>
__global__ void __launch_bounds__(kSimpleThreads) simple_backward_dq_kernel(const Params p) {
  extern __shared__ float smem[];
  float* k_tile = smem;
  float* v_tile = k_tile + kSimpleTile * (D + 1);
  float* q_rows = v_tile + kSimpleTile * (D + 1);
  float* do_rows = q_rows + kSimpleRows * D;
  float* dscores = do_rows + kSimpleRows * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, seq = p.seq, q0 = int64_t{blockIdx.x} * kSimpleRows;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.sq, bh, p.heads);
  const T* k = static_cast<const T*>(p.k) + head_offset(p.sk, bh, p.heads);
  const T* v = static_cast<const T*>(p.v) + head_offset(p.sv, bh, p.heads);
  const T* d_o = static_cast<const T*>(p.d_o) + head_offset(p.so, bh, p.heads);
  T* dq = static_cast<T*>(p.dq) + head_offset(p.sq, bh, p.heads);

  load_rows_f32<T, D>(q_rows, D, q + q0 * p.sq.seq, p.sq.seq, kSimpleRows, seq - q0);
  load_rows_f32<T, D>(do_rows, D, d_o + q0 * p.so.seq, p.so.seq, kSimpleRows, seq - q0);
  float lse[kSimpleRowsPerWarp], delta[kSimpleRowsPerWarp], acc[kSimpleRowsPerWarp][kLaneSlots<D>];
#pragma unroll
  for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
    const int64_t query = q0 + warp * kSimpleRowsPerWarp + r;
    lse[r] = query < seq ? p.lse[bh * seq + query] : 0.0f;
    delta[r] = query < seq ? p.delta[bh * seq + query] : 0.0f;
#pragma unroll
    for (int c = 0; c < kLaneSlots<D>; ++c) acc[r][c] = 0;
  }

  const int64_t key_end = p.causal ? min(seq, q0 + kSimpleRows) : seq;
  for (int64_t k0 = 0; k0 < key_end; k0 += kSimpleTile) {
    __syncthreads();
    load_rows_f32<T, D>(k_tile, D + 1, k + k0 * p.sk.seq, p.sk.seq, kSimpleTile, seq - k0);
    load_rows_f32<T, D>(v_tile, D + 1, v + k0 * p.sv.seq, p.sv.seq, kSimpleTile, seq - k0);
    __syncthreads();
    const int64_t key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
      const int row = warp * kSimpleRowsPerWarp + r;
      const int64_t query = q0 + row;
      float dscore = 0;
      if (query < seq && key < seq && (!p.causal || key <= query)) {
        const float prob = expf(dot_f32<D>(q_rows + row * D, k_tile + lane * (D + 1)) * p.scale - lse[r]);
        const float dprob = dot_f32<D>(do_rows + row * D, v_tile + lane * (D + 1));
        dscore = prob * (dprob - delta[r]);
      }
      dscores[warp * kSimpleTile + lane] = dscore;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kLaneSlots<D>; ++c) {
        const int e = lane + 32 * c;
        if (e < D) {
          for (int t = 0; t < kSimpleTile; ++t)
            acc[r][c] += dscores[warp * kSimpleTile + t] * k_tile[t * (D + 1) + e];
        }
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
    const int64_t query = q0 + warp * kSimpleRowsPerWarp + r;
    if (query >= seq) continue;
#pragma unroll
    for (int c = 0; c < kLaneSlots<D>; ++c) {
      const int e = lane + 32 * c;
      if (e < D) dq[query * p.sq.seq + e] = from_float<T>(acc[r][c] * p.scale);
    }
  }
}

// dK/dV pass: rows = keys, streaming queries (with their L and D). Lane t handles query t of the tile:
// P_t and dS_t go through shared memory, then every lane adds P dO to dV and dS Q to dK for its dims.
template <int D>
constexpr size_t simple_dkdv_smem_bytes() {
  return sizeof(float) *
         (2 * kSimpleTile * (D + 1) + 2 * kSimpleRows * D + 2 * kSimpleTile + 2 * kSimpleWarps * kSimpleTile);
}

template <class T, int D>
__global__ void __launch_bounds__(kSimpleThreads) simple_backward_dkdv_kernel(const Params p) {
  extern __shared__ float smem[];
  float* q_tile = smem;
  float* do_tile = q_tile + kSimpleTile * (D + 1);
  float* k_rows = do_tile + kSimpleTile * (D + 1);
  float* v_rows = k_rows + kSimpleRows * D;
  float* lse_tile = v_rows + kSimpleRows * D;
  float* delta_tile = lse_tile + kSimpleTile;
  float* probs = delta_tile + kSimpleTile;
  float* dscores = probs + kSimpleWarps * kSimpleTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, seq = p.seq, k0 = int64_t{blockIdx.x} * kSimpleRows;
  const T* q = static_cast<const T*>(p.q) + head_offset(p.sq, bh, p.heads);
  const T* k = static_cast<const T*>(p.k) + head_offset(p.sk, bh, p.heads);
  const T* v = static_cast<const T*>(p.v) + head_offset(p.sv, bh, p.heads);
  const T* d_o = static_cast<const T*>(p.d_o) + head_offset(p.so, bh, p.heads);
  T* dk = static_cast<T*>(p.dk) + head_offset(p.sk, bh, p.heads);
  T* dv = static_cast<T*>(p.dv) + head_offset(p.sv, bh, p.heads);

  load_rows_f32<T, D>(k_rows, D, k + k0 * p.sk.seq, p.sk.seq, kSimpleRows, seq - k0);
  load_rows_f32<T, D>(v_rows, D, v + k0 * p.sv.seq, p.sv.seq, kSimpleRows, seq - k0);
  float dk_acc[kSimpleRowsPerWarp][kLaneSlots<D>], dv_acc[kSimpleRowsPerWarp][kLaneSlots<D>];
#pragma unroll
  for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
#pragma unroll
    for (int c = 0; c < kLaneSlots<D>; ++c) dk_acc[r][c] = dv_acc[r][c] = 0;
  }

  // Causal: queries before this block's first key see none of its keys.
  const int64_t query_begin = p.causal ? k0 : 0;
  for (int64_t i0 = query_begin; i0 < seq; i0 += kSimpleTile) {
    __syncthreads();
    load_rows_f32<T, D>(q_tile, D + 1, q + i0 * p.sq.seq, p.sq.seq, kSimpleTile, seq - i0);
    load_rows_f32<T, D>(do_tile, D + 1, d_o + i0 * p.so.seq, p.so.seq, kSimpleTile, seq - i0);
    if (threadIdx.x < kSimpleTile) {
      const int64_t query = i0 + threadIdx.x;
      lse_tile[threadIdx.x] = query < seq ? p.lse[bh * seq + query] : 0.0f;
      delta_tile[threadIdx.x] = query < seq ? p.delta[bh * seq + query] : 0.0f;
    }
    __syncthreads();
    const int64_t query = i0 + lane;
#pragma unroll
    for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
      const int row = warp * kSimpleRowsPerWarp + r;
      const int64_t key = k0 + row;
      float prob = 0, dscore = 0;
      if (query < seq && key < seq && (!p.causal || key <= query)) {
        prob = expf(dot_f32<D>(q_tile + lane * (D + 1), k_rows + row * D) * p.scale - lse_tile[lane]);
        const float dprob = dot_f32<D>(do_tile + lane * (D + 1), v_rows + row * D);
        dscore = prob * (dprob - delta_tile[lane]);
      }
      probs[warp * kSimpleTile + lane] = prob;
      dscores[warp * kSimpleTile + lane] = dscore;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kLaneSlots<D>; ++c) {
        const int e = lane + 32 * c;
        if (e < D) {
          for (int t = 0; t < kSimpleTile; ++t) {
            dv_acc[r][c] += probs[warp * kSimpleTile + t] * do_tile[t * (D + 1) + e];
            dk_acc[r][c] += dscores[warp * kSimpleTile + t] * q_tile[t * (D + 1) + e];
          }
        }
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int r = 0; r < kSimpleRowsPerWarp; ++r) {
    const int64_t key = k0 + warp * kSimpleRowsPerWarp + r;
    if (key >= seq) continue;
#pragma unroll
    for (int c = 0; c < kLaneSlots<D>; ++c) {
      const int e = lane + 32 * c;
      if (e < D) {
        dk[key * p.sk.seq + e] = from_float<T>(dk_acc[r][c] * p.scale);
        dv[key * p.sv.seq + e] = from_float<T>(dv_acc[r][c]);
      }
    }
  }
}

}  // namespace tt::cuda::flash
