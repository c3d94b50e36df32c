// FlashAttention-2 backward on the GPU: preprocessing (D = rowsum(dO * O)), the bf16 tensor-core kernel,
// the dQ conversion, and the entry point that picks them or the simple kernels (flash_attention_simple.cuh).
// On an sm_90 GPU with d_head 64 the bf16 path runs the Hopper kernel (flash_attention_bwd_hopper.cu) in
// place of the mma.sync one below, with the same preprocessing and conversion; it adds dQ tiles with bulk
// reduce-adds instead of atomics.
//
// Tensor-core backward, one thread block per (tile of 128 keys, batch*head), 8 warps:
//  - Work split: warp w owns keys 16w .. 16w+15 of the tile. It accumulates dK and dV for those keys in
//    registers over the whole kernel and writes them once at the end.
//  - The block walks the query tiles (64 queries, 32 for d_head 128 to fit the registers) that can see
//    its keys; Q, dO, L and D of the next tile stream into a second shared-memory stage with cp.async
//    while the current one is processed.
//  - Per query tile each warp computes the transposed products S^T = K Q^T and dP^T = V dO^T (16 keys x
//    all queries of the tile), so that P^T = exp(S^T scale - L) and dS^T = P^T (dP^T - D) are already
//    the A operands of dV += P^T dO and dK += dS^T Q (register re-use, as in the forward's P V).
//  - dQ needs dS with queries as rows, i.e. every warp's keys at once: dS^T goes to shared memory (bf16)
//    and, after the next block-wide barrier, each warp multiplies one 16-query x (d_head / groups) slice
//    of dS K. dS^T is double-buffered, so the dQ product of query tile i runs at the start of step i + 1
//    and a single barrier per query tile suffices. Several key tiles add to the same dQ rows: the result
//    goes through f32 atomics into a scratch accumulator; a last small kernel scales it and converts it
//    to the output dtype and layout.
//  - The preprocessing kernel also stores L * log2(e), so P = exp2(S * scale * log2(e) - that): one FFMA
//    and one EX2 per score.
//  - Causal: query tiles that end before the first key are skipped (the loop starts at the tile holding
//    the first key); the mask is applied only where a warp's keys cross the diagonal or the tiles hang past
//    the end of the sequence. Which block takes which key tile: `block_tile` (flash_attention_common.cuh),
//    the first key tiles (which see the most query tiles) first. The 1/sqrt(d) scale of dK and dQ is
//    applied once, at the end.
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/flash_attention_simple.cuh"

