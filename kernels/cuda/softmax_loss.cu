// Masked softmax (the naive attention's middle step) and cross-entropy on the GPU: the twins of
// kernels/cpu/softmax_loss.cpp. Everything is computed in f32 with max-subtracted exponentials (the fused
// classifier's logits and their gradient may be stored in bf16).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace tt::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
// Attention rows are at most a few thousand columns, so a warp per row keeps every reduction in shuffles.
constexpr int kSoftmaxWarpsPerBlock = 8;
// Vocabulary rows are tens of thousands of logits: a block per row, looping beyond kMaxRowBlocks rows.
constexpr int kLossThreads = 512;
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>(std::min(rows, kMaxRowBlocks));
}

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// A running (max, sum of exp(x - max)) pair lets one pass over a row find both the max and the normaliser.
struct OnlineExpSum {
  float max = -INFINITY;
  float sum = 0.0f;

  __device__ void add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.0f;
      max = x;
    } else if (x != -INFINITY) {  // -inf contributes exp(-inf) = 0; skipping it avoids exp(-inf - -inf)
      sum += expf(x - max);
    }
  }

  __device__ void merge(const OnlineExpSum& other) {
    const float new_max = fmaxf(max, other.max);
    if (new_max == -INFINITY) return;  // both empty (or all -inf): nothing to rescale
    sum = sum * expf(max - new_max) + other.sum * expf(other.max - new_max);
    max = new_max;
  }

  __device__ void warp_merge() {
    for (int offset = 16; offset > 0; offset >>= 1) {
      OnlineExpSum other;
      other.max = __shfl_xor_sync(kFullMask, max, offset);
      other.sum = __shfl_xor_sync(kFullMask, sum, offset);
      merge(other);
    }
  }
};

// Every warp merges the same per-warp states in the same order, so all threads end with the same value. The
// leading barrier lets a block call this once per row in a loop.
__device__ OnlineExpSum block_merge(OnlineExpSum state) {
  __shared__ float warp_max[32], warp_sum_exp[32];
  state.warp_merge();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) {
    warp_max[warp] = state.max;
    warp_sum_exp[warp] = state.sum;
  }
  __syncthreads();
  OnlineExpSum total;
  if (lane < static_cast<int>(blockDim.x / 32)) {
    total.max = warp_max[lane];
    total.sum = warp_sum_exp[lane];
  }
  total.warp_merge();
  return total;
}

// With causal, row i of each (rows x cols) matrix keeps columns 0..i; masked probabilities are written as 0.
__global__ void softmax_forward_kernel(const float* s, float* p, int64_t total_rows, int64_t rows,
                                       int64_t cols, float scale, bool causal) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSoftmaxWarpsPerBlock + threadIdx.x / 32;
  if (row >= total_rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t valid = causal ? std::min(row % rows + 1, cols) : cols;
  const float* sr = s + row * cols;
  float* pr = p + row * cols;
  OnlineExpSum state;
  for (int64_t j = lane; j < valid; j += 32) state.add(sr[j] * scale);
  state.warp_merge();
  for (int64_t j = lane; j < cols; j += 32)
    pr[j] = j < valid ? expf(sr[j] * scale - state.max) / state.sum : 0.0f;
}

__global__ void softmax_backward_kernel(const float* dp, const float* p, float* ds, int64_t total_rows,
                                        int64_t cols, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSoftmaxWarpsPerBlock + threadIdx.x / 32;
  if (row >= total_rows) return;
  const int lane = threadIdx.x % 32;
  const float* dpr = dp + row * cols;
  const float* pr = p + row * cols;
  float dot = 0;
  for (int64_t j = lane; j < cols; j += 32) dot += dpr[j] * pr[j];
  dot = warp_sum(dot);
  float* dsr = ds + row * cols;
  for (int64_t j = lane; j < cols; j += 32) dsr[j] = scale * pr[j] * (dpr[j] - dot);
}

