// FlashAttention-2 forward on the GPU: the bf16 tensor-core kernel and the entry point that picks it or
// the simple kernel (flash_attention_simple.cuh).
//
// Tensor-core forward, one thread block per (tile of 128 queries, batch*head):
//  - Work split: each warp owns a fixed band of query rows for the whole kernel (32 rows in 4 warps for
//    d_head <= 64, 16 rows in 8 warps above, where the O accumulator needs the registers), so the softmax
//    statistics of a row never leave the 4 lanes that hold it (no shared-memory reductions at all).
//  - The Q tile is loaded once (cp.async -> shared -> ldmatrix) and stays in registers as mma A operands.
//  - Key tiles of 64 stream through a double-buffered shared-memory ring: while tile t is multiplied,
//    tile t+1 of K and V is already in flight with cp.async.
//  - Per key tile: S = Q K^T (f32 accumulators, rows x 64 per warp), mask, online softmax in the log2
//    domain (exp2(s * scale * log2 e - m), one FFMA + EX2 per score), then O += P V with P re-packed to
//    bf16 in registers. O is rescaled by exp2(m_old - m_new) whenever a row's max grows.
//  - Causal: key tiles that start after the tile's last query are never visited, and the mask is only
//    evaluated on tiles that cross the diagonal (or hang past the end of the sequence). Which block takes
//    which tile: `block_tile` (flash_attention_common.cuh), longest tiles first within each chunk of heads.
//  - Epilogue: O /= l, staged through shared memory for 16-byte coalesced stores; L = (m + log2 l) ln 2.
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/flash_attention_simple.cuh"

