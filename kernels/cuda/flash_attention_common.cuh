// Shared pieces of the FlashAttention-2 CUDA kernels: the kernel parameter block, the run-time choice of
// head dim and path, and thin wrappers over the warp-level tensor-core instructions the bf16 kernels use.
//
// Tensor-core vocabulary used by the fast kernels (PTX ISA, "warp-level matrix fragments"):
//  - mma.sync.m16n8k16 (bf16 in, f32 accumulate): one warp multiplies a 16x16 A tile by a 16x8 B tile.
//    Lane l holds accumulator elements of rows l/4 and l/4 + 8, columns 2*(l%4) and 2*(l%4) + 1.
//  - ldmatrix.x4 loads four 8x8 bf16 matrices from shared memory straight into that fragment layout (each
//    lane names one 16-byte row); .trans delivers the transpose, which turns a row-major [key][d] tile into
//    the "k-major" B operand needed for P V without any shuffling.
//  - the accumulator of S = Q K^T for two adjacent 8-column tiles has exactly the layout of an A operand of
//    the next product, so P goes from S to P V in registers (converted to bf16), never through memory.
//  - cp.async copies global -> shared without passing through registers, so the next tile streams in while
//    the current one is multiplied (double buffering); rows past the sequence end are zero-filled.
// Shared-memory tiles are padded by 8 elements (16 bytes) per row: d_head/8 + 1 is odd for every supported
// head dim, so the eight 16-byte rows one ldmatrix phase reads fall into eight different bank groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/flash_attention.h"

namespace tt::cuda::flash {

// Everything a forward or backward kernel needs, passed by value. Pointers the direction does not use
// stay null. Strides are in elements; every tensor has a contiguous last dim.
struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;  // written by the forward, read by the backward
  const void* d_o = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* lse = nullptr;       // (batch*heads, seq), natural log
  float* delta = nullptr;     // backward scratch: rowsum(dO * O), (batch*heads, seq)
  float* lse_log2 = nullptr;  // backward scratch for the fast kernel: L * log2(e), (batch*heads, seq)
  float* dq_accum = nullptr;  // backward scratch: unscaled dQ in f32, (batch*heads, seq, d_head)
  AttentionStrides sq, sk, sv, so;
  int64_t seq = 0, heads = 0;
  float scale = 0, scale_log2 = 0;  // scale and scale * log2(e) (the fast kernels use exp2)
  bool causal = true;
  AttentionKernels kernels = AttentionKernels::automatic;  // read on the host only
};

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Element offset of row 0 of one (batch, head) slice.
__host__ __device__ inline int64_t head_offset(const AttentionStrides& s, int64_t bh, int64_t heads) {
  return (bh / heads) * s.batch + (bh % heads) * s.head;
}

__host__ __device__ constexpr int ceil_div(int64_t a, int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

// The (batch*head) pair and tile rank a block of a (pairs, tiles) grid works on; rank 0 is the tile with
// the most work (a causal kernel maps ranks to tiles). Blocks start roughly in launch order, x fastest.
// One rank over every pair before the next (the longest causal tiles first) would scatter a pair's tiles
// over the whole launch, each reading the pair's K and V (or Q and dO) from DRAM again (docs/attention.md:
// at T 1024 that kept DRAM 65-72% busy). So pairs go in chunks whose shared data (`bytes_per_pair` each)
// fits in 8 MiB of L2, every rank of a chunk before the next chunk, longest first.
__device__ inline void block_tile(int64_t bytes_per_pair, int64_t& pair, int& rank) {
  constexpr int64_t kChunkBytes = int64_t{8} << 20;
  const int64_t pairs = gridDim.x, tiles = gridDim.y;
  const int64_t chunk = max(int64_t{1}, kChunkBytes / max(int64_t{1}, bytes_per_pair));
  const int64_t linear = blockIdx.x + pairs * blockIdx.y;
  const int64_t first = linear / (chunk * tiles) * chunk;  // the chunk's first pair
  const int64_t in_chunk = min(chunk, pairs - first);
  const int64_t within = linear - first * tiles;
  pair = first + within % in_chunk;
  rank = static_cast<int>(within / in_chunk);
}

// What every key tile of a pair reads in the backward: Q and dO (bf16), the f32 dQ accumulator, L and D.
__host__ __device__ constexpr int64_t backward_bytes_per_pair(int64_t seq, int64_t d_head) {
  return seq * (8 * d_head + 8);
}

// ---- Host-side dispatch ----------------------------------------------------------------------------------

// Calls fn(std::integral_constant<int, D>{}) for the supported head dims; anything else is a user error.
template <class Fn>
void dispatch_head_dim(int64_t d_head, Fn&& fn) {
  switch (d_head) {
    case 16:
      fn(std::integral_constant<int, 16>{});
      return;
    case 32:
      fn(std::integral_constant<int, 32>{});
      return;
    case 64:
      fn(std::integral_constant<int, 64>{});
      return;
    case 80:
      fn(std::integral_constant<int, 80>{});
      return;
    case 96:
      fn(std::integral_constant<int, 96>{});
      return;
    case 128:
      fn(std::integral_constant<int, 128>{});
      return;
    default:
      throw Error("flash_attention: d_head must be one of 16, 32, 64, 80, 96, 128 (got " +
                  std::to_string(d_head) + ")");
  }
}

inline void check_problem(const AttentionProblem& p, DType dtype) {
  TT_ASSERT(dtype == DType::f32 || dtype == DType::bf16,
            std::string("flash_attention (cuda): dtype must be f32 or bf16, got ") + dtype_name(dtype));
  TT_CHECK(p.batch >= 1 && p.heads >= 1 && p.seq >= 1,
           "flash_attention: batch, heads and seq must be positive");
  TT_CHECK(p.batch * p.heads <= 65535, "flash_attention (cuda): batch * heads must be at most 65535");
  // The tensor-core kernels number their tiles of 64 or more along the grid's y dimension.
  TT_CHECK(p.seq <= int64_t{65535} * 64, "flash_attention (cuda): seq must be at most 4194240");
}

// The tensor-core kernels move 16-byte chunks: every row start must be 16-byte aligned.
inline bool rows_aligned_16(const void* base, const AttentionStrides& s) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && s.batch % 8 == 0 && s.head % 8 == 0 && s.seq % 8 == 0;
}

