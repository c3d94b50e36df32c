// Embedding gather/scatter, RMSNorm and rotary embedding on the GPU: the twins of kernels/cpu/norm_rope.cpp.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace tt::cuda {
namespace {

constexpr int kRowThreads = 256;
// Row kernels take one block per row up to this many blocks and loop beyond, so any row count launches.
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>(std::min(rows, kMaxRowBlocks));
}

// Every warp reduces the same per-warp totals in the same order, so all threads return the same value. The
// leading barrier lets a kernel call this once per row in a loop without racing on warp_totals.
__device__ float block_sum(float v) {
  __shared__ float warp_totals[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_totals[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void embedding_forward_kernel(const float* weight, const int32_t* ids, float* out, int64_t n,
                                         int64_t dim) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* src = weight + static_cast<int64_t>(ids[row]) * dim;
    float* dst = out + row * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
  }
}

// embedding_backward is made reproducible by never letting two threads add into the same value. The
// (id, position) pairs are sorted by id (stable, so equal ids keep their token order), and the sorted list
// is cut into chunks of kEmbChunkRows rows. A run of equal ids belongs to the chunk it starts in, whose
// blocks add its rows in token order to the existing grad_weight value, which is exactly the CPU twin's
// order; a run that goes on into the next chunk and ends there is finished by the same blocks. A longer
// run (a frequent token, or a small vocabulary) would serialise one block over many rows, so every later
// chunk it reaches stores a partial sum of its rows there, and a second kernel adds up the run's rows in
// its first chunk and those partials in a fixed order. Which chunk does what depends only on the ids, so
// the order of additions, and with it every bit, does too.
constexpr int kEmbChunkRows = 32;
constexpr int kEmbChunkThreads = 128;
// Rows whose loads are in flight together; bounded by registers, as each holds kVec floats per row.
constexpr int kEmbBatch = 8;
constexpr int kEmbJoinWarps = 8;
constexpr int64_t kEmbJoinBlocks = 4096;
constexpr unsigned int kFullWarp = 0xffffffffu;

// Per sorted row: what its chunk's blocks do with the piece of the run it is in (add it to grad_weight,
// the same with the run's rows in the next chunk appended, store it as a partial, or leave it to another
// block), and whether the piece starts at this row.
enum : uint8_t {
  kEmbWhole = 0,
  kEmbExtend = 1,
  kEmbPartial = 2,
  kEmbSkip = 3,
  kEmbModeMask = 3,
  kEmbPieceStart = 4
};

// A run spanning more than one chunk boundary: its first chunk, where it starts in that chunk, the last
// chunk it reaches, and its id.
struct EmbJoin {
  int32_t chunk;
  int32_t head;
  int32_t last_chunk;
  int32_t key;
};

// kVec consecutive columns of one row; one 16-byte access per row when kVec is 4.
template <int kVec>
struct EmbLane {
  float x[kVec];
};

template <int kVec>
__device__ EmbLane<kVec> emb_load(const float* p) {
  if constexpr (kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    return {{t.x, t.y, t.z, t.w}};
  } else {
    return {{*p}};
  }
}

template <int kVec>
__device__ void emb_store(float* p, const EmbLane<kVec>& v) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v.x[0], v.x[1], v.x[2], v.x[3]);
  } else {
    *p = v.x[0];
  }
}

template <int kVec>
__device__ void emb_add(EmbLane<kVec>& acc, const EmbLane<kVec>& v) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc.x[k] += v.x[k];
}

// -0.0f is the exact identity of float addition, so a sum started from it is the plain in-order sum.
template <int kVec>
__device__ EmbLane<kVec> emb_identity() {
  EmbLane<kVec> v;
#pragma unroll
  for (int k = 0; k < kVec; ++k) v.x[k] = -0.0f;
  return v;
}

__global__ void embedding_positions_kernel(int32_t* positions, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) positions[i] = static_cast<int32_t>(i);
}

