// FlashAttention-2 backward for Hopper (sm_90a, bf16, d_head 64): the algorithm of flash_attention_bwd.cu
// with all five products on warpgroup tensor-core instructions (wgmma.cuh) and the loads on the Tensor
// Memory Accelerator (hopper.cuh).
//
// One thread block per (tile of 128 keys, batch*head): a producer warpgroup (one warp of it works; the
// group hands most of its registers to the consumers with setmaxnreg) and two consumer warpgroups.
//  - Warpgroup g owns keys 64g .. 64g+63 of the tile: it accumulates their dK and dV (64 x d each) in
//    registers over the whole kernel and writes them once at the end.
//  - The producer loads K and V once, then streams query tiles of 128 (Q, dO by TMA; L * log2 e and
//    D = rowsum(dO * O) by ordinary loads) through two shared-memory stages guarded by "full" / "empty"
//    mbarriers.
//  - Per query tile, each warpgroup computes S^T = K Q^T and dP^T = V dO^T (64 keys x 128 queries;
//    operands in shared memory), P^T = exp2(S^T scale log2 e - L) and dS^T = P^T (dP^T - D) in registers,
//    then dV += P^T dO and dK += dS^T Q with P^T and dS^T as register A operands (the accumulator layout is
//    the A fragment layout) and dO, Q read "transposed" from shared memory.
//  - dQ needs dS with queries as rows and all 128 keys: both warpgroups write dS^T to shared memory
//    (double-buffered, swizzled) and, after a barrier between them, warpgroup g computes the dQ rows of
//    queries 64g .. 64g+63 of the tile = dS K (A and B both read transposed from shared memory), stages
//    them in shared memory in the layout of a swizzled TMA box (so the staging stores are free of bank
//    conflicts; a plain row-major staging cost 8 shared-memory wavefronts per store instead of 2) and adds
//    them to the f32 dQ accumulator in global memory with two TMA tensor reduce-adds.
//  - Causal: the block starts at the first query tile that sees its keys; masks only where a warpgroup's
//    keys cross the diagonal or tiles hang past the end of the sequence. Which block takes which key tile:
//    `block_tile` (flash_attention_common.cuh).
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tt::cuda::flash {
// Tile sizes and the shared-memory layout. (Not in the anonymous namespace: the non-sm_90 compilation
// pass, whose kernel body is empty, would otherwise warn that the layout's members are unused.)
namespace hopper_backward {

constexpr int kD = 64;  // head dim of this kernel
constexpr int kBlockK = 128;
constexpr int kBlockQ = 128;
constexpr int kStages = 2;
constexpr int kConsumerThreads = 256;

struct Layout {
  static constexpr uint32_t kKVBytes = kBlockK * kD * 2;  // K or V tile, bf16 (16 KB)
  static constexpr uint32_t kQBytes = kBlockQ * kD * 2;   // Q or dO tile (16 KB)
  static constexpr uint32_t kDsBytes = kBlockK * kBlockQ * 2;
  static constexpr uint32_t kDqBytes = 64 * kD * 4;  // f32 staging of one warpgroup's 64 dQ rows
  // Byte offsets from the 1024-aligned base.
  static constexpr uint32_t kK = 0, kV = kKVBytes, kQ = 2 * kKVBytes, kDo = kQ + kStages * kQBytes;
  static constexpr uint32_t kDs = kDo + kStages * kQBytes;  // two buffers
  static constexpr uint32_t kDq = kDs + 2 * kDsBytes;       // one per warpgroup
  static constexpr uint32_t kLse = kDq + 2 * kDqBytes;      // kStages x kBlockQ floats
  static constexpr uint32_t kDelta = kLse + kStages * kBlockQ * 4;
  static constexpr uint32_t kBarriers = kDelta + kStages * kBlockQ * 4;
  static constexpr size_t kSmemBytes = kBarriers + 128 + 1024;
};

}  // namespace hopper_backward

namespace {

using bf16 = __nv_bfloat16;
using namespace hopper_backward;

#if TT_HAVE_WGMMA
// P^T or dS^T (f32 accumulators of 64 keys x 128 queries) as bf16 A fragments of 16 queries each.
__device__ inline void pack_fragments(uint32_t (&frag)[kBlockQ / 16][4], const float (&acc)[kBlockQ / 2]) {
#pragma unroll
  for (int kq = 0; kq < kBlockQ / 16; ++kq) {
#pragma unroll
    for (int r = 0; r < 4; ++r) frag[kq][r] = pack_bf16(acc[8 * kq + 2 * r], acc[8 * kq + 2 * r + 1]);
  }
}
#endif

__global__ void __launch_bounds__(kConsumerThreads + 128, 1)
    flash_backward_hopper_kernel(const __grid_constant__ CUtensorMap map_q,
                                 const __grid_constant__ CUtensorMap map_k,
                                 const __grid_constant__ CUtensorMap map_v,
                                 const __grid_constant__ CUtensorMap map_do,
                                 const __grid_constant__ CUtensorMap map_dq, const Params p) {
#if TT_HAVE_WGMMA
  using L = Layout;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (1024 - shared_address(smem_raw) % 1024) % 1024;
  float* s_lse = reinterpret_cast<float*>(smem + L::kLse);
  float* s_delta = reinterpret_cast<float*>(smem + L::kDelta);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* empty = full + kStages;
  uint64_t* kv_full = empty + kStages;

  int64_t bh;
  int rank;
  block_tile(backward_bytes_per_pair(p.seq, kD), bh, rank);
  const int k0 = rank * kBlockK;
  const int batch = static_cast<int>(bh / p.heads), head = static_cast<int>(bh % p.heads);
  const int seq = static_cast<int>(p.seq);
  const int q_begin = p.causal ? k0 / kBlockQ : 0;  // earlier queries see none of these keys
  const int num_q_tiles = ceil_div(seq, kBlockQ) - q_begin;

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbarrier_init(&full[i], 32);                 // every producer lane (one also announces the bytes)
      mbarrier_init(&empty[i], kConsumerThreads);  // every consumer thread, once its products are done
    }
    mbarrier_init(kv_full, 1);
    mbarrier_init_fence();
  }
  __syncthreads();

  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (warp >= kConsumerThreads / 32) {  // the producer warpgroup: one warp works, all give registers back
    wgmma::release_registers<24>();
    if (warp > kConsumerThreads / 32) return;
    if (lane == 0) {
      mbarrier_arrive_expect_bytes(kv_full, 2 * L::kKVBytes);
      tma_load(smem + L::kK, map_k, 0, k0, head, batch, kv_full);
      tma_load(smem + L::kV, map_v, 0, k0, head, batch, kv_full);
    }
    const float* lse_log2 = p.lse_log2 + bh * seq;
    const float* delta = p.delta + bh * seq;
    for (int i = 0; i < num_q_tiles; ++i) {
      const int stage = i % kStages, q0 = (q_begin + i) * kBlockQ;
      if (i >= kStages) mbarrier_wait(&empty[stage], (i / kStages - 1) & 1);
      for (int r = lane; r < kBlockQ; r += 32) {
        const bool valid = q0 + r < seq;
        s_lse[stage * kBlockQ + r] = valid ? lse_log2[q0 + r] : 0.0f;
        s_delta[stage * kBlockQ + r] = valid ? delta[q0 + r] : 0.0f;
      }
      if (lane == 0) {
        mbarrier_arrive_expect_bytes(&full[stage], 2 * L::kQBytes);
        tma_load(smem + L::kQ + stage * L::kQBytes, map_q, 0, q0, head, batch, &full[stage]);
        tma_load(smem + L::kDo + stage * L::kQBytes, map_do, 0, q0, head, batch, &full[stage]);
      } else {
        mbarrier_arrive(&full[stage]);
      }
    }
    return;
  }

  // Consumers. This thread's accumulator rows are keys key_row and key_row + 8 (tile-relative); its
  // columns (queries of S^T, dP^T; d of dK, dV, dQ) are 8j + 2(lane%4) + e for register 4j + 2i + e.
  const int warpgroup = warp / 4;
  const int key_row = warpgroup * 64 + (warp % 4) * 16 + lane / 4;
  const uint32_t k_address = shared_address(smem + L::kK), v_address = shared_address(smem + L::kV);
  float dk[32], dv[32];
#pragma unroll
  for (int n = 0; n < 32; ++n) dk[n] = dv[n] = 0;
  wgmma::claim_registers<240>();
  mbarrier_wait(kv_full, 0);

  // dQ of this warpgroup's 64 queries of the tile = dS K over all 128 keys, into dq: A = dS from the
  // warpgroup's 64-query column block of the [key][query] buffer (read transposed), B = K from [key][d]
  // (read transposed); 16 keys per step.
  float dq[32];
#pragma unroll
  for (int n = 0; n < 32; ++n) dq[n] = 0;
  const auto issue_dq = [&](const unsigned char* s_ds) {
    const uint32_t ds_address = shared_address(s_ds) + warpgroup * kBlockK * 128;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      wgmma::mma_m64n64k16_ss<1, 1>(dq, wgmma::smem_descriptor(ds_address + kk * 16 * 128, 0),
                                    wgmma::smem_descriptor(k_address + kk * 16 * 128, 0), kk > 0 ? 1 : 0);
    }
    wgmma::commit_group();
  };
  // The finished dq rows starting at query q_first: staged in this warpgroup's shared buffer (free: its
  // previous TMA read was waited for before the last barrier), then one thread adds them to global memory.
  const auto flush_dq = [&](int q_first) {
    wgmma::fence_operands(dq);
    unsigned char* s_dq = smem + L::kDq + warpgroup * L::kDqBytes;
    const int q_row = (warp % 4) * 16 + lane / 4;
    // Two boxes of 32 columns x 64 rows in the tensor map's 128-byte swizzle: the 16-byte chunk c of row r
    // sits at chunk c ^ (r % 8). A 64-bit store instruction is served a half-warp (four rows) per wavefront;
    // the XOR alone would leave rows r and r ^ 1 on the same pair of chunks, so rows with odd (row % 8)
    // store column block b ^ 2 where the others store block b, and the four rows use four different pairs.
    const bool odd = (lane / 4) % 2 == 1;
#pragma unroll
    for (int n = 0; n < 32; n += 2) {
      const int partner = n ^ 8;  // block (n / 4) ^ 2, same row half
      const int row = q_row + 8 * ((n / 2) % 2);
      const int col = ((odd ? partner : n) / 4) * 8 + 2 * (lane % 4);
      const int c = col % 32;
      const uint32_t offset = (col / 32) * 8192 + row * 128 + (((c / 4) ^ (row % 8)) * 16) + (c % 4) * 4;
      *reinterpret_cast<float2*>(s_dq + offset) =
          odd ? make_float2(dq[partner], dq[partner + 1]) : make_float2(dq[n], dq[n + 1]);
    }
    wgmma::fence_proxy_async();
    named_barrier_sync(2 + warpgroup, 128);
    if (threadIdx.x % 128 == 0) {  // rows past the sequence are clipped by the map
      tma_reduce_add_3d(map_dq, s_dq, 0, q_first, static_cast<int>(bh));
      tma_reduce_add_3d(map_dq, s_dq + 8192, 32, q_first, static_cast<int>(bh));
    }
  };
  // Every product is waited for within its step: a wgmma group left in flight across the loop's back edge
  // makes the compiler serialise all of them (measured: 25% slower). Per-warpgroup dQ partials over its
  // own keys (no block barrier) were slower too: twice the dQ reduction traffic.
  uint32_t p_frag[kBlockQ / 16][4], ds_frag[kBlockQ / 16][4];
  float st[kBlockQ / 2], dpt[kBlockQ / 2];
