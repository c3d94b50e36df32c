// Element conversions shared by the CUDA kernels: values stored as f32 or bf16 are read as f32, and f32
// results are rounded once (to nearest even) into the storage type.
#pragma once

#include <cuda_bf16.h>

namespace tt::cuda {

__device__ inline float to_float(float x) {
  return x;
}
__device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace tt::cuda
