// Hopper (sm_90a) synchronisation and bulk-copy primitives shared by the wgmma kernels (attention and
// gemm_adamw.cu), and the host helpers that decide whether those kernels can run.
//
//  - Named barriers (bar.sync / bar.arrive with an id and a thread count) synchronise a subset of a block,
//    e.g. the consumer warpgroups without the producer warp; id 0 is __syncthreads.
//  - An mbarrier is a 64-bit shared-memory barrier with a phase bit: a phase completes when `count`
//    threads have arrived and every byte announced by arrive.expect_tx has landed. Waiters name the phase
//    by its parity (0 for the first completion, 1 for the second, and so on).
//  - TMA (cp.async.bulk.tensor) copies a box of a tensor described by a CUtensorMap (made on the host)
//    into shared memory, applying the 128-byte swizzle, zero-filling what lies outside the tensor, and
//    signals an mbarrier with the byte count.
//  - cp.reduce.async.bulk.tensor adds a box of shared memory, laid out as the tensor map says (128-byte
//    swizzle included), into global memory (f32 add), one instruction for a whole tile instead of an
//    atomic per element; bulk groups (per thread) say when the shared memory has been read.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tt::cuda::flash {

#if TT_HAVE_WGMMA

__device__ inline void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ inline void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ inline void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
// Makes initialised mbarriers visible to the other threads and to the TMA unit (then __syncthreads).
__device__ inline void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
__device__ inline void mbarrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}

// An L2 cache policy for loads whose lines should outlive streamed ones (evict_last), for tma_load_hinted.
__device__ inline uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// tma_load with an L2 cache policy (l2_evict_last_policy).
__device__ inline void tma_load_hinted(void* smem, const CUtensorMap& map, int col, int row, int head,
                                       int batch, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(shared_address(smem)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(col), "r"(row), "r"(head), "r"(batch),
      "r"(shared_address(bar)), "l"(policy)
      : "memory");
}
// One TMA copy of the box at (col, row, head, batch) of a 4-d (d, seq, head, batch) tensor map.
__device__ inline void tma_load(void* smem, const CUtensorMap& map, int col, int row, int head, int batch,
                                uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4, %5}], [%6];\n" ::"r"(shared_address(smem)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(col), "r"(row), "r"(head), "r"(batch),
      "r"(shared_address(bar))
      : "memory");
}

// Adds a shared-memory box (laid out as `map` describes it, swizzle included) to the box of
// the f32 tensor at (col, row, plane), clipped at the tensor's edges, then closes a bulk group;
// bulk_wait_read<N> waits until at most N groups still read their shared memory.
__device__ inline void tma_reduce_add_3d(const CUtensorMap& map, const void* smem, int col, int row,
                                         int plane) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::
          "l"(reinterpret_cast<uint64_t>(&map)),
      "r"(col), "r"(row), "r"(plane), "r"(shared_address(smem))
      : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ inline void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

#endif  // TT_HAVE_WGMMA

// Host side (flash_attention_fwd_hopper.cu). A 4-d (d, seq, head, batch) bf16 tensor map over one of Q, K, V,
// O, dO with boxes of 64 columns x `rows` rows, 128-byte swizzle. False when the driver cannot describe it
// (the caller falls back).
bool make_tensor_map(CUtensorMap* map, const void* base, const AttentionStrides& s, const Params& p,
                     int64_t d_head, int64_t batch, uint32_t rows);
// A bf16 matrix of `rows` rows of `cols` elements, rows `row_stride` elements apart, as a 4-d map (cols,
// rows, 1, 1) for tma_load, with boxes of 64 columns x `box_rows` rows.
bool make_matrix_map(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t row_stride,
                     uint32_t box_rows);
// A 3-d (d, seq, batch*head) map over the backward's contiguous f32 dQ accumulator, boxes of 32 columns (128
// bytes, the widest a 128-byte swizzle allows) x `rows` rows.
bool make_dq_accum_map(CUtensorMap* map, float* base, int64_t seq, int64_t d_head, int64_t batch_heads,
                       uint32_t rows);

}  // namespace tt::cuda::flash