inline Params make_params(const AttentionProblem& p) {
  Params params;
  params.sq = p.q;
  params.sk = p.k;
  params.sv = p.v;
  params.so = p.o;
  params.seq = p.seq;
  params.heads = p.heads;
  params.scale = p.scale;
  params.scale_log2 = p.scale * kLog2e;
  params.causal = p.causal;
  params.kernels = p.kernels;
  return params;
}

// Kernels with more than 48 KB of dynamic shared memory must opt in per function.
template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    TT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

// The Hopper (wgmma) bf16 forward, flash_attention_fwd_hopper.cu: launches it and returns true when the
// device is sm_90, d_head is 64 or 128 and params.kernels is not mma_sync; otherwise returns false.
bool launch_forward_hopper(const Params& params, int64_t d_head, int64_t batch_heads, cudaStream_t stream);
// The Hopper bf16 backward main kernel, flash_attention_bwd_hopper.cu (d_head 64, sm_90, params.kernels not
// mma_sync): adds unscaled dQ into params.dq_accum and writes dK, dV; returns false when it does not apply.
bool launch_backward_hopper(const Params& params, int64_t d_head, int64_t batch_heads, cudaStream_t stream);

// ---- Warp-level tensor-core and async-copy wrappers (sm_80+) ---------------------------------------------

__device__ inline uint32_t shared_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte global -> shared copy; when !valid nothing is read and the destination is zero-filled.
__device__ inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes));
}

// 4-byte variant for per-row scalars (L, D), which are not 16-byte aligned in general.
__device__ inline void cp_async_4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes));
}

__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ inline void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem)));
}
__device__ inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(smem)));
}

// c += a * b for one 16x8x16 tile: a = 4 registers of bf16 pairs, b = 2, c = 4 floats.
__device__ inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x in one MUFU instruction. Flushing denormal results to zero is harmless here: the arguments are
// scores minus their row max, and anything below 2^-126 is nothing next to the row's largest term (1).
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> one register of two bf16 (lo in the low half), the operand format of mma.
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Cooperative copy of a ROWS x D bf16 tile (global rows `row_stride` elements apart) into shared memory
// with padded rows of D + 8; rows at or past valid_rows are zero-filled so that they contribute nothing.
template <int ROWS, int D, int THREADS>
__device__ inline void load_tile_async(__nv_bfloat16* smem, const __nv_bfloat16* gmem, int64_t row_stride,
                                       int valid_rows) {
  constexpr int kChunksPerRow = D / 8;
  for (int chunk = threadIdx.x; chunk < ROWS * kChunksPerRow; chunk += THREADS) {
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    cp_async_16(smem + row * (D + 8) + col, gmem + (valid ? row * row_stride + col : 0), valid);
  }
}

// The reverse: a ROWS x D tile from padded shared memory to global memory, 16 bytes per thread and step.
template <int ROWS, int D, int THREADS>
__device__ inline void store_tile(__nv_bfloat16* gmem, int64_t row_stride, const __nv_bfloat16* smem,
                                  int valid_rows) {
  constexpr int kChunksPerRow = D / 8;
  for (int chunk = threadIdx.x; chunk < ROWS * kChunksPerRow; chunk += THREADS) {
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(smem + row * (D + 8) + col);
    }
  }
}

}  // namespace tt::cuda::flash