#pragma unroll
  for (int n = 0; n < kBlockQ / 2; ++n) st[n] = dpt[n] = 0;
  for (int i = 0; i < num_q_tiles; ++i) {
    const int stage = i % kStages, q0 = (q_begin + i) * kBlockQ;
    const uint32_t q_address = shared_address(smem + L::kQ + stage * L::kQBytes);
    const uint32_t do_address = shared_address(smem + L::kDo + stage * L::kQBytes);
    unsigned char* s_ds = smem + L::kDs + (i % 2) * L::kDsBytes;
    mbarrier_wait(&full[stage], (i / kStages) & 1);

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys: 16 columns of d per step (the first
    // step overwrites the accumulators).
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma::mma_m64n128k16_ss(st, wgmma::smem_descriptor(k_address + warpgroup * 64 * 128 + kk * 32, 0),
                               wgmma::smem_descriptor(q_address + kk * 32, 0), kk > 0 ? 1 : 0);
    }
    wgmma::commit_group();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma::mma_m64n128k16_ss(dpt, wgmma::smem_descriptor(v_address + warpgroup * 64 * 128 + kk * 32, 0),
                               wgmma::smem_descriptor(do_address + kk * 32, 0), kk > 0 ? 1 : 0);
    }
    wgmma::commit_group();

    // The scores are done (dP^T may still run).
    wgmma::wait_group<1>();
    wgmma::fence_operands(st);

    // P^T = exp2(S^T scale log2 e - L) (L per column = query), masked where needed.
    const float* lse = s_lse + stage * kBlockQ;
    const float* delta = s_delta + stage * kBlockQ;
    const bool need_mask =
        q0 + kBlockQ > seq || k0 + kBlockK > seq || (p.causal && k0 + warpgroup * 64 + 63 > q0);
