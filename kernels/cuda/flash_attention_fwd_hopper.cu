// FlashAttention-2 forward for Hopper (sm_90a, bf16, head dims 64 and 128): the algorithm of
// flash_attention_fwd.cu with both products on warpgroup tensor-core instructions (wgmma.cuh), which read
// K and V straight from shared memory instead of staging every fragment through registers (ldmatrix).
//
// One thread block per (tile of 128 queries, batch*head), two warpgroups of 128 threads:
//  - Warpgroup g owns query rows 64g .. 64g+63 of the tile for the whole kernel; within it, warp w holds
//    rows 16w .. 16w+15 (the wgmma accumulator layout), so a row's softmax statistics live in the 4 lanes
//    that hold it, as in the mma.sync kernel.
//  - Q (128 x d) is loaded once; key tiles of 128 stream through two shared-memory stages with cp.async,
//    stored in the 128-byte-swizzled layout the wgmma descriptors describe: tile t+1 is in flight while
//    tile t is multiplied.
//  - Per key tile: S = Q K^T (64 x 128 per warpgroup, d/16 wgmma steps, operands in shared memory), mask
//    where needed, online softmax in the log2 domain, P re-packed to bf16 in registers, then O += P V
//    (8 steps of 16 keys, P from registers, V from shared memory read "transposed").
//  - Causal: key tiles past the block's last query are not visited; the mask is evaluated only on tiles
//    that cross a warpgroup's diagonal or hang past the end of the sequence; longest query tiles first.
//  - Epilogue: O /= l, written swizzled into the Q tile's shared memory (conflict-free), then stored with
//    16-byte coalesced writes; L = (m + log2 l) ln 2.
#include <atomic>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tt::cuda::flash {
namespace {

using bf16 = __nv_bfloat16;

template <int D>
struct HopperForwardTile {
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kBlockQ = 64 * kWarpgroups;
  static constexpr int kBlockK = 128;
  static constexpr int kStages = 2;
  static constexpr uint32_t kQBytes = kBlockQ * D * sizeof(bf16);
  static constexpr uint32_t kKVBytes = kBlockK * D * sizeof(bf16);  // one K or one V tile
  // Q, the K stages, the V stages, and slack to align the start to 1024 bytes.
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 1024;
};

// Waits until at most N cp.async groups of this thread are still in flight.
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

template <int D>
__global__ void __launch_bounds__(HopperForwardTile<D>::kThreads, 1) flash_forward_hopper_kernel(const Params p) {
#if TT_HAVE_WGMMA
  using Tile = HopperForwardTile<D>;
  constexpr int kBlockQ = Tile::kBlockQ, kBlockK = Tile::kBlockK, kThreads = Tile::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (1024 - shared_address(smem_raw) % 1024) % 1024;
  unsigned char* s_q = smem;
  unsigned char* s_k = s_q + Tile::kQBytes;  // kStages K tiles, then kStages V tiles
  unsigned char* s_v = s_k + Tile::kStages * Tile::kKVBytes;

  const int q_tile = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int q0 = q_tile * kBlockQ;
  const int64_t bh = blockIdx.y;
  const int seq = static_cast<int>(p.seq);
  const bf16* q = static_cast<const bf16*>(p.q) + head_offset(p.sq, bh, p.heads) + q0 * p.sq.seq;
  const bf16* k = static_cast<const bf16*>(p.k) + head_offset(p.sk, bh, p.heads);
  const bf16* v = static_cast<const bf16*>(p.v) + head_offset(p.sv, bh, p.heads);
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int warp = static_cast<int>(threadIdx.x % 128) / 32, lane = static_cast<int>(threadIdx.x % 32);
  const int group_row0 = warpgroup * 64;                  // this warpgroup's first row in the tile
  const int thread_row = group_row0 + warp * 16 + lane / 4;  // + 8 for the second row of the thread
  const int key_end = p.causal ? min(seq, q0 + kBlockQ) : seq;
  const int num_k_tiles = ceil_div(key_end, kBlockK);

  load_swizzled_async<kBlockQ, D, kThreads>(s_q, q, p.sq.seq, seq - q0);
  load_swizzled_async<kBlockK, D, kThreads>(s_k, k, p.sk.seq, seq);
  load_swizzled_async<kBlockK, D, kThreads>(s_v, v, p.sv.seq, seq);
  cp_async_commit();

  // s[4j + 2i + e]: row thread_row + 8i, key 8j + 2(lane%4) + e of the current tile. o_acc likewise per
  // 64-column block of d. Statistics per row i, max in log2 units (already times scale * log2 e).
  float s[64];
  float o_acc[D / 64][32];
#pragma unroll
  for (int n = 0; n < 64; ++n) s[n] = 0;
#pragma unroll
  for (int b = 0; b < D / 64; ++b) {
#pragma unroll
    for (int n = 0; n < 32; ++n) o_acc[b][n] = 0;
  }
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0, 0};
  const uint32_t q_address = shared_address(s_q) + group_row0 * 128;