namespace tt::cuda::flash {
namespace {

using bf16 = __nv_bfloat16;

template <int D>
struct ForwardTile {
  // Each warp owns kRowTiles x 16 query rows: every K / V fragment read from shared memory then feeds
  // kRowTiles tensor-core products, which halves the shared-memory traffic per product for small head
  // dims. Large head dims need the registers for the O accumulator and keep one row tile per warp.
  static constexpr int kRowTiles = D <= 64 ? 2 : 1;
  static constexpr int kWarps = D <= 64 ? 4 : 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockQ = 16 * kRowTiles * kWarps;
  static constexpr int kBlockK = 64;
  static constexpr int kStride = D + 8;  // padded shared-memory row, in elements
  // Q tile + two stages of K and V.
  static constexpr size_t kSmemBytes = sizeof(bf16) * (kBlockQ + 4 * kBlockK) * kStride;
  static constexpr int kMinBlocks = D <= 64 ? 2 : 1;
};

template <int D>
__global__ void __launch_bounds__(ForwardTile<D>::kThreads, ForwardTile<D>::kMinBlocks)
    flash_forward_bf16_kernel(const Params p) {
  using Tile = ForwardTile<D>;
  constexpr int kBlockQ = Tile::kBlockQ, kBlockK = Tile::kBlockK, kStride = Tile::kStride;
  constexpr int kThreads = Tile::kThreads, kRowTiles = Tile::kRowTiles;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* s_q = reinterpret_cast<bf16*>(smem_bytes);
  bf16* s_k = s_q + kBlockQ * kStride;
  bf16* s_v = s_k + 2 * kBlockK * kStride;

  int64_t bh;
  int rank;
  block_tile(4 * p.seq * D, bh, rank);  // every query tile of a pair reads its K and V
  const int q_tile = p.causal ? gridDim.y - 1 - rank : rank;
  const int q0 = q_tile * kBlockQ;
  const int seq = static_cast<int>(p.seq);
  const bf16* q = static_cast<const bf16*>(p.q) + head_offset(p.sq, bh, p.heads) + q0 * p.sq.seq;
  const bf16* k = static_cast<const bf16*>(p.k) + head_offset(p.sk, bh, p.heads);
  const bf16* v = static_cast<const bf16*>(p.v) + head_offset(p.sv, bh, p.heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp * 16 * kRowTiles;  // first row of this warp within the tile
  const int key_end = p.causal ? min(seq, q0 + kBlockQ) : seq;
  const int num_k_tiles = ceil_div(key_end, kBlockK);

  load_tile_async<kBlockQ, D, kThreads>(s_q, q, p.sq.seq, seq - q0);
  load_tile_async<kBlockK, D, kThreads>(s_k, k, p.sk.seq, seq);
  load_tile_async<kBlockK, D, kThreads>(s_v, v, p.sv.seq, seq);
  cp_async_commit();

  // In row tile m this thread's accumulator rows are q0 + warp_row0 + 16m + lane/4 (+ 8); its columns
  // within each 8-wide tile are col_pair and col_pair + 1. Statistics index [m][half].
  const int col_pair = (lane % 4) * 2;
  uint32_t q_frag[kRowTiles][D / 16][4];
  float o_acc[kRowTiles][D / 8][4];
  float row_max[kRowTiles][2], row_sum[kRowTiles][2];
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o_acc[m][n][0] = o_acc[m][n][1] = o_acc[m][n][2] = o_acc[m][n][3] = 0;
    // Max in units of log2 (already times scale * log2 e); sums are this thread's partial sums.
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0;
  }

  for (int t = 0; t < num_k_tiles; ++t) {
    cp_async_wait_all();
    __syncthreads();  // tile t is visible to all warps, and every warp is done with tile t - 1
    if (t == 0) {
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          ldmatrix_x4(q_frag[m][kk],
                      s_q + (warp_row0 + m * 16 + lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
        }
      }
    }
    if (t + 1 < num_k_tiles) {  // prefetch the next key tile into the other stage
      const int next = (t + 1) * kBlockK, stage = (t + 1) & 1;
      load_tile_async<kBlockK, D, kThreads>(s_k + stage * kBlockK * kStride, k + next * p.sk.seq, p.sk.seq,
                                            seq - next);
      load_tile_async<kBlockK, D, kThreads>(s_v + stage * kBlockK * kStride, v + next * p.sv.seq, p.sv.seq,
                                            seq - next);
    }
    cp_async_commit();
    const bf16* s_k_tile = s_k + (t & 1) * kBlockK * kStride;
    const bf16* s_v_tile = s_v + (t & 1) * kBlockK * kStride;

    // S = Q K^T. K is stored [key][d], which is already the "column-major" B operand: plain ldmatrix.
    // One x4 load covers two 8-key column tiles (matrices: keys 0-7 / 8-15 x d 0-7 / 8-15).
    float s[kRowTiles][kBlockK / 8][4];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
      for (int n = 0; n < kBlockK / 8; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nb = 0; nb < kBlockK / 16; ++nb) {
        uint32_t kf[4];
        ldmatrix_x4(
            kf, s_k_tile + (nb * 16 + (lane / 16) * 8 + lane % 8) * kStride + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) {
          mma_bf16(s[m][2 * nb], q_frag[m][kk], kf[0], kf[1]);
          mma_bf16(s[m][2 * nb + 1], q_frag[m][kk], kf[2], kf[3]);
        }
      }
    }

    // Mask only where needed: past the sequence end, or (causal) where this warp's rows cross the diagonal.
    const int k0 = t * kBlockK;
    if (k0 + kBlockK > seq || (p.causal && k0 + kBlockK - 1 > q0 + warp_row0)) {
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
        for (int n = 0; n < kBlockK / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + n * 8 + col_pair + (e & 1);
            const int query = q0 + warp_row0 + m * 16 + lane / 4 + (e / 2) * 8;
            if (key >= seq || (p.causal && key > query)) s[m][n][e] = -INFINITY;
          }
        }
      }
    }

#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
      // Online softmax. Row max over this thread's columns, then over the 4 lanes sharing the row.
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kBlockK / 8; ++n) {
        tile_max[0] = fmaxf(tile_max[0], fmaxf(s[m][n][0], s[m][n][1]));
        tile_max[1] = fmaxf(tile_max[1], fmaxf(s[m][n][2], s[m][n][3]));
      }
      float base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_max = fmaxf(row_max[m][r], tile_max[r] * p.scale_log2);
        // A row with nothing visible yet keeps max -inf; exp2 against 0 then still gives exact zeros.
        base[r] = new_max == -INFINITY ? 0.0f : new_max;
        const float correction = fast_exp2(row_max[m][r] - base[r]);
        row_max[m][r] = new_max;
        row_sum[m][r] *= correction;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o_acc[m][n][2 * r] *= correction;
          o_acc[m][n][2 * r + 1] *= correction;
        }
      }