namespace tt::cuda::flash {
namespace {

using bf16 = __nv_bfloat16;

template <int D>
struct BackwardTile {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockK = 16 * kWarps;
  static constexpr int kBlockQ = D <= 96 ? 64 : 32;
  static constexpr int kStride = D + 8;         // padded row of the K, V, Q, dO tiles
  static constexpr int kStrideS = kBlockQ + 8;  // padded row of the dS^T tiles
  // dQ = dS K split over the warps: kRowTiles tiles of 16 queries times kColGroups slices of d_head.
  static constexpr int kRowTiles = kBlockQ / 16;
  static constexpr int kColGroups = kWarps / kRowTiles;
  static constexpr int kColTiles = D / 8 / kColGroups;  // 8-wide column tiles per warp
  static_assert((D / 8) % kColGroups == 0, "d_head must split evenly over the dQ column groups");
  // K, V; two stages of Q and dO; two of dS^T; two stages of L and D.
  static constexpr size_t kSmemBytes =
      sizeof(bf16) * ((2 * kBlockK + 4 * kBlockQ) * kStride + 2 * kBlockK * kStrideS) +
      sizeof(float) * 4 * kBlockQ;
};

// Two adjacent f32 atomic adds; Hopper has a native 8-byte vector form.
__device__ inline void atomic_add_pair(float* address, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(address), make_float2(a, b));
#else
  atomicAdd(address, a);
  atomicAdd(address + 1, b);
#endif
}

template <int D>
__global__ void __launch_bounds__(BackwardTile<D>::kThreads, 1) flash_backward_bf16_kernel(const Params p) {
  using Tile = BackwardTile<D>;
  constexpr int kBlockQ = Tile::kBlockQ, kBlockK = Tile::kBlockK, kStride = Tile::kStride;
  constexpr int kStrideS = Tile::kStrideS, kThreads = Tile::kThreads;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* s_k = reinterpret_cast<bf16*>(smem_bytes);
  bf16* s_v = s_k + kBlockK * kStride;
  bf16* s_q = s_v + kBlockK * kStride;                                     // two stages
  bf16* s_do = s_q + 2 * kBlockQ * kStride;                                // two stages
  bf16* s_ds = s_do + 2 * kBlockQ * kStride;                               // two stages
  float* s_lse = reinterpret_cast<float*>(s_ds + 2 * kBlockK * kStrideS);  // two stages, L * log2(e)
  float* s_delta = s_lse + 2 * kBlockQ;                                    // two stages

  int64_t bh;
  int rank;
  block_tile(backward_bytes_per_pair(p.seq, D), bh, rank);
  const int k0 = rank * kBlockK;
  const int seq = static_cast<int>(p.seq);
  const bf16* q = static_cast<const bf16*>(p.q) + head_offset(p.sq, bh, p.heads);
  const bf16* k = static_cast<const bf16*>(p.k) + head_offset(p.sk, bh, p.heads) + k0 * p.sk.seq;
  const bf16* v = static_cast<const bf16*>(p.v) + head_offset(p.sv, bh, p.heads) + k0 * p.sv.seq;
  const bf16* d_o = static_cast<const bf16*>(p.d_o) + head_offset(p.so, bh, p.heads);
  const float* lse_log2 = p.lse_log2 + bh * seq;
  const float* delta = p.delta + bh * seq;
  float* dq_accum = p.dq_accum + bh * seq * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  auto load_query_tile = [&](int q_tile, int stage) {
    const int q0 = q_tile * kBlockQ;
    load_tile_async<kBlockQ, D, kThreads>(s_q + stage * kBlockQ * kStride, q + q0 * p.sq.seq, p.sq.seq,
                                          seq - q0);
    load_tile_async<kBlockQ, D, kThreads>(s_do + stage * kBlockQ * kStride, d_o + q0 * p.so.seq, p.so.seq,
                                          seq - q0);
    for (int i = threadIdx.x; i < kBlockQ; i += kThreads) {
      const bool valid = q0 + i < seq;
      cp_async_4(s_lse + stage * kBlockQ + i, lse_log2 + (valid ? q0 + i : 0), valid);
      cp_async_4(s_delta + stage * kBlockQ + i, delta + (valid ? q0 + i : 0), valid);
    }
  };

  const int q_begin = p.causal ? k0 / kBlockQ : 0;  // earlier queries see none of these keys
  const int num_q_tiles = ceil_div(seq, kBlockQ);
  load_tile_async<kBlockK, D, kThreads>(s_k, k, p.sk.seq, seq - k0);
  load_tile_async<kBlockK, D, kThreads>(s_v, v, p.sv.seq, seq - k0);
  load_query_tile(q_begin, 0);
  cp_async_commit();

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0;
  }
  // This thread's accumulator rows (keys) are key_row0 and key_row0 + 8; its columns (queries) within each
  // 8-wide tile are col_pair and col_pair + 1.
  const int key_row0 = k0 + warp * 16 + lane / 4;
  const int col_pair = (lane % 4) * 2;
  // The A operand (this warp's 16 rows of K or V) and B operand (Q or dO, [query][d]) addresses.
  const int a_offset = (warp * 16 + lane % 16) * kStride + (lane / 16) * 8;
  const int b_offset = ((lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8;
  const int bt_offset = (lane % 16) * kStride + (lane / 16) * 8;  // ldmatrix.trans B operand

  // dQ rows of one query tile += dS K, from that tile's dS^T in shared memory. Warp w takes 16 queries
  // (row tile w % kRowTiles) times one slice of d_head. A = dS comes from the [key][query] tile through
  // ldmatrix.trans, B = K ([key][d]) through ldmatrix.trans as well. Other key tiles add to the same rows.
  auto accumulate_dq = [&](int q_tile, const bf16* s_ds_tile) {
    const int q0 = q_tile * kBlockQ;
    const int row_tile = warp % Tile::kRowTiles, col_base = (warp / Tile::kRowTiles) * Tile::kColTiles * 8;
    float dq[Tile::kColTiles][4];
#pragma unroll
    for (int n = 0; n < Tile::kColTiles; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      uint32_t ds_a[4];
      ldmatrix_x4_trans(ds_a, s_ds_tile + (kk * 16 + (lane / 16) * 8 + lane % 8) * kStrideS + row_tile * 16 +
                                  ((lane / 8) % 2) * 8);
#pragma unroll
      for (int n2 = 0; n2 < Tile::kColTiles / 2; ++n2) {
        uint32_t kf[4];
        ldmatrix_x4_trans(kf, s_k + bt_offset + kk * 16 * kStride + col_base + n2 * 16);
        mma_bf16(dq[2 * n2], ds_a, kf[0], kf[1]);
        mma_bf16(dq[2 * n2 + 1], ds_a, kf[2], kf[3]);
      }
      if constexpr (Tile::kColTiles % 2 == 1) {
        uint32_t kf[2];
        ldmatrix_x2_trans(kf, s_k + (kk * 16 + lane % 16) * kStride + col_base + (Tile::kColTiles - 1) * 8);
        mma_bf16(dq[Tile::kColTiles - 1], ds_a, kf[0], kf[1]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int query = q0 + row_tile * 16 + lane / 4 + 8 * r;
      if (query < seq) {
#pragma unroll
        for (int n = 0; n < Tile::kColTiles; ++n) {
          atomic_add_pair(dq_accum + int64_t{query} * D + col_base + n * 8 + col_pair, dq[n][2 * r],
                          dq[n][2 * r + 1]);
        }
      }
    }
  };

  // One barrier per query tile: the dQ product of tile i needs every warp's dS^T, so it runs right after
  // the barrier of step i + 1 (dS^T is double-buffered) and overlaps with other warps' work on tile i + 1.
  for (int q_tile = q_begin; q_tile <= num_q_tiles; ++q_tile) {
    const int stage = (q_tile - q_begin) & 1;
    cp_async_wait_all();
    __syncthreads();  // tile q_tile and dS^T of q_tile - 1 are visible; the stage refilled next is idle
    if (q_tile + 1 < num_q_tiles) load_query_tile(q_tile + 1, stage ^ 1);
    cp_async_commit();
    if (q_tile > q_begin) accumulate_dq(q_tile - 1, s_ds + (stage ^ 1) * kBlockK * kStrideS);
    if (q_tile == num_q_tiles) break;
    const int q0 = q_tile * kBlockQ;
    const bf16* s_q_tile = s_q + stage * kBlockQ * kStride;
    const bf16* s_do_tile = s_do + stage * kBlockQ * kStride;
    const float* s_lse_tile = s_lse + stage * kBlockQ;
    const float* s_delta_tile = s_delta + stage * kBlockQ;
    bf16* s_ds_tile = s_ds + stage * kBlockK * kStrideS;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and all kBlockQ queries.
    float st[kBlockQ / 8][4], dpt[kBlockQ / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockQ / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t kf[4], vf[4];
      ldmatrix_x4(kf, s_k + a_offset + kk * 16);
      ldmatrix_x4(vf, s_v + a_offset + kk * 16);
#pragma unroll
      for (int nb = 0; nb < kBlockQ / 16; ++nb) {
        uint32_t qf[4], df[4];
        ldmatrix_x4(qf, s_q_tile + b_offset + nb * 16 * kStride + kk * 16);
        ldmatrix_x4(df, s_do_tile + b_offset + nb * 16 * kStride + kk * 16);
        mma_bf16(st[2 * nb], kf, qf[0], qf[1]);
        mma_bf16(st[2 * nb + 1], kf, qf[2], qf[3]);
        mma_bf16(dpt[2 * nb], vf, df[0], df[1]);
        mma_bf16(dpt[2 * nb + 1], vf, df[2], df[3]);
      }
    }

    // P^T = exp(S^T * scale - L) (L per column = query) and dS^T = P^T (dP^T - D), masked where needed.
    const bool need_mask = q0 + kBlockQ > seq || k0 + kBlockK > seq || (p.causal && k0 + warp * 16 + 15 > q0);
#pragma unroll
    for (int n = 0; n < kBlockQ / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + col_pair + (e & 1);
        float prob = fast_exp2(st[n][e] * p.scale_log2 - s_lse_tile[col]);
        if (need_mask) {
          const int query = q0 + col, key = key_row0 + (e / 2) * 8;
          if (query >= seq || key >= seq || (p.causal && key > query)) prob = 0;
        }
        st[n][e] = prob;
        dpt[n][e] = prob * (dpt[n][e] - s_delta_tile[col]);
      }
    }

    // dV += P^T dO and dK += dS^T Q: accumulators of column tiles 2kq, 2kq+1 are the A operand of
    // queries 16kq..16kq+15; dO and Q ([query][d]) come in through ldmatrix.trans as k-major B operands.
#pragma unroll
    for (int kq = 0; kq < kBlockQ / 16; ++kq) {
      const uint32_t p_frag[4] = {
          pack_bf16(st[2 * kq][0], st[2 * kq][1]), pack_bf16(st[2 * kq][2], st[2 * kq][3]),
          pack_bf16(st[2 * kq + 1][0], st[2 * kq + 1][1]), pack_bf16(st[2 * kq + 1][2], st[2 * kq + 1][3])};
      const uint32_t ds_frag[4] = {pack_bf16(dpt[2 * kq][0], dpt[2 * kq][1]),
                                   pack_bf16(dpt[2 * kq][2], dpt[2 * kq][3]),
                                   pack_bf16(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]),
                                   pack_bf16(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3])};
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t dof[4], qf[4];
        ldmatrix_x4_trans(dof, s_do_tile + bt_offset + kq * 16 * kStride + dn * 16);
        ldmatrix_x4_trans(qf, s_q_tile + bt_offset + kq * 16 * kStride + dn * 16);
        mma_bf16(dv_acc[2 * dn], p_frag, dof[0], dof[1]);
        mma_bf16(dv_acc[2 * dn + 1], p_frag, dof[2], dof[3]);
        mma_bf16(dk_acc[2 * dn], ds_frag, qf[0], qf[1]);
        mma_bf16(dk_acc[2 * dn + 1], ds_frag, qf[2], qf[3]);
      }
      // dS^T to shared memory, [key][query], for the dQ product of the next step.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kq + half, row = warp * 16 + lane / 4;
        *reinterpret_cast<uint32_t*>(s_ds_tile + row * kStrideS + n * 8 + col_pair) = ds_frag[2 * half];
        *reinterpret_cast<uint32_t*>(s_ds_tile + (row + 8) * kStrideS + n * 8 + col_pair) =
            ds_frag[2 * half + 1];
      }
    }
  }

  // Epilogue: dK (scaled) and dV through the now idle K and V tiles, then 16-byte coalesced stores.
  __syncthreads();  // every warp is done reading s_k / s_v
  const int local_row = warp * 16 + lane / 4;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int offset = (local_row + 8 * r) * kStride + n * 8 + col_pair;
      *reinterpret_cast<uint32_t*>(s_k + offset) =
          pack_bf16(dk_acc[n][2 * r] * p.scale, dk_acc[n][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(s_v + offset) = pack_bf16(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]);
    }
  }
  __syncthreads();
  bf16* dk = static_cast<bf16*>(p.dk) + head_offset(p.sk, bh, p.heads) + k0 * p.sk.seq;
  bf16* dv = static_cast<bf16*>(p.dv) + head_offset(p.sv, bh, p.heads) + k0 * p.sv.seq;
  store_tile<kBlockK, D, kThreads>(dk, p.sk.seq, s_k, seq - k0);
  store_tile<kBlockK, D, kThreads>(dv, p.sv.seq, s_v, seq - k0);
}