// One block per (chunk, tile of columns), kVec columns per thread; the tiles of a chunk are neighbouring
// blocks so that whole rows are read at about the same time. Rows are summed in batches whose loads are
// all issued before the batch's first addition, so the in-order sums do not wait on memory row by row.
template <int kVec>
__global__ void __launch_bounds__(kEmbChunkThreads)
    embedding_backward_chunk_kernel(const float* __restrict__ grad_out, const int32_t* __restrict__ keys,
                                    const int32_t* __restrict__ rows, float* __restrict__ grad_weight,
                                    float* __restrict__ partials, EmbJoin* __restrict__ joins,
                                    int32_t* __restrict__ join_count, int64_t n, int64_t dim, int64_t tiles) {
  static_assert(kEmbChunkRows == 32, "a chunk's rows are classified by one warp");
  __shared__ int64_t s_src[kEmbChunkRows];
  __shared__ int64_t s_dst[kEmbChunkRows];
  __shared__ int64_t s_tail_src[kEmbChunkRows];
  __shared__ uint8_t s_code[kEmbChunkRows];
  __shared__ int s_tail;
  __shared__ int s_join_head;
  const int64_t chunk = blockIdx.x / tiles;
  const int64_t tile = blockIdx.x - chunk * tiles;
  const int64_t begin = chunk * kEmbChunkRows;
  const int count = static_cast<int>(min(n - begin, static_cast<int64_t>(kEmbChunkRows)));
  const int64_t end = begin + count;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    // Only the first piece can continue a run from the previous chunk, and only the last can go on
    // into the next one; every other piece is a whole run.
    const int32_t first_key = keys[begin];
    const int32_t last_key = keys[end - 1];
    const bool enters = begin > 0 && keys[begin - 1] == first_key;
    const bool leaves = end < n && keys[end] == last_key;
    // The previous chunk's blocks finished this run (kEmbExtend there): it began in that chunk (not
    // before its first row) and ends in this one.
    const bool first_finished_before =
        enters && (begin == kEmbChunkRows || keys[begin - kEmbChunkRows - 1] != first_key) &&
        !(leaves && first_key == last_key);
    const bool last_owned = leaves && !(enters && first_key == last_key);
    // This chunk finishes the run it leaves with: the run ends within the next chunk.
    const bool last_ends_next =
        last_owned && (end + kEmbChunkRows >= n || keys[end + kEmbChunkRows] != last_key);
    const int32_t key = lane < count ? keys[begin + lane] : last_key;
    if (lane < count) {
      uint8_t code = kEmbWhole;
      if (enters && key == first_key) {
        code = first_finished_before ? kEmbSkip : kEmbPartial;
      } else if (leaves && key == last_key) {
        code = last_ends_next ? kEmbExtend : kEmbSkip;
      }
      if (lane == 0 || key != keys[begin + lane - 1]) code |= kEmbPieceStart;
      s_src[lane] = static_cast<int64_t>(rows[begin + lane]) * dim;
      s_dst[lane] = static_cast<int64_t>(key) * dim;
      s_code[lane] = code;
    }
    const bool in_tail = last_ends_next && end + lane < n && keys[end + lane] == last_key;
    const unsigned int tail_lanes = __ballot_sync(kFullWarp, in_tail);
    if (in_tail) s_tail_src[lane] = static_cast<int64_t>(rows[end + lane]) * dim;
    const unsigned int last_lanes = __ballot_sync(kFullWarp, lane < count && key == last_key);
    if (lane == 0) {
      s_tail = __popc(tail_lanes);
      s_join_head = last_owned && !last_ends_next ? __ffs(static_cast<int>(last_lanes)) - 1 : -1;
    }
  }
  __syncthreads();
  const int64_t col = (tile * blockDim.x + threadIdx.x) * kVec;
  if (col >= dim) return;

  EmbLane<kVec> acc = emb_identity<kVec>();
  uint8_t mode = kEmbSkip;
  int64_t dst = 0;
  const auto flush = [&] {
    if (mode == kEmbWhole) {
      emb_store(grad_weight + dst + col, acc);
    } else if (mode == kEmbPartial) {
      emb_store(partials + chunk * dim + col, acc);
    }
  };
  for (int base = 0; base < count; base += kEmbBatch) {
    EmbLane<kVec> v[kEmbBatch];
    EmbLane<kVec> start[kEmbBatch];
#pragma unroll
    for (int u = 0; u < kEmbBatch; ++u) {
      const int r = base + u;
      v[u] = emb_identity<kVec>();
      start[u] = emb_identity<kVec>();
      if (r < count) {
        const uint8_t code = s_code[r];
        const uint8_t m = code & kEmbModeMask;
        if (m != kEmbSkip) v[u] = emb_load<kVec>(grad_out + s_src[r] + col);
        if ((code & kEmbPieceStart) && (m == kEmbWhole || m == kEmbExtend))
          start[u] = emb_load<kVec>(grad_weight + s_dst[r] + col);
      }
    }
#pragma unroll
    for (int u = 0; u < kEmbBatch; ++u) {
      const int r = base + u;
      if (r < count) {
        const uint8_t code = s_code[r];
        if (code & kEmbPieceStart) {
          flush();
          mode = code & kEmbModeMask;
          dst = s_dst[r];
          acc = start[u];
        }
        if (mode != kEmbSkip) emb_add(acc, v[u]);
      }
    }
  }
  flush();
  if (mode == kEmbExtend) {
    const int tail = s_tail;
    for (int base = 0; base < tail; base += kEmbBatch) {
      EmbLane<kVec> v[kEmbBatch];
#pragma unroll
      for (int u = 0; u < kEmbBatch; ++u)
        v[u] = base + u < tail ? emb_load<kVec>(grad_out + s_tail_src[base + u] + col) : emb_identity<kVec>();
#pragma unroll
      for (int u = 0; u < kEmbBatch; ++u) emb_add(acc, v[u]);
    }
    emb_store(grad_weight + dst + col, acc);
  }

  // The join list's order only decides which block finishes which run, never the order of additions.
  if (tile == 0 && threadIdx.x == 0 && s_join_head >= 0) {
    // The run fills the next chunk and reaches at least the one after. It reaches a chunk iff that
    // chunk's first key is its id; keys are sorted, so gallop, then bisect, for the last such chunk.
    const int64_t chunks = (n + kEmbChunkRows - 1) / kEmbChunkRows;
    const int32_t key = keys[end - 1];
    int64_t reached = 2, probe = 4;
    while (chunk + probe < chunks && keys[(chunk + probe) * kEmbChunkRows] == key) {
      reached = probe;
      probe *= 2;
    }
    probe = min(probe, chunks - chunk);
    while (probe - reached > 1) {
      const int64_t mid = reached + (probe - reached) / 2;
      if (keys[(chunk + mid) * kEmbChunkRows] == key) {
        reached = mid;
      } else {
        probe = mid;
      }
    }
    joins[atomicAdd(join_count, 1)] = {static_cast<int32_t>(chunk), s_join_head,
                                       static_cast<int32_t>(chunk + reached), key};
  }
}

