// A linear layer's weight gradient with the AdamW update of that weight in the epilogue (Hopper, sm_90a).
//
// For y = x W^T the weight gradient is dW = dY^T X, with dY (tokens, out) and X (tokens, in) in bf16. A step
// that updates each weight as soon as backward has its gradient (optim/update_in_backward.h) would write dW
// to memory, read it back in AdamW and zero it for the next step: 6 bytes per parameter on top of the 26
// AdamW itself moves (f32 parameter and moments read and written, bf16 copy written). Here dW never leaves
// the chip: each 128 x 128 tile of it is handed
// through shared memory to warps that read the tile's parameters and moments, update them exactly as adamw.cu
// does (same rounding, adamw.cuh) and write them back.
//
// The update moves ~26 bytes per element and the product costs ~2 * tokens flops per element, so at 1024
// tokens the tile's memory traffic takes about three times as long as its product. The kernel is built so
// that memory never waits for the product:
//  - Persistent: one block per SM walks over the tiles (blockIdx.x, + gridDim.x, ...).
//  - Warpgroups 0 and 1 compute the product, 64 weight rows each (wgmma, both operands "MN-major": the token,
//    i.e. reduction, index is the slow one in memory, read with the transpose flags). Thread 0 also feeds
//    them: per stage of 64 tokens the Tensor Memory Accelerator (hopper.cuh) copies four 64 x 64 boxes (the
//    two column halves of dY's tile and of X's) into shared memory with the 128-byte swizzle, rows past
//    the token count zero-filled; three stages, a stage refilled once all eight product warps have signalled
//    (an mbarrier) that their products reading it are complete.
//  - When a tile's product is complete, the product warps store it into a staging buffer (rows padded to
//    136 floats: the accumulator layout's 8-byte stores of a half-warp then hit 32 distinct banks) and go
//    on with the next tile.
//  - Warpgroups 2 and 3 update: per pass, each warp takes one row of the staged tile, 16 bytes a lane, so
//    every global load and store is a whole 512-byte run; eight passes' loads are in flight
//    before the first is used. They release the staging buffer when the tile is done, which the product
//    warps wait for before staging the next one.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tt::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBlockM = 128;  // weight rows (output features) per tile: 64 per product warpgroup
constexpr int kBlockK = 64;   // tokens per stage
constexpr int kStages = 3;
constexpr int kProductThreads = 256, kUpdateThreads = 256, kThreads = kProductThreads + kUpdateThreads;
constexpr int kBatchPasses = 8;                   // passes whose loads an update thread issues together
constexpr uint32_t kBoxBytes = 64 * kBlockK * 2;  // one TMA box: 64 columns x 64 token rows of bf16
constexpr int kBarriers = 2 * kStages + 2;

// The shape of a tile: kBlockM x N.
struct Tile {
  static constexpr int N = 128;
  static constexpr int kHalves = N / 64;  // 64-column swizzle blocks of X per stage
  static constexpr int kPitch = N + 8;    // staged row, floats (bank-conflict padding)
  static constexpr uint32_t kStageBytes = (2 + kHalves) * kBoxBytes;  // dY's two column halves, then X's
  static constexpr uint32_t kStagingBytes = kBlockM * kPitch * 4;
  static constexpr size_t kSmemBytes =
      kStages * kStageBytes + kStagingBytes + kBarriers * sizeof(uint64_t) + 1024;
  static constexpr int kLanesPerRow = N / 4;              // 4 columns a lane
  static constexpr int kRowsPerWarp = 32 / kLanesPerRow;  // rows a warp updates per pass
  static constexpr int kRowsPerPass = (kUpdateThreads / 32) * kRowsPerWarp;
  static constexpr int kBatches = kBlockM / (kRowsPerPass * kBatchPasses);
  static_assert(kBatches * kRowsPerPass * kBatchPasses == kBlockM, "whole batches per tile");
};

struct Args {
  float* param;    // W, (out, in) row-major
  float* exp_avg;  // its moments, same layout
  float* exp_avg_sq;
  bf16* bf16_copy;  // nullable: W rounded to bf16, same layout
  int64_t out, in;
  int tokens, tiles_n, tiles;
  const float* step_factors;
  AdamWFactors f;
  int round_grad_bf16;  // the gradient rounded to bf16 first, as a bf16 gradient buffer would hold it
};