// D = rowsum(dO * O) in f32, one warp per query row; blockIdx.y is the (batch*head) index. For the fast
// kernel it also stores L * log2(e), so that P = exp2(S * scale * log2(e) - that) is one FFMA and one EX2.
template <class T>
__global__ void delta_kernel(const Params p, int d_head) {
  const int64_t i = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32, bh = blockIdx.y;
  const int lane = threadIdx.x % 32;
  if (i >= p.seq) return;
  const T* o = static_cast<const T*>(p.o) + head_offset(p.so, bh, p.heads) + i * p.so.seq;
  const T* d_o = static_cast<const T*>(p.d_o) + head_offset(p.so, bh, p.heads) + i * p.so.seq;
  float sum = 0;
  for (int e = lane; e < d_head; e += 32) sum += to_float(o[e]) * to_float(d_o[e]);
  sum = warp_sum(sum);
  if (lane == 0) {
    p.delta[bh * p.seq + i] = sum;
    if (p.lse_log2 != nullptr) p.lse_log2[bh * p.seq + i] = p.lse[bh * p.seq + i] * kLog2e;
  }
}

// The same for bf16 rows of D elements with 16-byte aligned rows: D/8 lanes per row, each multiplying 8
// elements loaded in one 16-byte access. A row takes the next power of two of lanes (16 for D = 80, the
// lanes beyond D/8 adding nothing), so a warp covers 32 / that many rows at once.
__host__ __device__ constexpr int next_power_of_two(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}
template <int D>
__global__ void delta_bf16_vec_kernel(const Params p) {
  constexpr int kUsedLanes = D / 8;
  constexpr int kLanesPerRow = next_power_of_two(kUsedLanes);
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  const int lane = threadIdx.x % 32;
  const int64_t warp_index = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32, bh = blockIdx.y;
  const int64_t i = warp_index * kRowsPerWarp + lane / kLanesPerRow;
  float sum = 0;
  if (i < p.seq && lane % kLanesPerRow < kUsedLanes) {
    const int64_t offset = head_offset(p.so, bh, p.heads) + i * p.so.seq + (lane % kLanesPerRow) * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.o) + offset);
    const uint4 d_o = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.d_o) + offset);
    const auto* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
    const auto* d2 = reinterpret_cast<const __nv_bfloat162*>(&d_o);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = __bfloat1622float2(o2[e]), b = __bfloat1622float2(d2[e]);
      sum += a.x * b.x + a.y * b.y;
    }
  }