// Finishes the listed runs, one at a time per block slot, 32 * kVec columns per block. A run's addends
// are, in order, its grad_weight value, its rows in its first chunk and the partials of the later chunks;
// they are split into kEmbJoinWarps contiguous ranges, one per warp, so that even a run as long as the
// whole batch keeps many loads in flight, and the warps' sums are then added in warp order.
template <int kVec>
__global__ void __launch_bounds__(32 * kEmbJoinWarps)
    embedding_backward_join_kernel(const float* __restrict__ grad_out, const int32_t* __restrict__ rows,
                                   float* __restrict__ grad_weight, const float* __restrict__ partials,
                                   const EmbJoin* __restrict__ joins, const int32_t* __restrict__ join_count,
                                   int64_t dim, int64_t tiles) {
  __shared__ EmbLane<kVec> s_sum[kEmbJoinWarps][32];
  const int64_t slot = blockIdx.x / tiles;
  const int64_t slots = gridDim.x / tiles;
  const int lane = static_cast<int>(threadIdx.x);
  const int warp = static_cast<int>(threadIdx.y);
  const int64_t col = ((blockIdx.x - slot * tiles) * 32 + lane) * kVec;
  const bool active = col < dim;
  const int64_t count = *join_count;
  for (int64_t j = slot; j < count; j += slots) {
    const EmbJoin join = joins[j];
    const int64_t first_chunk = join.chunk;
    const int32_t row = rows[first_chunk * kEmbChunkRows + lane];
    const int head_rows = kEmbChunkRows - join.head;
    const int64_t addends = 1 + head_rows + (join.last_chunk - first_chunk);
    const int64_t from = addends * warp / kEmbJoinWarps;
    const int64_t to = addends * (warp + 1) / kEmbJoinWarps;
    const int64_t dst = static_cast<int64_t>(join.key) * dim + col;
    EmbLane<kVec> acc = emb_identity<kVec>();
    for (int64_t base = from; base < to; base += kEmbBatch) {
      EmbLane<kVec> v[kEmbBatch];
#pragma unroll
      for (int u = 0; u < kEmbBatch; ++u) {
        const int64_t i = base + u;
        // Every lane takes part in the shuffle, including those past the last column.
        const int from_lane = i >= 1 && i <= head_rows ? join.head + static_cast<int>(i) - 1 : 0;
        const int32_t r = __shfl_sync(kFullWarp, row, from_lane);
        v[u] = emb_identity<kVec>();
        if (active && i < to) {
          if (i == 0) {
            v[u] = emb_load<kVec>(grad_weight + dst);
          } else if (i <= head_rows) {
            v[u] = emb_load<kVec>(grad_out + static_cast<int64_t>(r) * dim + col);
          } else {
            v[u] = emb_load<kVec>(partials + (first_chunk + i - head_rows) * dim + col);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kEmbBatch; ++u) emb_add(acc, v[u]);
    }
    s_sum[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && active) {
      for (int w = 1; w < kEmbJoinWarps; ++w) emb_add(acc, s_sum[w][lane]);
      emb_store(grad_weight + dst, acc);
    }
    __syncthreads();
  }
}

// IEEE 1/sqrt rather than rsqrtf, and w * (x * inv) in that order, to stay on the CPU twin's rounding; a bf16
// y is that f32 value rounded once. With `vec` (dim a multiple of 4, every pointer aligned to 4 elements)
// each thread moves four elements per access; the order of the sum of squares depends only on `vec` and
// the shape.
template <class Y>
__global__ void rms_norm_forward_kernel(const float* x, const float* w, Y* y, float* inv_rms, float* x_copy,
                                        int64_t rows, int64_t dim, float eps, bool vec) {
  const int64_t groups = dim / 4;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * dim;
    Y* yr = y + row * dim;
    float sum_sq = 0;
    if (vec) {
      for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
        float v[4];
        load4(xr, k, v);
        for (int e = 0; e < 4; ++e) sum_sq += v[e] * v[e];
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum_sq += xr[j] * xr[j];
    }
    const float mean_sq = block_sum(sum_sq) / static_cast<float>(dim);
    const float inv = 1.0f / sqrtf(mean_sq + eps);
    if (threadIdx.x == 0) inv_rms[row] = inv;
    if (vec) {
      for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
        float v[4], wv[4];
        load4(xr, k, v);
        load4(w, k, wv);
        if (x_copy != nullptr) store4(x_copy + row * dim, k, v);
        for (int e = 0; e < 4; ++e) v[e] = wv[e] * (v[e] * inv);
        store4(yr, k, v);
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        if (x_copy != nullptr) x_copy[row * dim + j] = xr[j];
        yr[j] = from_float<Y>(w[j] * (xr[j] * inv));
      }
    }
  }
}

