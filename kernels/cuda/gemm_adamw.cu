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
//  - Persistent: one block per SM walks over the tiles (blockIdx.x, + gridDim.x, ...). One launch takes a
//    group of weights (up to kGemmAdamwMaxProblems) whose tiles are numbered one after the other, so the
//    last, partly filled round of tiles and the first tile's product, which no update overlaps, are paid
//    once per group instead of once per weight (a 2560 x 2560 weight alone is 400 tiles: 3 rounds on an
//    H100's 132 SMs and a fourth for 4 tiles).
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
#include <string>

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tt::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBlockK = 64;  // tokens per stage
constexpr int kStages = 3;
constexpr int kProductThreads = 256;
constexpr uint32_t kBoxBytes = 64 * kBlockK * 2;  // one TMA box: 64 columns x 64 token rows of bf16
constexpr int kBarriers = 2 * kStages + 2;

// The tile: M weight rows x N columns; each product warpgroup takes 64 of its rows.
struct Tile {
  static constexpr int M = 128, N = 128;
  static constexpr int kDyBoxes = M / 64, kXBoxes = N / 64;  // 64-column swizzle blocks per stage
  static constexpr int kPitch = N + 8;                       // staged row, floats (bank-conflict padding)
  static constexpr uint32_t kStageBytes = (kDyBoxes + kXBoxes) * kBoxBytes;  // dY's boxes, then X's
  static constexpr uint32_t kStagingBytes = M * kPitch * 4;
  static constexpr size_t kSmemBytes =
      kStages * kStageBytes + kStagingBytes + kBarriers * sizeof(uint64_t) + 1024;
};

// The update warps: kUpdateThreads of them, 4 columns a thread, each issuing the loads of kPasses rows
// together (all a thread's registers allow).
constexpr int kUpdateThreads = 256, kBlockThreads = kProductThreads + kUpdateThreads;
constexpr int kPasses = 8;
constexpr int kRowsPerPass = kUpdateThreads * 4 / Tile::N;
constexpr int kBatches = Tile::M / (kRowsPerPass * kPasses);
static_assert(kBatches * kRowsPerPass * kPasses == Tile::M, "whole batches per tile");

// One weight of the group; its tiles are numbers first_tile .. first_tile + tiles_m * tiles_n - 1.
struct Problem {
  float* param;    // W, (out, in) row-major
  float* exp_avg;  // its moments, same layout
  float* exp_avg_sq;
  bf16* bf16_copy;  // nullable: W rounded to bf16, same layout
  int64_t out, in;
  int tiles_m, tiles_n, first_tile;
  bool along_rows;  // consecutive tiles step down the weight's rows instead of along its columns
};

struct Params {
  CUtensorMap map_dy[kGemmAdamwMaxProblems];  // per weight: dY (tokens, out) and X (tokens, in)
  CUtensorMap map_x[kGemmAdamwMaxProblems];
  Problem problem[kGemmAdamwMaxProblems];
  int problems, tokens, tiles;  // tiles: of all weights together
  const float* step_factors;
  AdamWFactors f;
  int round_grad_bf16;  // the gradient rounded to bf16 first, as a bf16 gradient buffer would hold it
};
// Passed by value as the kernel's parameter: over the 4 KB of older toolkits, within the 32 KB that CUDA 12.1
// and later allow.
static_assert(sizeof(Params) <= 32764, "gemm_adamw's parameters exceed the kernel parameter limit");

#if TT_HAVE_WGMMA

// Where tile number `tile` lies: its weight, and its first row and column there. Consecutive tiles (side by
// side on the SMs) step along the weight's columns, sharing dY's columns, or down its rows, sharing X's.
struct TileAt {
  int problem;
  int64_t m0, n0;
};
// `from`: a weight at or before the tile's (a block's tiles only move forward through the group).
__device__ inline TileAt locate(const Params& p, int tile, int from) {
  int q = from;
  while (q + 1 < p.problems && tile >= p.problem[q + 1].first_tile) ++q;
  const Problem& w = p.problem[q];
  const int local = tile - w.first_tile;
  const int tm = w.along_rows ? local % w.tiles_m : local / w.tiles_n;
  const int tn = w.along_rows ? local / w.tiles_m : local % w.tiles_n;
  return {q, static_cast<int64_t>(tm) * Tile::M, static_cast<int64_t>(tn) * Tile::N};
}

