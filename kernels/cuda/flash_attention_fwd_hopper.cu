// FlashAttention-2 forward for Hopper (sm_90a, bf16, head dims 64 and 128): the algorithm of
// flash_attention_fwd.cu with both products on warpgroup tensor-core instructions (wgmma.cuh), which read
// K and V straight from shared memory instead of staging every fragment through registers (ldmatrix).
//
// One thread block per (tile of 128 queries, batch*head); two "consumer" warpgroups of 128 threads:
//  - Warpgroup g owns query rows 64g .. 64g+63 of the tile for the whole kernel; within it, warp w holds
//    rows 16w .. 16w+15 (the wgmma accumulator layout), so a row's softmax statistics live in the 4 lanes
//    that hold it, as in the mma.sync kernel. WarpgroupState below is everything one warpgroup computes.
//  - Per key tile of 128: S = Q K^T (64 x 128 per warpgroup, d/16 wgmma steps, both operands in shared
//    memory), mask where needed, online softmax in the log2 domain, P re-packed to bf16 in registers, then
//    O += P V (8 steps of 16 keys, P from registers, V from shared memory read "transposed").
//  - Software pipeline inside a warpgroup: the scores of tile t and P V of tile t-1 are issued together;
//    the softmax of tile t runs on the CUDA cores while the tensor cores still multiply P V.
//  - Tiles live in shared memory in the 128-byte-swizzled layout the wgmma descriptors describe.
//  - Causal: key tiles past the block's last query are not visited; the mask is evaluated only on tiles
//    that cross a warpgroup's diagonal or hang past the end of the sequence; which block takes which tile:
//    `block_tile` (flash_attention_common.cuh).
//  - Epilogue: O /= l, written swizzled into the Q tile's shared memory (conflict-free), then stored with
//    16-byte coalesced writes; L = (m + log2 l) ln 2.
//
// Two ways of feeding the warpgroups:
//  - d_head 64, "warp-specialised": a ninth warp is the producer. It loads Q and streams K and V tiles
//    into three shared-memory stages with the Tensor Memory Accelerator (one bulk copy per 64-column
//    block, swizzled by the hardware, rows past the sequence zero-filled), signalling "stage full" on an
//    mbarrier; consumers signal "stage empty" when their last product reading it is complete. Nothing else
//    couples the two warpgroups, which take turns at the tensor cores ("ping-pong", two named barriers):
//    one warpgroup's softmax runs while the other's products do.
//  - d_head 128: the two warpgroups' registers leave no room for a ninth warp, so all 256 threads load
//    the next tile with cp.async and meet at one block barrier per tile (three stages).
#include <cudaTypedefs.h>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tt::cuda::flash {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBlockQ = 128;  // queries per block: two warpgroups of 64 rows
constexpr int kBlockK = 128;  // keys per tile
constexpr int kConsumerThreads = 256;
constexpr int kStages = 3;

template <int D>
struct HopperTile {
  static constexpr uint32_t kQBytes = kBlockQ * D * sizeof(bf16);
  static constexpr uint32_t kKVBytes = kBlockK * D * sizeof(bf16);  // one K or one V tile
  // Q, the K stages, the V stages, room for the mbarriers, and slack to align the start to 1024 bytes.
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 128 + 1024;
};

// ---- Loads (sm_90a only, like the kernels that use them) -------------------------------------------------
#if TT_HAVE_WGMMA

template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Cooperative cp.async of a ROWS x D bf16 tile into the swizzled layout; rows >= valid_rows are zero-filled.
template <int ROWS, int D, int THREADS>
__device__ inline void load_swizzled_async(unsigned char* smem, const bf16* gmem, int64_t row_stride,
                                           int valid_rows) {
  constexpr int kChunksPerRow = D / 8;
  static_assert(ROWS * kChunksPerRow % THREADS == 0, "the tile must split evenly over the threads");
#pragma unroll
  for (int step = 0; step < ROWS * kChunksPerRow / THREADS; ++step) {
    const int chunk = step * THREADS + static_cast<int>(threadIdx.x);
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    cp_async_16(smem + wgmma::swizzled_offset(row, col, ROWS), gmem + (valid ? row * row_stride + col : 0),
                valid);
  }
}

// ---- One warpgroup's share of the attention -----------------------------------------------------------

template <int D>
struct WarpgroupState {
  // s[4j + 2i + e]: row `row + 8i`, key 8j + 2(lane%4) + e of the current tile; o likewise per 64-column
  // block of d; p: P of the previous tile in bf16, as A fragments of 16 keys each. Statistics per row i,
  // max in log2 units (already times scale * log2 e).
  float s[64];
  float o[D / 64][32];
  uint32_t p[kBlockK / 16][4];
  float row_max[2], row_sum[2];
  int lane, group_row0, row;  // group_row0: the warpgroup's first row in the tile; row: this thread's