// dx = inv * (w * dy) - inv^3 / dim * x * sum(w * dy * x); with `accumulate`, dx += that (rounded once more,
// as a separate addition would). `vec` as in the forward kernel.
//
// dw = sum over rows of dy * x * inv comes out of the same pass, so dy and x are read once for both. For
// reproducible bits the sum has two fixed-order stages instead of atomics: each block takes a run of
// consecutive rows and sums them row by row into `acc`, one float per column, then that is its row of
// `partials`; column_sum_kernel adds the blocks' rows in a fixed order. `acc` lives in shared memory when a
// row's floats fit there (`in_shared`), else it is the block's row of `partials` itself: each thread owns
// the same columns in every row, so either way its part needs no synchronisation between rows, and both
// give the same bits.
__device__ inline float rms_dx(float inv, float w, float dy, float coef, float x) {
  return inv * w * dy - coef * x;
}
template <class G>
__global__ void __launch_bounds__(1024)
    rms_norm_backward_kernel(const G* dy, const float* x, const float* w, const float* inv_rms, float* dx,
                             __nv_bfloat16* dx_bf16, float* partials, int64_t rows, int64_t dim,
                             int64_t rows_per_block, bool accumulate, bool vec, bool in_shared) {
  extern __shared__ float4 shared4[];  // declared as float4 for 16-byte alignment
  float* const own_partials = partials + static_cast<int64_t>(blockIdx.x) * dim;
  const int64_t groups = dim / 4;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end_row = std::min(first_row + rows_per_block, rows);
  if (vec && groups <= static_cast<int64_t>(blockDim.x)) {
    // One four-element group of a row per thread (rows up to 4 * blockDim.x): the thread keeps its group of
    // x, dy and (accumulating) the old dx in registers, and loads the next row's before the block-wide sum
    // of this one, so that the loads' latency overlaps the reduction and the stores instead of following
    // them. Its dw partial sums stay in registers too. The arithmetic, and so every bit, is that of the
    // general path below.
    const int64_t k = threadIdx.x;
    const bool active = k < groups;
    float wv[4] = {}, xv[4] = {}, gv[4] = {}, ov[4] = {};
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
      load4(w, k, wv);
      if (first_row < end_row) {
        load4(x + first_row * dim, k, xv);
        load4(dy + first_row * dim, k, gv);
        if (accumulate) load4(dx + first_row * dim, k, ov);
      }
    }
    for (int64_t row = first_row; row < end_row; ++row) {
      const bool prefetch = active && row + 1 < end_row;
      float xn[4] = {}, gn[4] = {}, on[4] = {};
      if (prefetch) {
        load4(x + (row + 1) * dim, k, xn);
        load4(dy + (row + 1) * dim, k, gn);
        if (accumulate) load4(dx + (row + 1) * dim, k, on);
      }
      const float inv = inv_rms[row];
      float dot = 0;
      if (active) {
        a.x += gv[0] * xv[0] * inv;
        a.y += gv[1] * xv[1] * inv;
        a.z += gv[2] * xv[2] * inv;
        a.w += gv[3] * xv[3] * inv;
        for (int e = 0; e < 4; ++e) dot += wv[e] * gv[e] * xv[e];
      }
      const float coef = inv * inv * inv * block_sum(dot) / static_cast<float>(dim);
      if (active) {
        float out[4];
        for (int e = 0; e < 4; ++e) {
          const float v = rms_dx(inv, wv[e], gv[e], coef, xv[e]);
          out[e] = accumulate ? __fadd_rn(ov[e], v) : v;
        }
        store4(dx + row * dim, k, out);
        if (dx_bf16 != nullptr) store4(dx_bf16 + row * dim, k, out);
      }
      for (int e = 0; e < 4; ++e) xv[e] = xn[e], gv[e] = gn[e], ov[e] = on[e];
    }
    if (active) reinterpret_cast<float4*>(own_partials)[k] = a;
    return;
  }
  float* const acc = in_shared ? reinterpret_cast<float*>(shared4) : own_partials;
  float4* const acc4 = reinterpret_cast<float4*>(acc);  // aligned: vec implies dim % 4 == 0
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) acc[j] = 0;
  __syncthreads();
  for (int64_t row = first_row; row < end_row; ++row) {
    const float* xr = x + row * dim;
    const G* dyr = dy + row * dim;
    float* dxr = dx + row * dim;
    __nv_bfloat16* dxr_bf16 = dx_bf16 != nullptr ? dx_bf16 + row * dim : nullptr;
    const float inv = inv_rms[row];
    float dot = 0;
    if (vec) {
      for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
        float xv[4], gv[4], wv[4];
        load4(xr, k, xv);
        load4(dyr, k, gv);
        load4(w, k, wv);
        float4 a = acc4[k];  // 16-byte accesses: no bank conflicts
        a.x += gv[0] * xv[0] * inv;
        a.y += gv[1] * xv[1] * inv;
        a.z += gv[2] * xv[2] * inv;
        a.w += gv[3] * xv[3] * inv;
        acc4[k] = a;
        for (int e = 0; e < 4; ++e) dot += wv[e] * gv[e] * xv[e];
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        const float g = to_float(dyr[j]);
        dot += w[j] * g * xr[j];
        acc[j] += g * xr[j] * inv;
      }
    }
    const float coef = inv * inv * inv * block_sum(dot) / static_cast<float>(dim);
    if (vec) {
      for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
        float xv[4], gv[4], wv[4], out[4];
        load4(xr, k, xv);
        load4(dyr, k, gv);
        load4(w, k, wv);
        if (accumulate) load4(dxr, k, out);
        for (int e = 0; e < 4; ++e) {
          const float v = rms_dx(inv, wv[e], gv[e], coef, xv[e]);
          out[e] = accumulate ? __fadd_rn(out[e], v) : v;
        }
        store4(dxr, k, out);
        if (dxr_bf16 != nullptr) store4(dxr_bf16, k, out);
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        const float v = rms_dx(inv, w[j], to_float(dyr[j]), coef, xr[j]);
        const float out = accumulate ? __fadd_rn(dxr[j], v) : v;
        dxr[j] = out;
        if (dxr_bf16 != nullptr) dxr_bf16[j] = __float2bfloat16_rn(out);
      }
    }
  }
  if (!in_shared) return;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) own_partials[j] = acc[j];
}

// Blocks of the backward pass (each a run of rows), hence rows of partial dw sums: the run length depends
// only on the row count, so the summation order, and with it dw, is reproducible.
constexpr int64_t kDwMaxPartials = 256;

// out[col] = sum over r of m[r * dim + col], in a fixed order: a block takes a tile of 32 columns (a warp
// reads 32 consecutive floats of a row); its 32 lanes of rows each sum every 32nd row, then lane 0 adds the
// 32 lane sums in order. O: f32, or bf16 (the f32 sum rounded once).
constexpr int kSumTileColumns = 32;
constexpr int kSumRowLanes = 32;
template <class O>
__global__ void column_sum_kernel(const float* m, O* out, int64_t rows, int64_t dim) {
  __shared__ float lane_sums[kSumRowLanes][kSumTileColumns];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumTileColumns + threadIdx.x;
  float total = 0;
  if (col < dim) {
    for (int64_t r = threadIdx.y; r < rows; r += kSumRowLanes) total += m[r * dim + col];
  }
  lane_sums[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && col < dim) {
    float sum = 0;
    for (int lane = 0; lane < kSumRowLanes; ++lane) sum += lane_sums[lane][threadIdx.x];
    out[col] = from_float<O>(sum);
  }
}