#pragma unroll
  for (int width = kLanesPerRow / 2; width > 0; width /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, width);
  if (i < p.seq && lane % kLanesPerRow == 0) {
    p.delta[bh * p.seq + i] = sum;
    if (p.lse_log2 != nullptr) p.lse_log2[bh * p.seq + i] = p.lse[bh * p.seq + i] * kLog2e;
  }
}

// dQ = scale * accumulator, converted to bf16 and written in dQ's layout (16-byte aligned rows): 8
// elements (two float4 loads, one 16-byte store) per thread and step.
template <int D>
__global__ void dq_convert_bf16_vec_kernel(const Params p, int64_t total) {
  for (int64_t chunk = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; chunk < total / 8;
       chunk += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = chunk / (D / 8), e = (chunk % (D / 8)) * 8, bh = row / p.seq, i = row % p.seq;
    const float4 a = *reinterpret_cast<const float4*>(p.dq_accum + chunk * 8);
    const float4 b = *reinterpret_cast<const float4*>(p.dq_accum + chunk * 8 + 4);
    uint4 out;
    out.x = pack_bf16(a.x * p.scale, a.y * p.scale);
    out.y = pack_bf16(a.z * p.scale, a.w * p.scale);
    out.z = pack_bf16(b.x * p.scale, b.y * p.scale);
    out.w = pack_bf16(b.z * p.scale, b.w * p.scale);
    *reinterpret_cast<uint4*>(static_cast<bf16*>(p.dq) + head_offset(p.sq, bh, p.heads) + i * p.sq.seq + e) =
        out;
  }
}