  __device__ void init(int warpgroup) {
    lane = static_cast<int>(threadIdx.x % 32);
    group_row0 = warpgroup * 64;
    row = group_row0 + static_cast<int>(threadIdx.x % 128) / 32 * 16 + lane / 4;
#pragma unroll
    for (int n = 0; n < 64; ++n) s[n] = 0;
#pragma unroll
    for (int b = 0; b < D / 64; ++b) {
#pragma unroll
      for (int n = 0; n < 32; ++n) o[b][n] = 0;
    }
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0;
  }

  // S = Q K^T, issued asynchronously: 16 columns of d per step; 64-column blocks follow each other.
  __device__ void issue_scores(uint32_t q_tile_address, uint32_t k_address) {
    const uint32_t q_address = q_tile_address + group_row0 * 128;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t step_offset = (kk % 4) * 32;
      wgmma::mma_m64n128k16_ss(
          s, wgmma::smem_descriptor(q_address + (kk / 4) * kBlockQ * 128 + step_offset, 0),
          wgmma::smem_descriptor(k_address + (kk / 4) * kBlockK * 128 + step_offset, 0), kk > 0 ? 1 : 0);
    }
    wgmma::commit_group();
  }

  // O += P V, issued asynchronously: P from registers, V read transposed from shared memory.
  __device__ void issue_values(uint32_t v_address) {
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        wgmma::mma_m64n64k16_rs<1>(
            o[b], p[kk], wgmma::smem_descriptor(v_address + b * kBlockK * 128 + kk * 16 * 128, kBlockK * 128),
            1);
      }
    }
    wgmma::commit_group();
  }

  // Mask (where needed) and online softmax of the scores of key tile k0: s becomes P (unnormalised, f32),
  // the row statistics move on, and the factors O must be rescaled by land in correction.
  __device__ void softmax(const Params& prm, int q0, int k0, int seq, float (&correction)[2]) {
    if (k0 + kBlockK > seq || (prm.causal && k0 + kBlockK - 1 > q0 + group_row0)) {
#pragma unroll
      for (int n = 0; n < 64; ++n) {
        const int key = k0 + (n / 4) * 8 + 2 * (lane % 4) + (n % 2);
        const int query = q0 + row + 8 * ((n / 2) % 2);
        if (key >= seq || (prm.causal && key > query)) s[n] = -INFINITY;
      }
    }
    // Row max over this thread's columns, then over the 4 lanes that share the row.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 64; ++n) tile_max[(n / 2) % 2] = fmaxf(tile_max[(n / 2) % 2], s[n]);
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float new_max = fmaxf(row_max[i], tile_max[i] * prm.scale_log2);
      // A row with nothing visible yet keeps max -inf; exp2 against 0 then still gives exact zeros.
      base[i] = new_max == -INFINITY ? 0.0f : new_max;
      correction[i] = fast_exp2(row_max[i] - base[i]);
      row_max[i] = new_max;
      row_sum[i] *= correction[i];
    }
#pragma unroll
    for (int n = 0; n < 64; ++n) {
      s[n] = fast_exp2(s[n] * prm.scale_log2 - base[(n / 2) % 2]);
      row_sum[(n / 2) % 2] += s[n];
    }
  }

  // After the previous P V is complete: rescale O, then P of this tile into the A fragments. Keys
  // 16kk .. 16kk+15 are accumulator tiles 2kk and 2kk+1: registers s[8kk .. 8kk+7] in fragment order.
  __device__ void rescale_and_pack(const float (&correction)[2]) {
#pragma unroll
    for (int b = 0; b < D / 64; ++b) {
      wgmma::fence_operands(o[b]);
#pragma unroll
      for (int n = 0; n < 32; ++n) o[b][n] *= correction[(n / 2) % 2];
    }
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) p[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
  }

  // O / l in bf16 into this warpgroup's rows of the swizzled tile at s_out (only this warpgroup reads or
  // writes them); L to global memory.
  __device__ void finish(unsigned char* s_out, const Params& prm, int64_t bh, int q0, int seq) {
#pragma unroll
    for (int b = 0; b < D / 64; ++b) wgmma::fence_operands(o[b]);
    float inv_sum[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
      row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
      inv_sum[i] = 1.0f / row_sum[i];
      const int query = q0 + row + 8 * i;
      if (lane % 4 == 0 && query < seq) prm.lse[bh * seq + query] = (row_max[i] + log2f(row_sum[i])) * kLn2;
    }
#pragma unroll
    for (int b = 0; b < D / 64; ++b) {
#pragma unroll
      for (int n = 0; n < 32; n += 2) {
        const int i = (n / 2) % 2, col = b * 64 + (n / 4) * 8 + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(s_out + wgmma::swizzled_offset(row + 8 * i, col, kBlockQ)) =
            pack_bf16(o[b][n] * inv_sum[i], o[b][n + 1] * inv_sum[i]);
      }
    }
  }
};