// Inverse frequencies are computed on the host in double with the same expression as the CPU twin, then
// rounded to float, and travel in the kernel parameters; __grid_constant__ lets the kernel index them
// without a per-thread copy.
constexpr int kMaxRopePairs = 256;

struct RopeFrequencies {
  float inv_freq[kMaxRopePairs];
};

// W elements of one row, the k-th group of W: load_w/store_w's vectors, or (W = 2) one pair element by
// element, which any alignment allows.
template <int W, class T>
__device__ inline void load_group(const T* p, int64_t k, float (&v)[W]) {
  if constexpr (W == 2) {
    v[0] = to_float(p[2 * k]);
    v[1] = to_float(p[2 * k + 1]);
  } else {
    load_w<W>(p, k, v);
  }
}
template <int W, class T>
__device__ inline void store_group(T* p, int64_t k, const float (&v)[W]) {
  if constexpr (W == 2) {
    p[2 * k] = from_float<T>(v[0]);
    p[2 * k + 1] = from_float<T>(v[1]);
  } else {
    store_w<W>(p, k, v);
  }
}

// One block per row (looping over rows beyond the grid). A row's position is the same for all its heads, so
// the block first computes cos and sin of the row's angles once per frequency into shared memory (a head
// has at most kMaxRopePairs of them); then each thread rotates W consecutive elements (W/2 pairs of one
// head) with one vector access: W = 8 (16 bytes) for bf16 in and out, W = 4 (16 bytes of f32 or 8 of bf16),
// or W = 2 (one pair, element by element) when the heads or the buffers are not aligned for more (checked on
// the host).
// The angle is float(t) * inv_freq and the rotation is rounded step by step (no fused multiply-add), so y
// matches the CPU up to the last-ulp differences of cosf/sinf. x and y are f32 or bf16 (read as f32; y
// rounded once).
template <int W, class In, class Out>
__global__ void rope_kernel(const In* x, Out* y, int64_t rows, int64_t seq, int groups_per_row, int64_t ld_x,
                            int64_t ld_y, int pairs_per_head, bool inverse, const int32_t* starts,
                            const __grid_constant__ RopeFrequencies freqs) {
  // Indexing the parameter bank with a different index per lane would serialise every warp's reads.
  __shared__ float inv_freq[kMaxRopePairs];
  __shared__ float2 rotation[kMaxRopePairs];  // (cos, sin) of this row's angles, sin negated for the inverse
  for (int i = static_cast<int>(threadIdx.x); i < pairs_per_head; i += static_cast<int>(blockDim.x))
    inv_freq[i] = freqs.inv_freq[i];
  constexpr int kPairs = W / 2;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    __syncthreads();  // inv_freq written; the previous row's rotations read
    const float t = static_cast<float>(row % seq + (starts != nullptr ? starts[row / seq] : 0));
    for (int i = static_cast<int>(threadIdx.x); i < pairs_per_head; i += static_cast<int>(blockDim.x)) {
      const float angle = t * inv_freq[i];
      const float sn = sinf(angle);
      rotation[i] = make_float2(cosf(angle), inverse ? -sn : sn);
    }
    __syncthreads();
    const In* xr = x + row * ld_x;
    Out* yr = y + row * ld_y;
    for (int g = static_cast<int>(threadIdx.x); g < groups_per_row; g += static_cast<int>(blockDim.x)) {
      float v[W], out[W];
      load_group<W>(xr, g, v);
      const int first = (g * kPairs) % pairs_per_head;  // a group's pairs lie in one head
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const float2 cs = rotation[first + j];
        out[2 * j] = __fsub_rn(__fmul_rn(v[2 * j], cs.x), __fmul_rn(v[2 * j + 1], cs.y));
        out[2 * j + 1] = __fadd_rn(__fmul_rn(v[2 * j], cs.y), __fmul_rn(v[2 * j + 1], cs.x));
      }
      store_group<W>(yr, g, out);
    }
  }
}