// An out-of-range target yields a NaN loss rather than a read outside the row.
__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets, float* losses,
                                             float* lse, int64_t n, int64_t vocab) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* lr = logits + row * vocab;
    OnlineExpSum state;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) state.add(lr[j]);
    state = block_merge(state);
    if (threadIdx.x == 0) {
      const float row_lse = state.max + logf(state.sum);
      const int32_t target = targets[row];
      lse[row] = row_lse;
      losses[row] = target >= 0 && target < vocab ? row_lse - lr[target] : NAN;
    }
  }
}

// The loss gradient stays on the device and is read here, so the backward pass never waits for the host.
__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets, const float* lse,
                                              const float* dloss, float scale, float* dlogits, int64_t n,
                                              int64_t vocab) {
  const float g = *dloss * scale;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* lr = logits + row * vocab;
    float* dr = dlogits + row * vocab;
    const float row_lse = lse[row];
    const int64_t target = targets[row];
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float prob = expf(lr[j] - row_lse);
      dr[j] = g * (prob - (j == target ? 1.0f : 0.0f));
    }
  }
}

// One chunk of the fused classifier + loss (ops::linear_cross_entropy): rows `ld` elements apart, the columns
// past vocab padding (never taken as logits). Each row's loss and, with dlogits, its gradient
// (softmax - onehot) * grad_scale in G (f32 or bf16), zeros in the padding; the logits L are f32, or bf16 in
// a bf16 model (computed in f32). An out-of-range target yields a NaN loss rather than a read outside the
// row.
//
// Why one pass: this kernel is the head's largest mover of bytes (at GPT-2 small, 1.6 G logits per step), and
// the softmax needs the row's max and sum before the first gradient element can be written. So a block reads
// its row from global memory once, copying it into shared memory while it folds each logit into a running
// (max, sum), and writes the gradient from that copy: one read instead of two. A bf16 row of GPT-2's 50304
// padded columns is 100 KB (two blocks to an SM), an f32 one 201 KB; longer rows take the two-pass kernel
// below. dlogits may alias logits: the whole row is copied before any of it is written.
constexpr int kLoadsInFlight = 4;  // 16-byte loads each thread issues before it uses the first

// How many of group k's kElems columns are logits (all but near the row's end; the rest is padding).
template <int kElems>
__device__ int logits_in_group(int64_t k, int64_t vocab) {
  return static_cast<int>(std::clamp<int64_t>(vocab - kElems * k, 0, kElems));
}

template <class L, class G>
__global__ void cross_entropy_rows_one_pass_kernel(const L* logits, int64_t ld, const int32_t* targets,
                                                   float* losses, G* dlogits, float grad_scale, int64_t n,
                                                   int64_t vocab) {
  constexpr int kElems = 16 / sizeof(L);  // logits per 16-byte group: 4 f32 or 8 bf16
  extern __shared__ uint4 row_copy[];
  const L* row_copy_logits = reinterpret_cast<const L*>(row_copy);
  const int64_t groups = ld / kElems;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const uint4* lr = reinterpret_cast<const uint4*>(logits + row * ld);
    OnlineExpSum state;
    for (int64_t base = threadIdx.x; base < groups; base += kLoadsInFlight * blockDim.x) {
      uint4 raw[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int64_t k = base + u * blockDim.x;
        if (k < groups) raw[u] = load_vector<true>(lr + k);  // read once: evict first
      }
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int64_t k = base + u * blockDim.x;
        if (k >= groups) continue;
        row_copy[k] = raw[u];
        float v[kElems];
        load_w<kElems>(reinterpret_cast<const L*>(&raw[u]), 0, v);
        const int logits_here = logits_in_group<kElems>(k, vocab);
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          if (e < logits_here) state.add(v[e]);
        }
      }
    }
    // block_merge's barriers also make the whole copy visible to every thread.
    state = block_merge(state);
    const float row_lse = state.max + logf(state.sum);
    const int32_t target = targets[row];
    const bool valid = target >= 0 && target < vocab;
    if (threadIdx.x == 0) losses[row] = valid ? row_lse - to_float(row_copy_logits[target]) : NAN;
    if (dlogits != nullptr) {
      G* dr = dlogits + row * ld;
      for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
        float v[kElems];
        load_w<kElems>(row_copy_logits, k, v);
        const int logits_here = logits_in_group<kElems>(k, vocab);
        const int target_here = valid && target / kElems == k ? target % kElems : -1;
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          v[e] =
              e < logits_here ? (expf(v[e] - row_lse) - (e == target_here ? 1.0f : 0.0f)) * grad_scale : 0.0f;
        }
        store_w<kElems>(dr, k, v);
      }
    }
    __syncthreads();  // the copy is read to its end before the next row overwrites it
  }
}

