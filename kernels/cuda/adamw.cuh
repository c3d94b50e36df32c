// The AdamW update of one element, shared by the flat-buffer kernel (adamw.cu) and the weight-gradient
// matmul that applies it in its epilogue (gemm_adamw.cu), so both round exactly like the CPU twin.
#pragma once

namespace tt::cuda {

// Constant for a launch; passed by value.
struct AdamWFactors {
  float step_size;   // lr / (1 - beta1^step)   (read from device memory at run time)
  float bias2_sqrt;  // sqrt(1 - beta2^step)    (idem)
  float decay;       // 1 - lr * weight_decay   (idem)
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps;
};

// Host side (adamw.cu): the launch-constant part of the factors; the step-dependent three are read from the
// device buffer adamw_upload_factors fills.
AdamWFactors adamw_constant_factors(double beta1, double beta2, double eps);

// Each product, sum, quotient and root is rounded on its own (no fused multiply-add) and in the CPU twin's
// order, so the GPU and CPU updates agree bit for bit.
__device__ inline void adamw_update(float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                    const AdamWFactors& f) {
  param = __fmul_rn(param, f.decay);
  exp_avg = __fadd_rn(__fmul_rn(f.beta1, exp_avg), __fmul_rn(f.one_minus_beta1, grad));
  exp_avg_sq = __fadd_rn(__fmul_rn(f.beta2, exp_avg_sq), __fmul_rn(__fmul_rn(f.one_minus_beta2, grad), grad));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(exp_avg_sq), f.bias2_sqrt), f.eps);
  param = __fsub_rn(param, __fdiv_rn(__fmul_rn(f.step_size, exp_avg), denom));
}

// The step-dependent factors from device memory (uploaded before the launch, or before a graph replay).
__device__ inline void adamw_load_step_factors(AdamWFactors& f, const float* step_factors) {
  f.step_size = step_factors[0];
  f.bias2_sqrt = step_factors[1];
  f.decay = step_factors[2];
}

}  // namespace tt::cuda