  for (int t = 0; t < num_k_tiles; ++t) {
    const int stage = t % Tile::kStages;
    if (t + 1 < num_k_tiles) {  // prefetch the next key tile into the other stage
      const int next = (t + 1) * kBlockK, next_stage = (t + 1) % Tile::kStages;
      load_swizzled_async<kBlockK, D, kThreads>(s_k + next_stage * Tile::kKVBytes, k + next * p.sk.seq,
                                                p.sk.seq, seq - next);
      load_swizzled_async<kBlockK, D, kThreads>(s_v + next_stage * Tile::kKVBytes, v + next * p.sv.seq,
                                                p.sv.seq, seq - next);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    wgmma::fence_proxy_async();
    __syncthreads();  // tile t is in shared memory and visible to the tensor cores

    // S = Q K^T: 16 columns of d per step; the 64-column blocks of Q and K follow each other.
    const uint32_t k_address = shared_address(s_k + stage * Tile::kKVBytes);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t step_offset = (kk % 4) * 32;
      wgmma::mma_m64n128k16_ss(
          s, wgmma::smem_descriptor(q_address + (kk / 4) * kBlockQ * 128 + step_offset, 0),
          wgmma::smem_descriptor(k_address + (kk / 4) * kBlockK * 128 + step_offset, 0), kk > 0 ? 1 : 0);
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();

    const int k0 = t * kBlockK;
    if (k0 + kBlockK > seq || (p.causal && k0 + kBlockK - 1 > q0 + group_row0)) {
#pragma unroll
      for (int n = 0; n < 64; ++n) {
        const int key = k0 + (n / 4) * 8 + 2 * (lane % 4) + (n % 2);
        const int query = q0 + thread_row + 8 * ((n / 2) % 2);
        if (key >= seq || (p.causal && key > query)) s[n] = -INFINITY;
      }
    }

    // Online softmax: row max over this thread's columns, then over the 4 lanes that share the row.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 64; ++n) tile_max[(n / 2) % 2] = fmaxf(tile_max[(n / 2) % 2], s[n]);
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float new_max = fmaxf(row_max[i], tile_max[i] * p.scale_log2);
      // A row with nothing visible yet keeps max -inf; exp2 against 0 then still gives exact zeros.
      base[i] = new_max == -INFINITY ? 0.0f : new_max;
      const float correction = fast_exp2(row_max[i] - base[i]);
      row_max[i] = new_max;
      row_sum[i] *= correction;
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o_acc[b][4 * j + 2 * i] *= correction;
          o_acc[b][4 * j + 2 * i + 1] *= correction;
        }
      }
    }
#pragma unroll
    for (int n = 0; n < 64; ++n) {
      s[n] = fast_exp2(s[n] * p.scale_log2 - base[(n / 2) % 2]);
      row_sum[(n / 2) % 2] += s[n];
    }

    // O += P V. Keys 16kk .. 16kk+15 are accumulator tiles 2kk and 2kk+1: registers s[8kk .. 8kk+7] in
    // exactly the order of the A fragment.
    uint32_t p_frag[kBlockK / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) p_frag[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
    const uint32_t v_address = shared_address(s_v + stage * Tile::kKVBytes);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        wgmma::mma_m64n64k16_rs_transposed_b(
            o_acc[b], p_frag[kk],
            wgmma::smem_descriptor(v_address + b * kBlockK * 128 + kk * 16 * 128, kBlockK * 128));
      }
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();
    __syncthreads();  // every warpgroup is done with this stage before the next prefetch overwrites it
  }

  // Epilogue: normalised O in bf16 into this warpgroup's own rows of the Q tile (no other warpgroup reads
  // them), then one barrier and coalesced 16-byte stores.
  float inv_sum[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
    inv_sum[i] = 1.0f / row_sum[i];
    const int query = q0 + thread_row + 8 * i;
    if (lane % 4 == 0 && query < seq) p.lse[bh * seq + query] = (row_max[i] + log2f(row_sum[i])) * kLn2;
  }
#pragma unroll
  for (int b = 0; b < D / 64; ++b) {
#pragma unroll
    for (int n = 0; n < 32; n += 2) {
      const int i = (n / 2) % 2, row = thread_row + 8 * i, col = b * 64 + (n / 4) * 8 + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(s_q + wgmma::swizzled_offset(row, col, kBlockQ)) =
          pack_bf16(o_acc[b][n] * inv_sum[i], o_acc[b][n + 1] * inv_sum[i]);
    }
  }
  __syncthreads();
  bf16* o = static_cast<bf16*>(p.o) + head_offset(p.so, bh, p.heads) + q0 * p.so.seq;
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int step = 0; step < kBlockQ * kChunksPerRow / kThreads; ++step) {
    const int chunk = step * kThreads + static_cast<int>(threadIdx.x);
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (q0 + row < seq) {
      *reinterpret_cast<uint4*>(o + row * p.so.seq + col) =
          *reinterpret_cast<const uint4*>(s_q + wgmma::swizzled_offset(row, col, kBlockQ));
    }
  }
#endif
}

// Compute capability major of the current device, looked up once per device.
int device_major() {
  static std::atomic<int> majors[64];
  int device = 0;
  TT_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) return 0;
  if (majors[device].load() == 0) {
    int major = 0;
    TT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    majors[device].store(major);
  }
  return majors[device].load();
}

// TT_FLASH_HOPPER=0 keeps the bf16 forward on the mma.sync kernel (for comparisons and tests).
bool hopper_path_disabled() {
  const char* env = std::getenv("TT_FLASH_HOPPER");
  return env != nullptr && env[0] == '0';
}

template <int D>
void launch(const Params& params, int64_t batch_heads, cudaStream_t stream) {
  using Tile = HopperForwardTile<D>;
  const auto kernel = flash_forward_hopper_kernel<D>;
  allow_shared_memory(kernel, Tile::kSmemBytes);
  const dim3 grid(ceil_div(params.seq, Tile::kBlockQ), static_cast<unsigned>(batch_heads));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(params);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool launch_forward_hopper(const Params& params, int64_t d_head, int64_t batch_heads, cudaStream_t stream) {
  if ((d_head != 64 && d_head != 128) || hopper_path_disabled() || device_major() != 9) return false;
  if (d_head == 64) {
    launch<64>(params, batch_heads, stream);
  } else {
    launch<128>(params, batch_heads, stream);
  }
  return true;
}

}  // namespace tt::cuda::flash