#if TT_HAVE_WGMMA

// The first weight row and column of tile `tile`: consecutive tiles (side by side on the SMs) step along the
// weight's columns, sharing dY's columns.
__device__ inline void tile_origin(const Args& a, int tile, int64_t& m0, int64_t& n0) {
  m0 = static_cast<int64_t>(tile / a.tiles_n) * kBlockM;
  n0 = static_cast<int64_t>(tile % a.tiles_n) * Tile::N;
}

// The product warpgroups: the tiles' products, staged one after another.
__device__ void compute_products(const CUtensorMap& map_dy, const CUtensorMap& map_x, const Args& a,
                                 unsigned char* smem, float* staging, uint64_t* full, uint64_t* empty,
                                 uint64_t* staged, uint64_t* freed) {
  using namespace flash;
  using T = Tile;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, warpgroup = tid / 128;
  const int k_tiles = (a.tokens + kBlockK - 1) / kBlockK;
  const int my_tiles = (a.tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                       static_cast<int>(gridDim.x);
  const int total = my_tiles * k_tiles;  // stage loads of this block, numbered g = tile * k_tiles + t
  auto load = [&](int g) {
    const int tile = static_cast<int>(blockIdx.x) + (g / k_tiles) * static_cast<int>(gridDim.x);
    int64_t m0, n0;
    tile_origin(a, tile, m0, n0);
    const int s = g % kStages, row = g % k_tiles * kBlockK, m = static_cast<int>(m0),
              n = static_cast<int>(n0);
    unsigned char* stage = smem + s * T::kStageBytes;
    mbarrier_arrive_expect_bytes(&full[s], T::kStageBytes);  // zero-filled bytes count too
    tma_load(stage, map_dy, m, row, 0, 0, &full[s]);
    tma_load(stage + kBoxBytes, map_dy, m + 64, row, 0, 0, &full[s]);
#pragma unroll
    for (int h = 0; h < T::kHalves; ++h)
      tma_load(stage + (2 + h) * kBoxBytes, map_x, n + 64 * h, row, 0, 0, &full[s]);
  };
  // The stage of load g is read: thread 0 refills it with load g + kStages once every product warp is done.
  auto release = [&](int g) {
    if (lane == 0) mbarrier_arrive(&empty[g % kStages]);
    if (tid == 0 && g + kStages < total) {
      mbarrier_wait(&empty[g % kStages], static_cast<uint32_t>(g / kStages) & 1);
      load(g + kStages);
    }
  };
  if (tid == 0) {
    for (int g = 0; g < kStages && g < total; ++g) load(g);
  }
  float acc[T::kHalves][32];  // the warpgroup's 64 rows x (64-column halves)
  for (int it = 0; it < my_tiles; ++it) {
    for (int t = 0; t < k_tiles; ++t) {
      const int g = it * k_tiles + t, s = g % kStages;
      mbarrier_wait(&full[s], static_cast<uint32_t>(g / kStages) & 1);
      const uint32_t stage = shared_address(smem + s * T::kStageBytes);
      const uint32_t a_base = stage + warpgroup * kBoxBytes, b_base = stage + 2 * kBoxBytes;
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        // 16 token rows further: 16 rows of 128 bytes in both MN-major operands.
        const uint64_t desc_a = wgmma::smem_descriptor(a_base + kk * 16 * 128, 0);
        const int accumulate = (t > 0 || kk > 0) ? 1 : 0;
#pragma unroll
        for (int h = 0; h < T::kHalves; ++h) {
          wgmma::mma_m64n64k16_ss<1, 1>(
              acc[h], desc_a, wgmma::smem_descriptor(b_base + h * kBoxBytes + kk * 16 * 128, 0), accumulate);
        }
      }
      wgmma::commit_group();
      wgmma::wait_group<1>();  // the products of load g - 1 are complete
      if (t > 0) release(g - 1);
    }
    wgmma::wait_group<0>();
#pragma unroll
    for (int h = 0; h < T::kHalves; ++h) wgmma::fence_operands(acc[h]);
    release(it * k_tiles + k_tiles - 1);
    // Stage the tile once the update warps are done with the previous one.
    if (it > 0) mbarrier_wait(freed, static_cast<uint32_t>(it - 1) & 1);
    const int row = 64 * warpgroup + 16 * (warp % 4) + lane / 4, col = 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < T::kHalves; ++h) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          *reinterpret_cast<float2*>(staging + (row + 8 * i) * T::kPitch + 64 * h + 8 * j + col) =
              make_float2(acc[h][4 * j + 2 * i], acc[h][4 * j + 2 * i + 1]);
        }
      }
    }
    mbarrier_arrive(staged);
  }
}