#pragma unroll
    for (int n = 0; n < kBlockQ / 2; ++n) {
      const int col = (n / 4) * 8 + 2 * (lane % 4) + (n % 2);
      float prob = fast_exp2(st[n] * p.scale_log2 - lse[col]);
      if (need_mask) {
        const int query = q0 + col, key = k0 + key_row + 8 * ((n / 2) % 2);
        if (query >= seq || key >= seq || (p.causal && key > query)) prob = 0;
      }
      st[n] = prob;
    }
    // dS^T = P^T (dP^T - D).
    wgmma::wait_group<0>();
    wgmma::fence_operands(dpt);
#pragma unroll
    for (int n = 0; n < kBlockQ / 2; ++n) {
      const int col = (n / 4) * 8 + 2 * (lane % 4) + (n % 2);
      dpt[n] = st[n] * (dpt[n] - delta[col]);
    }
    pack_fragments(p_frag, st);
    pack_fragments(ds_frag, dpt);

    // dS^T into shared memory ([key][query], swizzled) for the dQ product.
#pragma unroll
    for (int kq = 0; kq < kBlockQ / 16; ++kq) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = key_row + 8 * (r % 2), col = kq * 16 + 8 * (r / 2) + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(s_ds + wgmma::swizzled_offset(row, col, kBlockK)) = ds_frag[kq][r];
      }
    }

    // dV += P^T dO and dK += dS^T Q: 16 queries per step, dO and Q ([query][d]) read transposed.
    wgmma::fence();