// The consumers' coalesced 16-byte stores of the finished O tile (after a barrier among them).
template <int D>
__device__ inline void store_output(const Params& p, int64_t bh, int q0, const unsigned char* s_out) {
  bf16* o = static_cast<bf16*>(p.o) + head_offset(p.so, bh, p.heads) + q0 * p.so.seq;
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int step = 0; step < kBlockQ * kChunksPerRow / kConsumerThreads; ++step) {
    const int chunk = step * kConsumerThreads + static_cast<int>(threadIdx.x);
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (q0 + row < p.seq) {
      *reinterpret_cast<uint4*>(o + row * p.so.seq + col) =
          *reinterpret_cast<const uint4*>(s_out + wgmma::swizzled_offset(row, col, kBlockQ));
    }
  }
}

__device__ inline unsigned char* aligned_shared_base(unsigned char* raw) {
  return raw + (1024 - shared_address(raw) % 1024) % 1024;
}

#endif  // TT_HAVE_WGMMA

// ---- d_head 64: warp-specialised, TMA-fed, ping-pong ----------------------------------------------------

template <int D>
__global__ void __launch_bounds__(kConsumerThreads + 32, 1)
    flash_forward_hopper_ws_kernel(const __grid_constant__ CUtensorMap map_q,
                                   const __grid_constant__ CUtensorMap map_k,
                                   const __grid_constant__ CUtensorMap map_v, const Params p) {
#if TT_HAVE_WGMMA
  using Tile = HopperTile<D>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* s_q = aligned_shared_base(smem_raw);
  unsigned char* s_k = s_q + Tile::kQBytes;  // kStages K tiles, then kStages V tiles
  unsigned char* s_v = s_k + kStages * Tile::kKVBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_v + kStages * Tile::kKVBytes);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;

  int64_t bh;
  int rank;
  block_tile(4 * p.seq * D, bh, rank);  // every query tile of a pair reads its K and V
  const int q_tile = p.causal ? gridDim.y - 1 - rank : rank;
  const int q0 = q_tile * kBlockQ;
  const int batch = static_cast<int>(bh / p.heads), head = static_cast<int>(bh % p.heads);
  const int seq = static_cast<int>(p.seq);
  const int num_k_tiles = ceil_div(p.causal ? min(seq, q0 + kBlockQ) : seq, kBlockK);

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbarrier_init(&full[i], 1);                  // the producer's arrival + the tile's bytes
      mbarrier_init(&empty[i], kConsumerThreads);  // every consumer thread, once its products are done
    }
    mbarrier_init(q_full, 1);
    mbarrier_init_fence();
  }
  __syncthreads();

  // The warp index, read through a shuffle so the compiler knows it is the same in the whole warp (its
  // wgmma code must not look divergent, or it serialises the multiplies).
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0);
  if (warp == kConsumerThreads / 32) {  // the producer warp: one thread issues every copy
    if (threadIdx.x == kConsumerThreads) {
      mbarrier_arrive_expect_bytes(q_full, Tile::kQBytes);
      for (int b = 0; b < D / 64; ++b)
        tma_load(s_q + b * kBlockQ * 128, map_q, b * 64, q0, head, batch, q_full);
      for (int t = 0; t < num_k_tiles; ++t) {
        const int stage = t % kStages;
        if (t >= kStages) mbarrier_wait(&empty[stage], (t / kStages - 1) & 1);
        mbarrier_arrive_expect_bytes(&full[stage], 2 * Tile::kKVBytes);
        for (int b = 0; b < D / 64; ++b) {
          tma_load(s_k + stage * Tile::kKVBytes + b * kBlockK * 128, map_k, b * 64, t * kBlockK, head, batch,
                   &full[stage]);
          tma_load(s_v + stage * Tile::kKVBytes + b * kBlockK * 128, map_v, b * 64, t * kBlockK, head, batch,
                   &full[stage]);
        }
      }
    }
    return;
  }

  const int warpgroup = warp / 4;
  WarpgroupState<D> state;
  state.init(warpgroup);
  // Ping-pong: warpgroup g issues its products after barrier 1+g, then opens the other's barrier.
  const int my_turn = 1 + warpgroup, other_turn = 2 - warpgroup;
  if (warpgroup == 1) named_barrier_arrive(1, kConsumerThreads);  // warpgroup 0 goes first
  const uint32_t q_address = shared_address(s_q);
  mbarrier_wait(q_full, 0);

  for (int t = 0; t < num_k_tiles; ++t) {
    const int stage = t % kStages, previous = (t + kStages - 1) % kStages;
    mbarrier_wait(&full[stage], (t / kStages) & 1);
    named_barrier_sync(my_turn, kConsumerThreads);
    wgmma::fence();
    state.issue_scores(q_address, shared_address(s_k + stage * Tile::kKVBytes));
    if (t > 0) {
      state.issue_values(shared_address(s_v + previous * Tile::kKVBytes));
      named_barrier_arrive(other_turn, kConsumerThreads);
      wgmma::wait_group<1>();  // the scores are done; P V of tile t-1 may still run
    } else {
      named_barrier_arrive(other_turn, kConsumerThreads);
      wgmma::wait_group<0>();
    }
    wgmma::fence_operands(state.s);
    float correction[2];
    state.softmax(p, q0, t * kBlockK, seq, correction);
    wgmma::wait_group<0>();
    if (t > 0) mbarrier_arrive(&empty[previous]);  // K and V of tile t-1 are no longer read
    state.rescale_and_pack(correction);
  }
  named_barrier_sync(my_turn, kConsumerThreads);
  wgmma::fence();
  state.issue_values(shared_address(s_v + (num_k_tiles - 1) % kStages * Tile::kKVBytes));
  if (warpgroup == 0) named_barrier_arrive(other_turn, kConsumerThreads);
  wgmma::wait_group<0>();

  state.finish(s_q, p, bh, q0, seq);
  named_barrier_sync(3, kConsumerThreads);  // the whole O tile is in shared memory
  store_output<D>(p, bh, q0, s_q);