// The update warpgroups: AdamW on each staged tile, a batch of kBatchPasses rows per thread at a time, all
// of whose loads are issued before the first is used.
__device__ void update_tiles(const Args& a, const float* staging, uint64_t* staged, uint64_t* freed) {
  using namespace flash;
  using T = Tile;
  const int u = static_cast<int>(threadIdx.x) - kProductThreads;  // 0 .. 255
  const int lane = u % 32;
  const int first_row = (u / 32) * T::kRowsPerWarp + lane / T::kLanesPerRow;
  const int col = 4 * (lane % T::kLanesPerRow);
  AdamWFactors f = a.f;
  adamw_load_step_factors(f, a.step_factors);
  int it = 0;
  for (int tile = static_cast<int>(blockIdx.x); tile < a.tiles; tile += static_cast<int>(gridDim.x), ++it) {
    int64_t m0, n0;
    tile_origin(a, tile, m0, n0);
    const bool col_ok = n0 + col < a.in;  // in is a multiple of 4: a lane's 4 columns are wholly in or out
    mbarrier_wait(staged, static_cast<uint32_t>(it) & 1);
#pragma unroll 1
    for (int batch = 0; batch < T::kBatches; ++batch) {
      float4 p[kBatchPasses], m[kBatchPasses], v[kBatchPasses];
#pragma unroll
      for (int r = 0; r < kBatchPasses; ++r) {
        const int row = (batch * kBatchPasses + r) * T::kRowsPerPass + first_row;
        if (col_ok && m0 + row < a.out) {
          const int64_t at = (m0 + row) * a.in + n0 + col;
          p[r] = __ldcs(reinterpret_cast<const float4*>(a.param + at));
          m[r] = __ldcs(reinterpret_cast<const float4*>(a.exp_avg + at));
          v[r] = __ldcs(reinterpret_cast<const float4*>(a.exp_avg_sq + at));
        }
      }
#pragma unroll
      for (int r = 0; r < kBatchPasses; ++r) {
        const int row = (batch * kBatchPasses + r) * T::kRowsPerPass + first_row;
        if (!col_ok || m0 + row >= a.out) continue;
        float4 g = *reinterpret_cast<const float4*>(staging + row * T::kPitch + col);
        if (a.round_grad_bf16) {
          g.x = __bfloat162float(__float2bfloat16_rn(g.x));
          g.y = __bfloat162float(__float2bfloat16_rn(g.y));
          g.z = __bfloat162float(__float2bfloat16_rn(g.z));
          g.w = __bfloat162float(__float2bfloat16_rn(g.w));
        }
        adamw_update(p[r].x, g.x, m[r].x, v[r].x, f);
        adamw_update(p[r].y, g.y, m[r].y, v[r].y, f);
        adamw_update(p[r].z, g.z, m[r].z, v[r].z, f);
        adamw_update(p[r].w, g.w, m[r].w, v[r].w, f);
        const int64_t at = (m0 + row) * a.in + n0 + col;
        __stcs(reinterpret_cast<float4*>(a.param + at), p[r]);
        __stcs(reinterpret_cast<float4*>(a.exp_avg + at), m[r]);
        __stcs(reinterpret_cast<float4*>(a.exp_avg_sq + at), v[r]);
        if (a.bf16_copy != nullptr) {
          const __nv_bfloat162 low[2] = {__floats2bfloat162_rn(p[r].x, p[r].y),
                                         __floats2bfloat162_rn(p[r].z, p[r].w)};
          *reinterpret_cast<uint2*>(a.bf16_copy + at) = *reinterpret_cast<const uint2*>(low);
        }
      }
    }
    mbarrier_arrive(freed);
  }
}