#pragma unroll
      for (int n = 0; n < kBlockK / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[m][n][e] = fast_exp2(s[m][n][e] * p.scale_log2 - base[e / 2]);
          row_sum[m][e / 2] += s[m][n][e];
        }
      }
    }

    // O += P V. The accumulators of column tiles 2kk and 2kk+1 are the A fragment of keys 16kk..16kk+15.
    // V is stored [key][d]; ldmatrix.trans hands out the k-major B operand (matrices: keys 0-7 / 8-15 x
    // d 0-7 / 8-15, in that order).
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      uint32_t p_frag[kRowTiles][4];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        p_frag[m][0] = pack_bf16(s[m][2 * kk][0], s[m][2 * kk][1]);
        p_frag[m][1] = pack_bf16(s[m][2 * kk][2], s[m][2 * kk][3]);
        p_frag[m][2] = pack_bf16(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        p_frag[m][3] = pack_bf16(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, s_v_tile + (kk * 16 + lane % 16) * kStride + dn * 16 + (lane / 16) * 8);
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) {
          mma_bf16(o_acc[m][2 * dn], p_frag[m], vf[0], vf[1]);
          mma_bf16(o_acc[m][2 * dn + 1], p_frag[m], vf[2], vf[3]);
        }
      }
    }
  }

  // Epilogue. Each warp writes only its own rows of s_q, which only it has read, so no barrier is needed
  // before; one is needed before the cooperative store reads every row.
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 1);
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 2);
      inv_sum[r] = 1.0f / row_sum[m][r];
    }
    const int local_row = warp_row0 + m * 16 + lane / 4;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(s_q + local_row * kStride + n * 8 + col_pair) =
          pack_bf16(o_acc[m][n][0] * inv_sum[0], o_acc[m][n][1] * inv_sum[0]);
      *reinterpret_cast<uint32_t*>(s_q + (local_row + 8) * kStride + n * 8 + col_pair) =
          pack_bf16(o_acc[m][n][2] * inv_sum[1], o_acc[m][n][3] * inv_sum[1]);
    }
    if (lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int query = q0 + local_row + 8 * r;
        if (query < seq) p.lse[bh * seq + query] = (row_max[m][r] + log2f(row_sum[m][r])) * kLn2;
      }
    }
  }
  __syncthreads();
  bf16* o = static_cast<bf16*>(p.o) + head_offset(p.so, bh, p.heads) + q0 * p.so.seq;
  store_tile<kBlockQ, D, kThreads>(o, p.so.seq, s_q, seq - q0);
}

template <int D>
void launch_forward_bf16(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  using Tile = ForwardTile<D>;
  const auto kernel = flash_forward_bf16_kernel<D>;
  allow_shared_memory(kernel, Tile::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(batch_heads), ceil_div(params.seq, Tile::kBlockQ));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(params);
  TT_CUDA_LAUNCH_CHECK();
}

template <class T, int D>
void launch_forward_simple(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  const auto kernel = simple_forward_kernel<T, D>;
  constexpr size_t smem = simple_forward_smem_bytes<D>();
  allow_shared_memory(kernel, smem);
  const dim3 grid(ceil_div(params.seq, kSimpleRows), static_cast<unsigned>(batch_heads));
  kernel<<<grid, kSimpleThreads, smem, stream>>>(params);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace tt::cuda::flash

namespace tt::cuda {

void flash_attention_forward(const AttentionProblem& p, DType dtype, const void* q, const void* k,
                             const void* v, void* o, float* lse, void* stream) {
  using namespace flash;
  check_problem(p, dtype);
  Params params = make_params(p);
  params.q = q;
  params.k = k;
  params.v = v;
  params.o = o;
  params.lse = lse;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const int64_t batch_heads = p.batch * p.heads;
  // scale > 0: the tensor-core kernels take each row's maximum of the unscaled scores (masked with -inf)
  // and scale it afterwards, which keeps the maximum only for a positive scale.
  const bool fast = dtype == DType::bf16 && p.kernels != AttentionKernels::simple && p.scale > 0 &&
                    rows_aligned_16(q, p.q) && rows_aligned_16(k, p.k) && rows_aligned_16(v, p.v) &&
                    rows_aligned_16(o, p.o);
  if (fast && launch_forward_hopper(params, p.d_head, batch_heads, cuda_stream)) return;
  dispatch_head_dim(p.d_head, [&](auto head_dim) {
    constexpr int D = decltype(head_dim)::value;
    if (fast) {
      launch_forward_bf16<D>(params, batch_heads, cuda_stream);
    } else if (dtype == DType::bf16) {
      launch_forward_simple<__nv_bfloat16, D>(params, batch_heads, cuda_stream);
    } else {
      launch_forward_simple<float, D>(params, batch_heads, cuda_stream);
    }
  });
}

}  // namespace tt::cuda