#pragma unroll
    for (int kq = 0; kq < kBlockQ / 16; ++kq) {
      wgmma::mma_m64n64k16_rs<1>(dv, p_frag[kq], wgmma::smem_descriptor(do_address + kq * 16 * 128, 0), 1);
      wgmma::mma_m64n64k16_rs<1>(dk, ds_frag[kq], wgmma::smem_descriptor(q_address + kq * 16 * 128, 0), 1);
    }
    wgmma::commit_group();

    wgmma::fence_proxy_async();
    if (threadIdx.x % 128 == 0) bulk_wait_read<0>();  // this warpgroup's dQ staging buffer is free
    // Both warpgroups' dS^T are written; each multiplies dQ for its half of the tile's queries.
    named_barrier_sync(1, kConsumerThreads);
    issue_dq(s_ds);
    wgmma::wait_group<0>();
    flush_dq(q0 + warpgroup * 64);
    mbarrier_arrive(&empty[stage]);  // Q, dO, L, D of this stage are no longer read
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(dk);
  wgmma::fence_operands(dv);
  if (threadIdx.x % 128 == 0) bulk_wait_all();

  // Epilogue: dK (scaled) and dV in bf16 through the K and V tiles (every warpgroup is done reading K
  // after the barrier), then 16-byte coalesced stores.
  named_barrier_sync(1, kConsumerThreads);