#endif  // TT_HAVE_WGMMA

__global__ void __launch_bounds__(kThreads, 1)
    gemm_adamw_kernel(const __grid_constant__ CUtensorMap map_dy, const __grid_constant__ CUtensorMap map_x,
                      Args a) {
#if TT_HAVE_WGMMA
  using namespace flash;
  using T = Tile;
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = raw + (1024 - shared_address(raw) % 1024) % 1024;  // swizzled tiles: 1024-aligned
  float* staging = reinterpret_cast<float*>(smem + kStages * T::kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * T::kStageBytes + T::kStagingBytes);
  uint64_t* empty = full + kStages;
  uint64_t* staged = empty + kStages;
  uint64_t* freed = staged + 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kProductThreads / 32);  // lane 0 of every product warp
    }
    mbarrier_init(staged, kProductThreads);
    mbarrier_init(freed, kUpdateThreads);
    mbarrier_init_fence();
  }
  __syncthreads();
  // 128 registers a thread at launch; the update threads, with eight passes of loads in flight, need more
  // than the product threads, whose accumulators take 64.
  if (threadIdx.x < kProductThreads) {
    wgmma::release_registers<104>();
    compute_products(map_dy, map_x, a, smem, staging, full, empty, staged, freed);
  } else {
    wgmma::claim_registers<152>();
    update_tiles(a, staging, staged, freed);
  }
#else
  __trap();  // an sm_90 GPU running a build without sm_90a code: fail loudly, never leave a weight stale
#endif
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

bool gemm_adamw(const void* dy, int64_t ld_dy, const void* x, int64_t ld_x, int64_t out, int64_t in,
                int64_t tokens, float* param, float* exp_avg, float* exp_avg_sq, void* bf16_copy,
                bool round_grad_bf16, const float* device_factors, double beta1, double beta2, double eps,
                cudaStream_t stream) {
  // The tensor maps need 16-byte aligned rows; the update reads and writes the weight's rows 16 bytes at a
  // time (4 floats, so in % 4 == 0, implied).
  const bool fits =
      out >= 1 && in >= 1 && tokens >= 1 && in % 8 == 0 && ld_dy % 8 == 0 && ld_x % 8 == 0 && ld_dy >= out &&
      ld_x >= in && ceil_div(out, kBlockM) * ceil_div(in, Tile::N) < (int64_t{1} << 31) &&
      tokens < (int64_t{1} << 24) && aligned(dy, 16) && aligned(x, 16) && aligned(param, 16) &&
      aligned(exp_avg, 16) && aligned(exp_avg_sq, 16) && (bf16_copy == nullptr || aligned(bf16_copy, 8));
  if (!fits || current_device_major() != 9) return false;
  CUtensorMap map_dy, map_x;
  if (!flash::make_matrix_map(&map_dy, dy, out, tokens, ld_dy, kBlockK) ||
      !flash::make_matrix_map(&map_x, x, in, tokens, ld_x, kBlockK)) {
    return false;
  }
  Args a{};
  a.param = param;
  a.exp_avg = exp_avg;
  a.exp_avg_sq = exp_avg_sq;
  a.bf16_copy = static_cast<bf16*>(bf16_copy);
  a.out = out;
  a.in = in;
  a.tokens = static_cast<int>(tokens);
  a.step_factors = device_factors;
  a.f = adamw_constant_factors(beta1, beta2, eps);
  a.round_grad_bf16 = round_grad_bf16 ? 1 : 0;
  a.tiles_n = static_cast<int>(ceil_div(in, Tile::N));
  a.tiles = static_cast<int>(ceil_div(out, kBlockM)) * a.tiles_n;
  int device = 0, sms = 0;
  TT_CUDA_CHECK(cudaGetDevice(&device));
  TT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  flash::allow_shared_memory(gemm_adamw_kernel, Tile::kSmemBytes);
  const auto blocks = static_cast<unsigned>(std::min(a.tiles, sms));  // persistent: one per SM
  gemm_adamw_kernel<<<blocks, kThreads, Tile::kSmemBytes, stream>>>(map_dy, map_x, a);
  TT_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace tt::cuda