// The decode step's RoPE and cache write in one pass (cuda::rope_into_cache): block per new token (entry e's
// token j, at position starts[e] + j of cache row rows[e]), its rotations computed once into shared memory
// with rope_kernel's own steps; each thread then takes pairs of the row: q rotated into q_out, k rotated
// into the keys and v copied into the values at the token's cache position. Pair by pair (the rows are
// short); the values equal rope_kernel's and the append's.
template <class T>
__global__ void rope_into_cache_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                       const T* __restrict__ v, T* __restrict__ q_out, T* __restrict__ keys,
                                       T* __restrict__ values, const int32_t* __restrict__ table, int64_t n,
                                       int64_t count, int64_t dim, int64_t capacity, int pairs_per_head,
                                       const __grid_constant__ RopeFrequencies freqs) {
  __shared__ float inv_freq[kMaxRopePairs];
  __shared__ float2 rotation[kMaxRopePairs];  // (cos, sin) of this token's angles
  for (int i = static_cast<int>(threadIdx.x); i < pairs_per_head; i += static_cast<int>(blockDim.x))
    inv_freq[i] = freqs.inv_freq[i];
  for (int64_t token = blockIdx.x; token < n * count; token += gridDim.x) {
    const int64_t entry = token / count, j = token % count;
    const int64_t position = table[n + entry] + j;
    __syncthreads();  // inv_freq written; the previous token's rotations read
    const float t = static_cast<float>(position);
    for (int i = static_cast<int>(threadIdx.x); i < pairs_per_head; i += static_cast<int>(blockDim.x)) {
      const float angle = t * inv_freq[i];
      rotation[i] = make_float2(cosf(angle), sinf(angle));
    }
    __syncthreads();
    const int64_t row = token * dim, slot = (static_cast<int64_t>(table[entry]) * capacity + position) * dim;
    for (int64_t p = threadIdx.x; p < dim / 2; p += blockDim.x) {
      const float2 cs = rotation[p % pairs_per_head];
      const int64_t e = 2 * p;
      const float q0 = to_float(q[row + e]), q1 = to_float(q[row + e + 1]);
      const float k0 = to_float(k[row + e]), k1 = to_float(k[row + e + 1]);
      q_out[row + e] = from_float<T>(__fsub_rn(__fmul_rn(q0, cs.x), __fmul_rn(q1, cs.y)));
      q_out[row + e + 1] = from_float<T>(__fadd_rn(__fmul_rn(q0, cs.y), __fmul_rn(q1, cs.x)));
      keys[slot + e] = from_float<T>(__fsub_rn(__fmul_rn(k0, cs.x), __fmul_rn(k1, cs.y)));
      keys[slot + e + 1] = from_float<T>(__fadd_rn(__fmul_rn(k0, cs.y), __fmul_rn(k1, cs.x)));
      values[slot + e] = v[row + e];
      values[slot + e + 1] = v[row + e + 1];
    }
  }
}

}  // namespace

void embedding_forward(const float* weight, const int32_t* ids, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  embedding_forward_kernel<<<row_blocks(n), kRowThreads, 0, stream>>>(weight, ids, out, n, dim);
  TT_CUDA_LAUNCH_CHECK();
}

namespace {

template <int kVec>
void launch_embedding_backward(const float* grad_out, const int32_t* sorted_ids,
                               const int32_t* sorted_positions, float* grad_weight, float* partials,
                               EmbJoin* joins, int32_t* join_count, int64_t n, int64_t dim,
                               cudaStream_t stream) {
  const int64_t lanes = (dim + kVec - 1) / kVec;
  const int threads = static_cast<int>(std::min<int64_t>((lanes + 31) / 32 * 32, kEmbChunkThreads));
  const int64_t tiles = (lanes + threads - 1) / threads;
  const int64_t chunks = (n + kEmbChunkRows - 1) / kEmbChunkRows;
  TT_CHECK(chunks * tiles <= std::numeric_limits<int32_t>::max(),
           "cuda::embedding_backward: " + std::to_string(n) + " ids of dim " + std::to_string(dim) +
               " are too many for one launch");
  embedding_backward_chunk_kernel<kVec><<<static_cast<unsigned int>(chunks * tiles), threads, 0, stream>>>(
      grad_out, sorted_ids, sorted_positions, grad_weight, partials, joins, join_count, n, dim, tiles);
  TT_CUDA_LAUNCH_CHECK();
  // Only a run spanning two chunk boundaries is joined, which takes three chunks.
  if (chunks < 3) return;
  // The number of runs to join stays on the device; slots beyond it find nothing to do and exit.
  const int64_t join_tiles = (lanes + 31) / 32;
  const int64_t slots = std::clamp(kEmbJoinBlocks / join_tiles, int64_t{1}, chunks);
  TT_CHECK(slots * join_tiles <= std::numeric_limits<int32_t>::max(),
           "cuda::embedding_backward: dim " + std::to_string(dim) + " is too large");
  embedding_backward_join_kernel<kVec>
      <<<static_cast<unsigned int>(slots * join_tiles), dim3(32, kEmbJoinWarps), 0, stream>>>(
          grad_out, sorted_positions, grad_weight, partials, joins, join_count, dim, join_tiles);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void embedding_backward(const float* grad_out, const int32_t* ids, float* grad_weight, int64_t n, int64_t dim,
                        cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  TT_CHECK(n <= std::numeric_limits<int32_t>::max(),
           "cuda::embedding_backward: " + std::to_string(n) + " ids do not fit 32-bit positions");
  const int items = static_cast<int>(n);
  const int64_t chunks = (n + kEmbChunkRows - 1) / kEmbChunkRows;

  size_t sort_bytes = 0;
  TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, static_cast<int32_t*>(nullptr),
                                                static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), items, 0, 32, stream));
  // One stream-ordered allocation for all scratch. The partials (one row per chunk, 1/32 of grad_out's
  // size) are only touched for runs that span two chunk boundaries.
  const auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t index_bytes = aligned(static_cast<size_t>(n) * sizeof(int32_t));
  const size_t partial_bytes = chunks > 2 ? aligned(static_cast<size_t>(chunks * dim) * sizeof(float)) : 0;
  const size_t join_bytes = aligned(static_cast<size_t>(chunks) * sizeof(EmbJoin));
  const size_t count_bytes = aligned(sizeof(int32_t));
  char* scratch = nullptr;
  TT_CUDA_CHECK(cudaMallocAsync(
      reinterpret_cast<void**>(&scratch),
      3 * index_bytes + partial_bytes + join_bytes + count_bytes + aligned(sort_bytes), stream));
  char* next = scratch;
  const auto take = [&next](size_t bytes) {
    char* p = next;
    next += bytes;
    return p;
  };
  int32_t* positions = reinterpret_cast<int32_t*>(take(index_bytes));
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(take(index_bytes));
  int32_t* sorted_positions = reinterpret_cast<int32_t*>(take(index_bytes));
  float* partials = partial_bytes ? reinterpret_cast<float*>(take(partial_bytes)) : nullptr;
  EmbJoin* joins = reinterpret_cast<EmbJoin*>(take(join_bytes));
  int32_t* join_count = reinterpret_cast<int32_t*>(take(count_bytes));
  void* sort_temp = take(aligned(sort_bytes));

  TT_CUDA_CHECK(cudaMemsetAsync(join_count, 0, sizeof(int32_t), stream));
  embedding_positions_kernel<<<blocks_for(n), kThreads, 0, stream>>>(positions, n);
  TT_CUDA_LAUNCH_CHECK();
  TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, ids, sorted_ids, positions,
                                                sorted_positions, items, 0, 32, stream));
  if (dim % 4 == 0 && aligned_to(grad_out, 16) && aligned_to(grad_weight, 16)) {
    launch_embedding_backward<4>(grad_out, sorted_ids, sorted_positions, grad_weight, partials, joins,
                                 join_count, n, dim, stream);
  } else {
    launch_embedding_backward<1>(grad_out, sorted_ids, sorted_positions, grad_weight, partials, joins,
                                 join_count, n, dim, stream);
  }
  TT_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