#pragma unroll
  for (int n = 0; n < 32; n += 2) {
    const int row = key_row + 8 * ((n / 2) % 2), col = (n / 4) * 8 + 2 * (lane % 4);
    const uint32_t offset = wgmma::swizzled_offset(row, col, kBlockK);
    *reinterpret_cast<uint32_t*>(smem + L::kK + offset) = pack_bf16(dk[n] * p.scale, dk[n + 1] * p.scale);
    *reinterpret_cast<uint32_t*>(smem + L::kV + offset) = pack_bf16(dv[n], dv[n + 1]);
  }
  named_barrier_sync(1, kConsumerThreads);
  bf16* out_k = static_cast<bf16*>(p.dk) + head_offset(p.sk, bh, p.heads) + k0 * p.sk.seq;
  bf16* out_v = static_cast<bf16*>(p.dv) + head_offset(p.sv, bh, p.heads) + k0 * p.sv.seq;
  constexpr int kChunksPerRow = kD / 8;
#pragma unroll
  for (int step = 0; step < kBlockK * kChunksPerRow / kConsumerThreads; ++step) {
    const int chunk = step * kConsumerThreads + static_cast<int>(threadIdx.x);
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (k0 + row < seq) {
      const uint32_t offset = wgmma::swizzled_offset(row, col, kBlockK);
      *reinterpret_cast<uint4*>(out_k + row * p.sk.seq + col) =
          *reinterpret_cast<const uint4*>(smem + L::kK + offset);
      *reinterpret_cast<uint4*>(out_v + row * p.sv.seq + col) =
          *reinterpret_cast<const uint4*>(smem + L::kV + offset);
    }
  }
#else
  __trap();  // an sm_90 GPU running a build without sm_90a code: fail loudly, never leave outputs unset
#endif
}

}  // namespace

bool launch_backward_hopper(const Params& params, int64_t d_head, int64_t batch_heads, cudaStream_t stream) {
  if (d_head != kD || params.kernels == AttentionKernels::mma_sync || current_device_major() != 9)
    return false;
  const int64_t batch = batch_heads / params.heads;
  CUtensorMap map_q, map_k, map_v, map_do, map_dq;
  if (!make_tensor_map(&map_q, params.q, params.sq, params, kD, batch, kBlockQ) ||
      !make_tensor_map(&map_k, params.k, params.sk, params, kD, batch, kBlockK) ||
      !make_tensor_map(&map_v, params.v, params.sv, params, kD, batch, kBlockK) ||
      !make_tensor_map(&map_do, params.d_o, params.so, params, kD, batch, kBlockQ) ||
      !make_dq_accum_map(&map_dq, params.dq_accum, params.seq, kD, batch_heads, 64)) {
    return false;
  }
  const auto kernel = flash_backward_hopper_kernel;
  allow_shared_memory(kernel, Layout::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(batch_heads), ceil_div(params.seq, kBlockK));
  kernel<<<grid, kConsumerThreads + 128, Layout::kSmemBytes, stream>>>(map_q, map_k, map_v, map_do, map_dq,
                                                                       params);
  TT_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace tt::cuda::flash