#else
  __trap();  // an sm_90 GPU running a build without sm_90a code: fail loudly, never leave outputs unset
#endif
}

// ---- d_head 128 (and 64 where no tensor map can be made, or with AttentionKernels::cp_async_forward):
// cp.async ---------------

template <int D>
__global__ void __launch_bounds__(kConsumerThreads, 1) flash_forward_hopper_kernel(const Params p) {
#if TT_HAVE_WGMMA
  using Tile = HopperTile<D>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* s_q = aligned_shared_base(smem_raw);
  unsigned char* s_k = s_q + Tile::kQBytes;  // kStages K tiles, then kStages V tiles
  unsigned char* s_v = s_k + kStages * Tile::kKVBytes;

  int64_t bh;
  int rank;
  block_tile(4 * p.seq * D, bh, rank);  // every query tile of a pair reads its K and V
  const int q_tile = p.causal ? gridDim.y - 1 - rank : rank;
  const int q0 = q_tile * kBlockQ;
  const int seq = static_cast<int>(p.seq);
  const bf16* q = static_cast<const bf16*>(p.q) + head_offset(p.sq, bh, p.heads) + q0 * p.sq.seq;
  const bf16* k = static_cast<const bf16*>(p.k) + head_offset(p.sk, bh, p.heads);
  const bf16* v = static_cast<const bf16*>(p.v) + head_offset(p.sv, bh, p.heads);
  const int num_k_tiles = ceil_div(p.causal ? min(seq, q0 + kBlockQ) : seq, kBlockK);
  const auto load_key_tile = [&](int tile) {
    const int first = tile * kBlockK, stage = tile % kStages;
    load_swizzled_async<kBlockK, D, kConsumerThreads>(s_k + stage * Tile::kKVBytes, k + first * p.sk.seq,
                                                      p.sk.seq, seq - first);
    load_swizzled_async<kBlockK, D, kConsumerThreads>(s_v + stage * Tile::kKVBytes, v + first * p.sv.seq,
                                                      p.sv.seq, seq - first);
  };

  WarpgroupState<D> state;
  state.init(static_cast<int>(threadIdx.x) / 128);
  const uint32_t q_address = shared_address(s_q);
  load_swizzled_async<kBlockQ, D, kConsumerThreads>(s_q, q, p.sq.seq, seq - q0);
  load_key_tile(0);
  cp_async_commit();

  // Three stages: tile t+1 loading, t read by the scores, t-1 read by P V.
  for (int t = 0; t < num_k_tiles; ++t) {
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();  // tile t is visible to the tensor cores; tile t-2's stage is free again
    if (t + 1 < num_k_tiles) {
      load_key_tile(t + 1);
      cp_async_commit();
    }
    wgmma::fence();
    state.issue_scores(q_address, shared_address(s_k + t % kStages * Tile::kKVBytes));
    if (t > 0) {
      state.issue_values(shared_address(s_v + (t - 1) % kStages * Tile::kKVBytes));
      wgmma::wait_group<1>();
    } else {
      wgmma::wait_group<0>();
    }
    wgmma::fence_operands(state.s);
    float correction[2];
    state.softmax(p, q0, t * kBlockK, seq, correction);
    wgmma::wait_group<0>();
    state.rescale_and_pack(correction);
  }
  wgmma::fence();
  state.issue_values(shared_address(s_v + (num_k_tiles - 1) % kStages * Tile::kKVBytes));
  wgmma::wait_group<0>();

  state.finish(s_q, p, bh, q0, seq);
  __syncthreads();
  store_output<D>(p, bh, q0, s_q);
#else
  __trap();  // an sm_90 GPU running a build without sm_90a code: fail loudly, never leave outputs unset
#endif
}