namespace {
// The four-at-a-time paths of the RMSNorm kernels: rows a multiple of four elements, buffers aligned to four.
bool rms_vec(int64_t dim, std::initializer_list<std::pair<const void*, size_t>> buffers) {
  if (dim % 4 != 0) return false;
  for (const auto& [p, element_bytes] : buffers)
    if (!aligned_to(p, 4 * element_bytes)) return false;
  return true;
}
}  // namespace

void rms_norm_forward(const float* x, const float* w, void* y, DType y_type, float* inv_rms, int64_t rows,
                      int64_t dim, double eps, cudaStream_t stream, float* x_copy) {
  if (rows == 0) return;
  const float e = static_cast<float>(eps);
  const bool vec = rms_vec(dim, {{x, 4}, {w, 4}, {y, dtype_size(y_type)}, {x_copy, 4}});
  if (y_type == DType::bf16) {
    rms_norm_forward_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(
        x, w, static_cast<__nv_bfloat16*>(y), inv_rms, x_copy, rows, dim, e, vec);
  } else {
    TT_ASSERT(y_type == DType::f32, "cuda::rms_norm_forward: the output is f32 or bf16");
    rms_norm_forward_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(x, w, static_cast<float*>(y),
                                                                          inv_rms, x_copy, rows, dim, e, vec);
  }
  TT_CUDA_LAUNCH_CHECK();
}

void rms_norm_backward(const void* dy, DType dy_type, const float* x, const float* w, const float* inv_rms,
                       float* dx, void* dw, int64_t rows, int64_t dim, cudaStream_t stream,
                       bool accumulate_dx, DType dw_type, void* dx_bf16) {
  TT_ASSERT(dw_type == DType::f32 || dw_type == DType::bf16, "cuda::rms_norm_backward: dw is f32 or bf16");
  TT_ASSERT(dy_type == DType::f32 || dy_type == DType::bf16, "cuda::rms_norm_backward: dy is f32 or bf16");
  if (dim == 0) return;
  if (rows == 0) {
    TT_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(dim) * dtype_size(dw_type), stream));
    return;
  }
  const bool vec = rms_vec(dim, {{dy, dtype_size(dy_type)}, {x, 4}, {w, 4}, {dx, 4}, {dx_bf16, 2}});
  // A thread per four-element group (or element) of a row, in whole warps, 128 to 1024: with only 256
  // blocks, fewer threads would leave HBM bandwidth unused.
  const int64_t units = vec ? dim / 4 : dim;
  const int threads = static_cast<int>(std::clamp<int64_t>((units + 31) / 32 * 32, 128, 1024));
  // The block's partial sums in shared memory when a row's floats fit (dynamic_shared_fits), else in
  // global memory; the kernel's one-group-per-thread path (vec rows of up to 4096) keeps them in registers
  // and needs neither.
  const bool one_group = vec && units <= threads;
  size_t shared = one_group ? 0 : static_cast<size_t>(dim) * sizeof(float);
  const bool in_shared = !one_group && dynamic_shared_fits(shared);
  if (!in_shared) shared = 0;
  const int64_t rows_per_block = (rows + kDwMaxPartials - 1) / kDwMaxPartials;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  // Stream-ordered scratch for the blocks' partial sums (at most 256 rows of dw), freed after the sum.
  float* partials = nullptr;
  TT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials),
                                static_cast<size_t>(blocks * dim) * sizeof(float), stream));
  const auto launch = [&](const auto* g) {
    const auto kernel = rms_norm_backward_kernel<std::remove_cv_t<std::remove_pointer_t<decltype(g)>>>;
    if (shared > 48 * 1024) {
      TT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared)));
    }
    kernel<<<static_cast<unsigned int>(blocks), threads, shared, stream>>>(
        g, x, w, inv_rms, dx, static_cast<__nv_bfloat16*>(dx_bf16), partials, rows, dim, rows_per_block,
        accumulate_dx, vec, in_shared);
  };
  if (dy_type == DType::bf16) {
    launch(static_cast<const __nv_bfloat16*>(dy));
  } else {
    launch(static_cast<const float*>(dy));
  }
  TT_CUDA_LAUNCH_CHECK();
  const dim3 grid(static_cast<unsigned int>((dim + kSumTileColumns - 1) / kSumTileColumns));
  const dim3 block(kSumTileColumns, kSumRowLanes);
  if (dw_type == DType::bf16) {
    column_sum_kernel<<<grid, block, 0, stream>>>(partials, static_cast<__nv_bfloat16*>(dw), blocks, dim);
  } else {
    column_sum_kernel<<<grid, block, 0, stream>>>(partials, static_cast<float*>(dw), blocks, dim);
  }
  TT_CUDA_LAUNCH_CHECK();
  TT_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

