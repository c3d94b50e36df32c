// Fused AdamW over the flat parameter, gradient and moment buffers: one pass reads and writes each element
// once, which is all the optimizer step costs. Same update as torch.optim.AdamW and the CPU twin.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace tt::cuda {
namespace {

// The first vector_groups * 4 elements go through 16-byte loads and stores (the buffers are aligned for it,
// checked on the host); the rest, fewer than 4 or everything when unaligned, element by element.
// The step-dependent factors come from device memory (uploaded before the launch, or before a CUDA graph
// replay), so a captured step stays valid for every later step; a fourth factor of 0 cancels the update
// (adamw_cancel_factors); grad_scale (optional) is the clipping
// factor computed on the device.
// low (optional) receives each updated parameter rounded to bf16: the bf16 weights of the next forward,
// written here instead of cast there (8-byte aligned when the vector path runs, checked on the host).
// Gradients are f32, or bf16 (FlatParameters::set_grad_dtype): four at a time, widened exactly.
template <class G>
__global__ void adamw_kernel(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                             int64_t vector_groups, AdamWFactors f, const float* step_factors,
                             const float* grad_scale, __nv_bfloat16* low) {
  if (step_factors[3] == 0.0f) return;  // cancelled: this step's update already ran
  adamw_load_step_factors(f, step_factors);
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const int64_t first = thread_index();
  const int64_t stride = grid_threads();
  for (int64_t k = first; k < vector_groups; k += stride) {
    // Every byte is touched once per step: streaming loads and stores (evict-first) keep the L2 for others.
    float p[4], g[4], m[4], v[4];
    load4<true>(param, k, p);
    load4<true>(grad, k, g);
    load4<true>(exp_avg, k, m);
    load4<true>(exp_avg_sq, k, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw_update(p[j], grad_scale ? __fmul_rn(g[j], scale) : g[j], m[j], v[j], f);
    store4<true>(param, k, p);
    store4<true>(exp_avg, k, m);
    store4<true>(exp_avg_sq, k, v);
    if (low != nullptr) store4(low, k, p);
  }
  for (int64_t i = vector_groups * 4 + first; i < n; i += stride) {
    const float g = to_float(__ldcs(grad + i));
    adamw_update(param[i], grad_scale ? __fmul_rn(g, scale) : g, exp_avg[i], exp_avg_sq[i], f);
    if (low != nullptr) low[i] = __float2bfloat16_rn(param[i]);
  }
}

// scale = min(1, max_norm / (sqrt(norm_sq) + 1e-6)), and the norm itself for logging.
__global__ void clip_scale_kernel(const float* norm_sq, double max_norm, float* scale, float* norm) {
  const double n = sqrt(static_cast<double>(*norm_sq));
  *norm = static_cast<float>(n);
  *scale = max_norm > 0 ? static_cast<float>(fmin(1.0, max_norm / (n + 1e-6))) : 1.0f;
}

}  // namespace

AdamWFactors adamw_constant_factors(double beta1, double beta2, double eps) {
  AdamWFactors f{};
  f.beta1 = static_cast<float>(beta1);
  f.beta2 = static_cast<float>(beta2);
  f.one_minus_beta1 = 1.0f - f.beta1;  // in float, as the CPU twin computes T(1) - b1
  f.one_minus_beta2 = 1.0f - f.beta2;
  f.eps = static_cast<float>(eps);
  return f;
}

void adamw_upload_factors(float* device_factors, double lr, double beta1, double beta2, double weight_decay,
                          int64_t step, cudaStream_t stream) {
  TT_ASSERT(step >= 1, "cuda::adamw: step counts from 1, got " + std::to_string(step));
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  // Rounded exactly as the CPU twin rounds them.
  const float factors[4] = {static_cast<float>(lr / bias1), static_cast<float>(std::sqrt(bias2)),
                            static_cast<float>(1.0 - lr * weight_decay), 1.0f};
  // From pageable memory the copy is staged before cudaMemcpyAsync returns, so `factors` may go away.
  TT_CUDA_CHECK(cudaMemcpyAsync(device_factors, factors, sizeof(factors), cudaMemcpyHostToDevice, stream));
}

void adamw_cancel_factors(float* device_factors, cudaStream_t stream) {
  TT_CUDA_CHECK(cudaMemsetAsync(device_factors + 3, 0, sizeof(float), stream));
}

void adamw_apply(float* param, const void* grad, bool grad_bf16, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const float* device_factors, const float* grad_scale, double beta1, double beta2, double eps,
                 cudaStream_t stream, void* bf16_copy) {
  if (n == 0) return;
  const AdamWFactors f = adamw_constant_factors(beta1, beta2, eps);
  // Views into the flat buffers (ZeRO shards, buckets) may start at any element, so alignment is checked.
  const bool grad_aligned = grad_bf16 ? aligned_to(grad, 8) : aligned_to(grad, 16);
  const bool vectorisable = aligned_to(param, 16) && grad_aligned && aligned_to(exp_avg, 16) &&
                            aligned_to(exp_avg_sq, 16) && (bf16_copy == nullptr || aligned_to(bf16_copy, 8));
  const int64_t vector_groups = vectorisable ? n / 4 : 0;
  const int64_t work_items = std::max(vector_groups, n - vector_groups * 4);
  const unsigned int blocks = blocks_for(work_items);
  auto* low = static_cast<__nv_bfloat16*>(bf16_copy);
  if (grad_bf16) {
    adamw_kernel<<<blocks, kThreads, 0, stream>>>(param, static_cast<const __nv_bfloat16*>(grad), exp_avg,
                                                  exp_avg_sq, n, vector_groups, f, device_factors, grad_scale,
                                                  low);
  } else {
    adamw_kernel<<<blocks, kThreads, 0, stream>>>(param, static_cast<const float*>(grad), exp_avg, exp_avg_sq,
                                                  n, vector_groups, f, device_factors, grad_scale, low);
  }
  TT_CUDA_LAUNCH_CHECK();
}

void clip_scale(const float* norm_sq, double max_norm, float* scale, float* norm, cudaStream_t stream) {
  clip_scale_kernel<<<1, 1, 0, stream>>>(norm_sq, max_norm, scale, norm);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace tt::cuda