template <int D>
bool launch_warp_specialised(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  const int64_t batch = batch_heads / params.heads;
  CUtensorMap map_q, map_k, map_v;
  if (!make_tensor_map(&map_q, params.q, params.sq, params, D, batch, kBlockQ) ||
      !make_tensor_map(&map_k, params.k, params.sk, params, D, batch, kBlockK) ||
      !make_tensor_map(&map_v, params.v, params.sv, params, D, batch, kBlockK)) {
    return false;
  }
  const auto kernel = flash_forward_hopper_ws_kernel<D>;
  allow_shared_memory(kernel, HopperTile<D>::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(batch_heads), ceil_div(params.seq, kBlockQ));
  kernel<<<grid, kConsumerThreads + 32, HopperTile<D>::kSmemBytes, stream>>>(map_q, map_k, map_v, params);
  TT_CUDA_LAUNCH_CHECK();
  return true;
}

template <int D>
void launch_cp_async(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  const auto kernel = flash_forward_hopper_kernel<D>;
  allow_shared_memory(kernel, HopperTile<D>::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(batch_heads), ceil_div(params.seq, kBlockQ));
  kernel<<<grid, kConsumerThreads, HopperTile<D>::kSmemBytes, stream>>>(params);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace

// ---- Host side -------------------------------------------------------------------------------------------

namespace {
// The driver's tensor-map encoder, reached through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// A 4-d bf16 tensor map (strides in bytes for dimensions 1 to 3) with boxes of 64 elements (128 bytes, the
// 128-byte swizzle) x `rows` x 1 x 1.
bool encode_bf16_map(CUtensorMap* map, const void* base, const cuuint64_t (&dims)[4],
                     const cuuint64_t (&strides)[3], uint32_t rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint32_t box[4] = {64, rows, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool make_tensor_map(CUtensorMap* map, const void* base, const AttentionStrides& s, const Params& p,
                     int64_t d_head, int64_t batch, uint32_t rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(p.seq),
                              static_cast<cuuint64_t>(p.heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(s.seq) * 2, static_cast<cuuint64_t>(s.head) * 2,
                                 static_cast<cuuint64_t>(s.batch) * 2};
  return encode_bf16_map(map, base, dims, strides, rows);
}

bool make_matrix_map(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t row_stride,
                     uint32_t box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), 1, 1};
  const cuuint64_t matrix_bytes = static_cast<cuuint64_t>(row_stride * rows) * 2;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(row_stride) * 2, matrix_bytes, matrix_bytes};
  return encode_bf16_map(map, base, dims, strides, box_rows);
}

bool make_dq_accum_map(CUtensorMap* map, float* base, int64_t seq, int64_t d_head, int64_t batch_heads,
                       uint32_t rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(seq),
                              static_cast<cuuint64_t>(batch_heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d_head) * 4,
                                 static_cast<cuuint64_t>(seq * d_head) * 4};
  const cuuint32_t box[3] = {32, rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool launch_forward_hopper(const Params& params, int64_t d_head, int64_t batch_heads, cudaStream_t stream) {
  if ((d_head != 64 && d_head != 128) || params.kernels == AttentionKernels::mma_sync ||
      current_device_major() != 9)
    return false;
  if (d_head == 64) {
    if (params.kernels != AttentionKernels::cp_async_forward &&
        launch_warp_specialised<64>(params, batch_heads, stream))
      return true;
    launch_cp_async<64>(params, batch_heads, stream);
  } else {
    launch_cp_async<128>(params, batch_heads, stream);
  }
  return true;
}

}  // namespace tt::cuda::flash