// The same for rows too long for shared memory (ld a multiple of 4): the logits are read twice, once for the
// max and sum and once for the gradient. dlogits may alias logits: every element is read before the same
// thread writes it, and the barriers in block_merge order the target's read before any write.
template <class L, class G>
__global__ void cross_entropy_rows_two_pass_kernel(const L* logits, int64_t ld, const int32_t* targets,
                                                   float* losses, G* dlogits, float grad_scale, int64_t n,
                                                   int64_t vocab) {
  const int64_t groups = ld / 4;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const L* lr = logits + row * ld;
    const int32_t target = targets[row];
    const bool valid = target >= 0 && target < vocab;
    const float target_logit = threadIdx.x == 0 && valid ? to_float(lr[target]) : NAN;
    OnlineExpSum state;
    for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
      float v[4];
      load4(lr, k, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (4 * k + e < vocab) state.add(v[e]);
      }
    }
    state = block_merge(state);
    const float row_lse = state.max + logf(state.sum);
    if (threadIdx.x == 0) losses[row] = row_lse - target_logit;
    if (dlogits == nullptr) continue;
    G* dr = dlogits + row * ld;
    for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
      float v[4];
      load4(lr, k, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = 4 * k + e;
        v[e] = col < vocab ? (expf(v[e] - row_lse) - (col == target ? 1.0f : 0.0f)) * grad_scale : 0.0f;
      }
      store4(dr, k, v);
    }
  }
}

// x *= *factor, skipped on the device when the factor is exactly 1 (a loss's own gradient): the factor stays
// in device memory, so the host never waits for it.
__global__ void scale_by_device_factor_kernel(float* x, int64_t n, const float* factor) {
  const float f = *factor;
  if (f == 1.0f) return;
  for (int64_t i = thread_index(); i < n; i += grid_threads()) x[i] *= f;
}

unsigned int softmax_blocks(int64_t total_rows) {
  return static_cast<unsigned int>((total_rows + kSoftmaxWarpsPerBlock - 1) / kSoftmaxWarpsPerBlock);
}

