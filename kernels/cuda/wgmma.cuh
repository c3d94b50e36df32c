// Hopper (sm_90a) warpgroup matrix multiplies, the few shapes the attention kernels and gemm_adamw.cu use.
//
// Vocabulary (PTX ISA, "asynchronous warpgroup level matrix multiply-accumulate"):
//  - A warpgroup is 4 consecutive warps (128 threads). wgmma.mma_async multiplies a 64 x 16 A tile by a
//    16 x N B tile into a 64 x N f32 accumulator spread over the warpgroup's registers: warp w holds rows
//    16w .. 16w+15 in the layout of mma.sync's m16n8 accumulator, repeated for every 8 columns, i.e.
//    acc[4j + 2i + e] is row 16w + lane/4 + 8i, column 8j + 2(lane%4) + e.
//  - B (and A, unless A comes from registers) is read straight from shared memory through a 64-bit
//    "matrix descriptor": start address, the byte distance between 8-row groups (SBO), the distance
//    between 64-element column blocks for MN-major operands (LBO), and the swizzle mode.
//  - All tiles here use the 128-byte swizzle: a tile is stored as blocks of 64 bf16 columns; in a block,
//    row r occupies the 128 bytes at r * 128 and its 16-byte chunk c sits at chunk position c ^ (r % 8).
//    Eight consecutive rows then spread over all 32 banks, and the blocks must start 1024-byte aligned.
//  - A K-major operand (the reduction dim contiguous: Q and K for S = Q K^T) advances 16 elements along
//    the reduction by moving the start address 32 bytes; the hardware applies the swizzle to the final
//    address. An MN-major operand (V for O = P V: the output dim contiguous) is read with the "transpose"
//    flag and advances 16 rows by moving 16 * 128 bytes.
//  - The multiplies run asynchronously: wgmma.fence orders earlier register writes before them,
//    commit_group closes a batch, wait_group N blocks until at most N batches are in flight. Shared memory
//    written by ordinary stores or cp.async must be published to the "async proxy" the tensor cores read
//    through (fence.proxy.async) before a barrier that precedes the multiply.
// The accumulator of S has the register layout of the A operand of the next product (16-bit A fragments
// match the accumulator of two adjacent 8-column tiles), so P feeds O = P V from registers.
#pragma once

#include <cstdint>

// The wgmma instructions exist only in the sm_90a target; other targets compile the kernels to nothing and
// the host never launches them there.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TT_HAVE_WGMMA 1
#else
#define TT_HAVE_WGMMA 0
#endif

namespace tt::cuda::wgmma {

// Descriptor of a 128-byte-swizzled bf16 tile in shared memory (start must follow the layout above).
// lead_bytes: distance between 64-column blocks (MN-major operands only); rows of 8 are 1024 bytes apart.
__device__ inline uint64_t smem_descriptor(uint32_t start_address, uint32_t lead_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((start_address & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lead_bytes & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;
  desc |= uint64_t{1} << 62;  // 128-byte swizzle
  return desc;
}

// Byte offset of element (row, col) in a 128-byte-swizzled tile of `rows` rows (bf16).
__host__ __device__ constexpr uint32_t swizzled_offset(int row, int col, int rows) {
  const int block = col / 64, chunk = (col % 64) / 8;
  return static_cast<uint32_t>(block * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16) + (col % 8) * 2);
}

__device__ inline void fence() {
#if TT_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void commit_group() {
#if TT_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ inline void wait_group() {
#if TT_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (stores, cp.async) visible to wgmma.
__device__ inline void fence_proxy_async() {
#if TT_HAVE_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Pins registers an asynchronous multiply reads or writes: an empty asm that "modifies" them, which the
// compiler may not move across the neighbouring fence / wait asms. Call it on accumulators after a
// wait_group, before they are read, and on them before they are handed to the next multiply.
template <int N>
__device__ inline void fence_operands(float (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(regs[i])::"memory");
}

// d (64 x 128, f32) = (accumulate ? d : 0) + A (64 x 16, K-major, shared) * B (16 x 128, K-major, shared).
__device__ inline void mma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if TT_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}

// d (64 x 64, f32) = (accumulate ? d : 0) + A (64 x 16) * B (16 x 64), both in shared memory; TransA /
// TransB = 1 reads that operand MN-major ("transposed"), 0 K-major.
template <int TransA, int TransB>
__device__ inline void mma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if TT_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TransA), "n"(TransB));
#endif
}

// d (64 x 64, f32) = (accumulate ? d : 0) + A (64 x 16, bf16 registers, 4 per thread) * B (16 x 64,
// shared); TransB = 1 reads B MN-major ("transposed"), 0 K-major.
template <int TransB>
__device__ inline void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                        int accumulate) {
#if TT_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TransB));
#endif
}

// Registers per thread: a warpgroup whose role needs fewer (a producer) gives them back, one that needs
// more takes them; every warp of the warpgroup must execute it. The counts must fit the block's total.
template <int N>
__device__ inline void release_registers() {
#if TT_HAVE_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ inline void claim_registers() {
#if TT_HAVE_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace tt::cuda::wgmma