template <int D>
void launch_backward_bf16(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  using Tile = BackwardTile<D>;
  if (!launch_backward_hopper(params, D, batch_heads, stream)) {
    const auto kernel = flash_backward_bf16_kernel<D>;
    allow_shared_memory(kernel, Tile::kSmemBytes);
    const dim3 grid(static_cast<unsigned>(batch_heads), ceil_div(params.seq, Tile::kBlockK));
    kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(params);
    TT_CUDA_LAUNCH_CHECK();
  }
  const int64_t total = batch_heads * params.seq * D;
  static_assert(D % 8 == 0, "every supported head dim is a multiple of 8");
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(total / 8, 256), 8192));
  dq_convert_bf16_vec_kernel<D><<<blocks, 256, 0, stream>>>(params, total);
  TT_CUDA_LAUNCH_CHECK();
}

template <class T, int D>
void launch_backward_simple(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  const dim3 grid(ceil_div(params.seq, kSimpleRows), static_cast<unsigned>(batch_heads));
  const auto dq_kernel = simple_backward_dq_kernel<T, D>;
  allow_shared_memory(dq_kernel, simple_dq_smem_bytes<D>());
  dq_kernel<<<grid, kSimpleThreads, simple_dq_smem_bytes<D>(), stream>>>(params);
  TT_CUDA_LAUNCH_CHECK();
  const auto dkdv_kernel = simple_backward_dkdv_kernel<T, D>;
  allow_shared_memory(dkdv_kernel, simple_dkdv_smem_bytes<D>());
  dkdv_kernel<<<grid, kSimpleThreads, simple_dkdv_smem_bytes<D>(), stream>>>(params);
  TT_CUDA_LAUNCH_CHECK();
}