void rope(const void* x, DType x_type, void* y, DType y_type, int64_t batch, int64_t seq, int64_t dim,
          int64_t d_head, double theta, bool inverse, cudaStream_t stream, int64_t ld_x, int64_t ld_y,
          const int32_t* starts) {
  if (ld_x == 0) ld_x = dim;
  if (ld_y == 0) ld_y = dim;
  TT_ASSERT(ld_x >= dim && ld_y >= dim, "cuda::rope: row strides below the row length");
  TT_ASSERT(
      (x_type == DType::f32 || x_type == DType::bf16) && (y_type == DType::f32 || y_type == DType::bf16),
      "cuda::rope: f32 or bf16 input and output");
  TT_ASSERT(d_head > 0 && d_head % 2 == 0, "cuda::rope: d_head must be even, got " + std::to_string(d_head));
  // A model's d_head comes from the user's configuration; the kernel holds its frequencies in a fixed table.
  TT_CHECK(d_head <= 2 * kMaxRopePairs, "rope on CUDA takes d_head up to " +
                                            std::to_string(2 * kMaxRopePairs) + ", got " +
                                            std::to_string(d_head));
  TT_ASSERT(dim % d_head == 0, "cuda::rope: dim " + std::to_string(dim) + " is not a multiple of d_head " +
                                   std::to_string(d_head));
  const int64_t rows = batch * seq;
  if (rows == 0 || dim == 0) return;
  const int64_t half = d_head / 2;
  RopeFrequencies freqs{};
  for (int64_t i = 0; i < half; ++i)
    freqs.inv_freq[i] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / d_head));
  TT_CHECK(dim / 2 <= std::numeric_limits<int>::max(),
           "cuda::rope: rows of " + std::to_string(dim) + " elements are too long");
  // The widest group that keeps every group inside one head and every access aligned: heads and row
  // strides are multiples of W elements and both buffers start on a multiple of W elements.
  const bool in_bf16 = x_type == DType::bf16, out_bf16 = y_type == DType::bf16;
  auto fits = [&](int64_t w) {
    return d_head % w == 0 && ld_x % w == 0 && ld_y % w == 0 &&
           reinterpret_cast<uintptr_t>(x) % (w * (in_bf16 ? 2 : 4)) == 0 &&
           reinterpret_cast<uintptr_t>(y) % (w * (out_bf16 ? 2 : 4)) == 0;
  };
  const int width = in_bf16 && out_bf16 && fits(8) ? 8 : fits(4) ? 4 : 2;
  const int64_t groups = dim / width;
  // Threads for the row's groups in whole warps: one group each up to 1024 threads, then an even share.
  const int64_t passes = (groups + 1023) / 1024;
  const int threads =
      static_cast<int>(std::max<int64_t>(64, ((groups + passes - 1) / passes + 31) / 32 * 32));
  auto launch = [&](auto vec, auto* in, auto* out) {
    rope_kernel<decltype(vec)::value>
        <<<row_blocks(rows), threads, 0, stream>>>(in, out, rows, seq, static_cast<int>(groups), ld_x, ld_y,
                                                   static_cast<int>(half), inverse, starts, freqs);
  };
  auto dispatch = [&](auto* in, auto* out) {
    if (width == 8) {
      if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(in)>>, __nv_bfloat16> &&
                    std::is_same_v<std::remove_pointer_t<decltype(out)>, __nv_bfloat16>) {
        launch(std::integral_constant<int, 8>{}, in, out);
      }
    } else if (width == 4) {
      launch(std::integral_constant<int, 4>{}, in, out);
    } else {
      launch(std::integral_constant<int, 2>{}, in, out);
    }
  };
  using bf = __nv_bfloat16;
  if (!in_bf16 && !out_bf16) dispatch(static_cast<const float*>(x), static_cast<float*>(y));
  if (!in_bf16 && out_bf16) dispatch(static_cast<const float*>(x), static_cast<bf*>(y));
  if (in_bf16 && !out_bf16) dispatch(static_cast<const bf*>(x), static_cast<float*>(y));
  if (in_bf16 && out_bf16) dispatch(static_cast<const bf*>(x), static_cast<bf*>(y));
  TT_CUDA_LAUNCH_CHECK();
}

void rope_into_cache(const void* q, const void* k, const void* v, void* q_out, void* keys, void* values,
                     DType type, const int32_t* table, int64_t n, int64_t count, int64_t dim, int64_t d_head,
                     double theta, int64_t capacity, cudaStream_t stream) {
  TT_ASSERT(type == DType::f32 || type == DType::bf16, "cuda::rope_into_cache: f32 or bf16");
  TT_ASSERT(d_head > 0 && d_head % 2 == 0 && dim % d_head == 0, "cuda::rope_into_cache: bad d_head");
  TT_CHECK(d_head <= 2 * kMaxRopePairs, "rope on CUDA takes d_head up to " +
                                            std::to_string(2 * kMaxRopePairs) + ", got " +
                                            std::to_string(d_head));
  const int64_t tokens = n * count;
  if (tokens == 0 || dim == 0) return;
  const int64_t half = d_head / 2;
  RopeFrequencies freqs{};  // as cuda::rope computes them
  for (int64_t i = 0; i < half; ++i)
    freqs.inv_freq[i] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / d_head));
  const int threads =
      static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (dim / 2 + 31) / 32 * 32)));
  auto launch = [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    rope_into_cache_kernel<T><<<row_blocks(tokens), threads, 0, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(q_out),
        static_cast<T*>(keys), static_cast<T*>(values), table, n, count, dim, capacity,
        static_cast<int>(half), freqs);
  };
  if (type == DType::f32) {
    launch(static_cast<float*>(nullptr));
  } else {
    launch(static_cast<__nv_bfloat16*>(nullptr));
  }
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace tt::cuda