// The product warpgroups: the tiles' products, staged one after another.
__device__ void compute_products(const Params& a, unsigned char* smem, float* staging, uint64_t* full,
                                 uint64_t* empty, uint64_t* staged, uint64_t* freed) {
  using namespace flash;
  using T = Tile;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, warpgroup = tid / 128;
  const int k_tiles = (a.tokens + kBlockK - 1) / kBlockK;
  const int my_tiles = (a.tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                       static_cast<int>(gridDim.x);
  const int total = my_tiles * k_tiles;  // stage loads of this block, numbered g = tile * k_tiles + t
  const uint64_t policy = l2_evict_last_policy();
  // Where the tile being loaded lies, found once per tile, not once per stage: the loads
  // of every stage wait for it.
  int located = -1;
  TileAt at{};
  auto load = [&](int g) {
    const int tile = static_cast<int>(blockIdx.x) + (g / k_tiles) * static_cast<int>(gridDim.x);
    if (tile != located) {
      at = locate(a, tile, at.problem);
      located = tile;
    }
    const CUtensorMap &map_dy = a.map_dy[at.problem], &map_x = a.map_x[at.problem];
    const int s = g % kStages, row = g % k_tiles * kBlockK, m = static_cast<int>(at.m0),
              n = static_cast<int>(at.n0);
    unsigned char* stage = smem + s * T::kStageBytes;
    mbarrier_arrive_expect_bytes(&full[s], T::kStageBytes);  // zero-filled bytes count too
    // dY and X are read again by the tiles beside this one (in this round of tiles and the next); each round
    // streams more parameter and moment bytes through L2 than it holds, so they are kept with evict_last.
#pragma unroll
    for (int d = 0; d < T::kDyBoxes; ++d)
      tma_load_hinted(stage + d * kBoxBytes, map_dy, m + 64 * d, row, 0, 0, &full[s], policy);
#pragma unroll
    for (int h = 0; h < T::kXBoxes; ++h)
      tma_load_hinted(stage + (T::kDyBoxes + h) * kBoxBytes, map_x, n + 64 * h, row, 0, 0, &full[s], policy);
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
  float acc[T::kXBoxes][32];  // the warpgroup's 64 rows x (64-column halves)
  for (int it = 0; it < my_tiles; ++it) {
    for (int t = 0; t < k_tiles; ++t) {
      const int g = it * k_tiles + t, s = g % kStages;
      mbarrier_wait(&full[s], static_cast<uint32_t>(g / kStages) & 1);
      const uint32_t stage = shared_address(smem + s * T::kStageBytes);
      const uint32_t a_base = stage + warpgroup * kBoxBytes, b_base = stage + T::kDyBoxes * kBoxBytes;
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        // 16 token rows further: 16 rows of 128 bytes in both MN-major operands.
        const uint64_t desc_a = wgmma::smem_descriptor(a_base + kk * 16 * 128, 0);
        const int accumulate = (t > 0 || kk > 0) ? 1 : 0;
#pragma unroll
        for (int h = 0; h < T::kXBoxes; ++h) {
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
    for (int h = 0; h < T::kXBoxes; ++h) wgmma::fence_operands(acc[h]);
    release(it * k_tiles + k_tiles - 1);
    // Stage the tile once the update warps are done with the previous one.
    if (it > 0) mbarrier_wait(freed, static_cast<uint32_t>(it - 1) & 1);
    const int row = 64 * warpgroup + 16 * (warp % 4) + lane / 4, col = 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < T::kXBoxes; ++h) {
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

// The update warpgroups: AdamW on each staged tile, a batch of kPasses rows per thread at a time, all of
// whose loads are issued before the first is used.
__device__ void update_tiles(const Params& a, const float* staging, uint64_t* staged, uint64_t* freed) {
  using namespace flash;
  using T = Tile;
  const int u = static_cast<int>(threadIdx.x) - kProductThreads;
  // Per pass, the update threads take kRowsPerPass whole rows of the tile, 4 columns each: every warp's
  // loads and stores are 512-byte runs.
  const int first_row = u * 4 / T::N, col = u * 4 % T::N;
  AdamWFactors f = a.f;
  adamw_load_step_factors(f, a.step_factors);
  int it = 0, problem = 0;
  for (int tile = static_cast<int>(blockIdx.x); tile < a.tiles; tile += static_cast<int>(gridDim.x), ++it) {
    const TileAt at = locate(a, tile, problem);
    problem = at.problem;
    const Problem& w = a.problem[at.problem];
    const bool col_ok = at.n0 + col < w.in;  // in is a multiple of 4: a lane's 4 columns are wholly in or out
    mbarrier_wait(staged, static_cast<uint32_t>(it) & 1);
#pragma unroll 1
    for (int batch = 0; batch < kBatches; ++batch) {
      float p[kPasses][4], m[kPasses][4], v[kPasses][4];
#pragma unroll
      for (int r = 0; r < kPasses; ++r) {
        const int row = (batch * kPasses + r) * kRowsPerPass + first_row;
        if (col_ok && at.m0 + row < w.out) {
          const int64_t k = ((at.m0 + row) * w.in + at.n0 + col) / 4;  // in units of 4 elements
          load4<true>(w.param, k, p[r]);
          load4<true>(w.exp_avg, k, m[r]);
          load4<true>(w.exp_avg_sq, k, v[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < kPasses; ++r) {
        const int row = (batch * kPasses + r) * kRowsPerPass + first_row;
        if (!col_ok || at.m0 + row >= w.out) continue;
        const float4 product = *reinterpret_cast<const float4*>(staging + row * T::kPitch + col);
        const float g[4] = {product.x, product.y, product.z, product.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          adamw_update(p[r][e], a.round_grad_bf16 ? __bfloat162float(__float2bfloat16_rn(g[e])) : g[e],
                       m[r][e], v[r][e], f);
        }
        const int64_t k = ((at.m0 + row) * w.in + at.n0 + col) / 4;
        store4<true>(w.param, k, p[r]);
        store4<true>(w.exp_avg, k, m[r]);
        store4<true>(w.exp_avg_sq, k, v[r]);
        if (w.bf16_copy != nullptr) store4<true>(w.bf16_copy, k, p[r]);
      }
    }
    mbarrier_arrive(freed);
  }
}

#endif  // TT_HAVE_WGMMA

__global__ void __launch_bounds__(kBlockThreads, 1) gemm_adamw_kernel(const __grid_constant__ Params a) {
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
    compute_products(a, smem, staging, full, empty, staged, freed);
  } else {
    wgmma::claim_registers<152>();
    update_tiles(a, staging, staged, freed);
  }
#else
  __trap();  // an sm_90 GPU running a build without sm_90a code: fail loudly, never leave a weight stale
#endif
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The problem's tiles, or 0 where the kernel does not take it (layout, alignment, sizes), and its maps.
int64_t tiles_of(const GemmAdamwProblem& q, int64_t tokens, CUtensorMap* map_dy, CUtensorMap* map_x) {
  // The tensor maps need 16-byte aligned rows; the update reads and writes the weight's rows 16 bytes at a
  // time (4 floats, so in % 4 == 0, implied).
  const bool fits = q.out >= 1 && q.in >= 1 && tokens >= 1 && q.in % 8 == 0 && q.ld_dy % 8 == 0 &&
                    q.ld_x % 8 == 0 && q.ld_dy >= q.out && q.ld_x >= q.in && tokens < (int64_t{1} << 24) &&
                    aligned_to(q.dy, 16) && aligned_to(q.x, 16) && aligned_to(q.param, 16) &&
                    aligned_to(q.exp_avg, 16) && aligned_to(q.exp_avg_sq, 16) &&
                    (q.bf16_copy == nullptr || aligned_to(q.bf16_copy, 8));
  if (!fits || !flash::make_matrix_map(map_dy, q.dy, q.out, tokens, q.ld_dy, kBlockK) ||
      !flash::make_matrix_map(map_x, q.x, q.in, tokens, q.ld_x, kBlockK)) {
    return 0;
  }
  return ceil_div(q.out, Tile::M) * ceil_div(q.in, Tile::N);
}

}  // namespace

bool gemm_adamw_takes(const GemmAdamwProblem& problem, int64_t tokens) {
  if (current_device_major() != 9) return false;
  CUtensorMap map_dy, map_x;
  const int64_t tiles = tiles_of(problem, tokens, &map_dy, &map_x);
  return tiles > 0 && tiles < (int64_t{1} << 30);
}

void gemm_adamw(const GemmAdamwProblem* problems, int count, int64_t tokens, bool round_grad_bf16,
                const float* device_factors, double beta1, double beta2, double eps, cudaStream_t stream) {
  TT_ASSERT(count >= 1 && count <= kGemmAdamwMaxProblems, "gemm_adamw: " + std::to_string(count) +
                                                              " weights in one launch (1 to " +
                                                              std::to_string(kGemmAdamwMaxProblems) + ")");
  TT_CHECK(current_device_major() == 9, "gemm_adamw: not a Hopper GPU");
  Params a{};
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    const GemmAdamwProblem& q = problems[i];
    const int64_t own = tiles_of(q, tokens, &a.map_dy[i], &a.map_x[i]);
    TT_CHECK(own > 0, "gemm_adamw: weight " + std::to_string(i) + " of the group (" + std::to_string(q.out) +
                          " x " + std::to_string(q.in) + ") has a layout the kernel does not take");
    Problem& w = a.problem[i];
    w.param = q.param;
    w.exp_avg = q.exp_avg;
    w.exp_avg_sq = q.exp_avg_sq;
    w.bf16_copy = static_cast<bf16*>(q.bf16_copy);
    w.out = q.out;
    w.in = q.in;
    w.tiles_m = static_cast<int>(ceil_div(q.out, Tile::M));
    w.tiles_n = static_cast<int>(ceil_div(q.in, Tile::N));
    // Every round of tiles (one per SM) reads all of the operand that consecutive tiles do not share, X
    // (tokens x in) when they step along the columns, dY (tokens x out) when they step down the rows, and
    // between rounds more parameter and moment bytes than L2 holds stream past it: let it be the smaller
    // one. For a 2560 x 10240 w2 that is 5 MB of dY instead of 21 MB of X: about 6% less of the kernel's DRAM
    // traffic over a 2.7b step.
    w.along_rows = w.tiles_n > w.tiles_m;
    w.first_tile = static_cast<int>(tiles);
    tiles += own;
    TT_CHECK(tiles < (int64_t{1} << 31), "gemm_adamw: more than 2^31 tiles in one launch");
  }
  a.problems = count;
  a.tokens = static_cast<int>(tokens);
  a.tiles = static_cast<int>(tiles);
  a.step_factors = device_factors;
  a.f = adamw_constant_factors(beta1, beta2, eps);
  a.round_grad_bf16 = round_grad_bf16 ? 1 : 0;
  int device = 0, sms = 0;
  TT_CUDA_CHECK(cudaGetDevice(&device));
  TT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  flash::allow_shared_memory(gemm_adamw_kernel, Tile::kSmemBytes);
  const auto blocks = static_cast<unsigned>(std::min(a.tiles, sms));  // persistent: one per SM
  gemm_adamw_kernel<<<blocks, kBlockThreads, Tile::kSmemBytes, stream>>>(a);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace tt::cuda