// The one-pass kernel where the row fits in shared memory (dynamic_shared_fits) and is made of aligned
// 16-byte groups; else the two-pass kernel.
template <class L, class G>
void launch_cross_entropy_rows(const L* logits, int64_t ld, const int32_t* targets, float* losses, G* dlogits,
                               double grad_scale, int64_t n, int64_t vocab, cudaStream_t stream) {
  TT_ASSERT(aligned_to(logits, 4 * sizeof(L)) && aligned_to(dlogits, 4 * sizeof(G)),
            "cuda::cross_entropy_rows: buffers must be aligned to four elements");
  if (n == 0) return;
  const float scale = static_cast<float>(grad_scale);
  constexpr int64_t kElems = 16 / sizeof(L);
  const size_t shared = static_cast<size_t>(ld) * sizeof(L);
  if (ld % kElems == 0 && aligned_to(logits, 16) && aligned_to(dlogits, kElems * sizeof(G)) &&
      dynamic_shared_fits(shared)) {
    auto* kernel = cross_entropy_rows_one_pass_kernel<L, G>;
    TT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    // Shared memory over L1: the row copies are all this kernel reuses (two bf16 rows of 50304 to an SM).
    TT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    kernel<<<row_blocks(n), kLossThreads, shared, stream>>>(logits, ld, targets, losses, dlogits, scale, n,
                                                            vocab);
  } else {
    cross_entropy_rows_two_pass_kernel<<<row_blocks(n), kLossThreads, 0, stream>>>(
        logits, ld, targets, losses, dlogits, scale, n, vocab);
  }
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void softmax_forward(const float* s, float* p, int64_t batch, int64_t rows, int64_t cols, double scale,
                     bool causal, cudaStream_t stream) {
  const int64_t total_rows = batch * rows;
  if (total_rows == 0 || cols == 0) return;
  softmax_forward_kernel<<<softmax_blocks(total_rows), kSoftmaxWarpsPerBlock * 32, 0, stream>>>(
      s, p, total_rows, rows, cols, static_cast<float>(scale), causal);
  TT_CUDA_LAUNCH_CHECK();
}

void softmax_backward(const float* dp, const float* p, float* ds, int64_t batch, int64_t rows, int64_t cols,
                      double scale, cudaStream_t stream) {
  const int64_t total_rows = batch * rows;
  if (total_rows == 0 || cols == 0) return;
  softmax_backward_kernel<<<softmax_blocks(total_rows), kSoftmaxWarpsPerBlock * 32, 0, stream>>>(
      dp, p, ds, total_rows, cols, static_cast<float>(scale));
  TT_CUDA_LAUNCH_CHECK();
}

void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, float* lse, int64_t n,
                           int64_t vocab, cudaStream_t stream) {
  TT_CHECK(vocab > 0, "cuda::cross_entropy_forward: vocab must be positive");
  if (n == 0) return;
  cross_entropy_forward_kernel<<<row_blocks(n), kLossThreads, 0, stream>>>(logits, targets, losses, lse, n,
                                                                           vocab);
  TT_CUDA_LAUNCH_CHECK();
}

void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                            double scale, float* dlogits, int64_t n, int64_t vocab, cudaStream_t stream) {
  if (n == 0 || vocab == 0) return;
  cross_entropy_backward_kernel<<<row_blocks(n), kLossThreads, 0, stream>>>(
      logits, targets, lse, dloss, static_cast<float>(scale), dlogits, n, vocab);
  TT_CUDA_LAUNCH_CHECK();
}

void cross_entropy_rows(const void* logits, DType logits_type, int64_t ld, const int32_t* targets,
                        float* losses, void* dlogits, DType dlogits_type, double grad_scale, int64_t n,
                        int64_t vocab, cudaStream_t stream) {
  TT_ASSERT(vocab > 0 && ld >= vocab && ld % 4 == 0, "cuda::cross_entropy_rows: rows " + std::to_string(ld) +
                                                         " apart for vocab " + std::to_string(vocab) +
                                                         " (a multiple of 4, at least vocab)");
  TT_ASSERT(
      (logits_type == DType::f32 && (dlogits_type == DType::f32 || dlogits_type == DType::bf16)) ||
          (logits_type == DType::bf16 && dlogits_type == DType::bf16),
      "cuda::cross_entropy_rows: f32 logits with an f32 or bf16 gradient, or bf16 logits with a bf16 one");
  if (logits_type == DType::bf16) {
    launch_cross_entropy_rows(static_cast<const __nv_bfloat16*>(logits), ld, targets, losses,
                              static_cast<__nv_bfloat16*>(dlogits), grad_scale, n, vocab, stream);
  } else if (dlogits_type == DType::bf16) {
    launch_cross_entropy_rows(static_cast<const float*>(logits), ld, targets, losses,
                              static_cast<__nv_bfloat16*>(dlogits), grad_scale, n, vocab, stream);
  } else {
    launch_cross_entropy_rows(static_cast<const float*>(logits), ld, targets, losses,
                              static_cast<float*>(dlogits), grad_scale, n, vocab, stream);
  }
}

void scale_by_device_factor(float* x, int64_t n, const float* factor, cudaStream_t stream) {
  if (n == 0) return;
  // At most 4096 blocks, looping: the factor is almost always 1, and then a whole grid's blocks would each
  // start only to return.
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  scale_by_device_factor_kernel<<<blocks, kThreads, 0, stream>>>(x, n, factor);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace tt::cuda