// Stream-ordered f32 scratch, released on the same stream however the launches end.
class StreamScratch {
 public:
  StreamScratch(size_t floats, cudaStream_t stream) : stream_(stream) {
    TT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), floats * sizeof(float), stream));
  }
  ~StreamScratch() { cudaFreeAsync(data_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace
}  // namespace tt::cuda::flash

namespace tt::cuda {

void flash_attention_backward(const AttentionProblem& p, DType dtype, const void* q, const void* k,
                              const void* v, const void* o, const void* d_o, const float* lse, void* dq,
                              void* dk, void* dv, void* stream) {
  using namespace flash;
  check_problem(p, dtype);
  Params params = make_params(p);
  params.q = q;
  params.k = k;
  params.v = v;
  params.o = const_cast<void*>(o);  // read only in the backward
  params.d_o = d_o;
  params.lse = const_cast<float*>(lse);
  params.dq = dq;
  params.dk = dk;
  params.dv = dv;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const int64_t batch_heads = p.batch * p.heads, rows = batch_heads * p.seq;
  // scale > 0: as in the forward (flash_attention_fwd.cu), the kernels scale scores after masking them.
  const bool fast = dtype == DType::bf16 && p.kernels != AttentionKernels::simple && !p.deterministic &&
                    p.scale > 0 && rows_aligned_16(q, p.q) && rows_aligned_16(k, p.k) &&
                    rows_aligned_16(v, p.v) && rows_aligned_16(d_o, p.o) && rows_aligned_16(o, p.o) &&
                    rows_aligned_16(dq, p.q) && rows_aligned_16(dk, p.k) && rows_aligned_16(dv, p.v);

  // Scratch: D, then for the fast kernel L * log2(e) and the dQ accumulator. Each part is rounded up to a
  // multiple of 4 floats so that the accumulator stays 16-byte aligned.
  const int64_t row_floats = (rows + 3) / 4 * 4;
  StreamScratch scratch(static_cast<size_t>(fast ? 2 * row_floats + rows * p.d_head : row_floats),
                        cuda_stream);
  params.delta = scratch.data();
  if (fast) {
    params.lse_log2 = scratch.data() + row_floats;
    params.dq_accum = scratch.data() + 2 * row_floats;
    TT_CUDA_CHECK(cudaMemsetAsync(params.dq_accum, 0, rows * p.d_head * sizeof(float), cuda_stream));
  }

  dispatch_head_dim(p.d_head, [&](auto head_dim) {
    constexpr int D = decltype(head_dim)::value;
    bool vectorised = false;
    if constexpr (D / 8 <= 32) {  // a row's 16-byte groups fit in a warp
      if (fast) {
        constexpr int kRowsPerBlock = 4 * (32 / next_power_of_two(D / 8));  // 4 warps
        const dim3 grid(ceil_div(p.seq, kRowsPerBlock), static_cast<unsigned>(batch_heads));
        delta_bf16_vec_kernel<D><<<grid, 128, 0, cuda_stream>>>(params);
        vectorised = true;
      }
    }
    if (!vectorised) {
      constexpr int kRowsPerBlock = 4;  // one warp per row
      const dim3 grid(ceil_div(p.seq, kRowsPerBlock), static_cast<unsigned>(batch_heads));
      if (dtype == DType::bf16) {
        delta_kernel<__nv_bfloat16><<<grid, 32 * kRowsPerBlock, 0, cuda_stream>>>(params, D);
      } else {
        delta_kernel<float><<<grid, 32 * kRowsPerBlock, 0, cuda_stream>>>(params, D);
      }
    }
    TT_CUDA_LAUNCH_CHECK();
    if (fast) {
      launch_backward_bf16<D>(params, batch_heads, cuda_stream);
    } else if (dtype == DType::bf16) {
      launch_backward_simple<__nv_bfloat16, D>(params, batch_heads, cuda_stream);
    } else {
      launch_backward_simple<float, D>(params, batch_heads, cuda_stream);
    }
  });
}

}  // namespace tt::cuda
