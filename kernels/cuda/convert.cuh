// Element conversions shared by the CUDA kernels: values stored as f32 or bf16 are read as f32, and f32
// results are rounded once (to nearest even) into the storage type.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

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

// Four consecutive elements as one access (16 bytes of f32, 8 of bf16), widened to f32 / rounded once.
// Callers use them only when every pointer is aligned to four elements (aligned4 on the host). kStreaming
// marks data touched once (cache hint evict-first: __ldcs / __stcs), such as the optimizer's buffers.
template <bool kStreaming, class V>
__device__ inline V load_vector(const V* p) {
  if constexpr (kStreaming) {
    return __ldcs(p);
  } else {
    return *p;
  }
}
template <bool kStreaming, class V>
__device__ inline void store_vector(V* p, const V& value) {
  if constexpr (kStreaming) {
    __stcs(p, value);
  } else {
    *p = value;
  }
}
template <bool kStreaming = false>
__device__ inline void load4(const float* p, int64_t k, float (&v)[4]) {
  const float4 q = load_vector<kStreaming>(reinterpret_cast<const float4*>(p) + k);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
template <bool kStreaming = false>
__device__ inline void load4(const __nv_bfloat16* p, int64_t k, float (&v)[4]) {
  const uint2 q = load_vector<kStreaming>(reinterpret_cast<const uint2*>(p) + k);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
  v[0] = lo.x;
  v[1] = lo.y;
  v[2] = hi.x;
  v[3] = hi.y;
}
template <bool kStreaming = false>
__device__ inline void store4(float* p, int64_t k, const float (&v)[4]) {
  store_vector<kStreaming>(reinterpret_cast<float4*>(p) + k, make_float4(v[0], v[1], v[2], v[3]));
}
template <bool kStreaming = false>
__device__ inline void store4(__nv_bfloat16* p, int64_t k, const float (&v)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
  uint2 q;
  q.x = *reinterpret_cast<const uint32_t*>(&lo);
  q.y = *reinterpret_cast<const uint32_t*>(&hi);
  store_vector<kStreaming>(reinterpret_cast<uint2*>(p) + k, q);
}

// W consecutive elements, the k-th group of W, for kernels written once for both widths: W = 1 is one
// element, W = 4 is load4/store4, W = 8 (bf16 only) one 16-byte access.
template <int W, class T>
__device__ inline void load_w(const T* p, int64_t k, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = to_float(p[k]);
  } else if constexpr (W == 4) {
    load4(p, k, v);
  } else {
    static_assert(W == 8 && sizeof(T) == 2, "load_w: 1, 4, or 8 bf16 elements");
    const uint4 q = reinterpret_cast<const uint4*>(p)[k];
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      v[2 * i] = pair.x;
      v[2 * i + 1] = pair.y;
    }
  }
}
template <int W, class T>
__device__ inline void store_w(T* p, int64_t k, const float (&v)[W]) {
  if constexpr (W == 1) {
    p[k] = from_float<T>(v[0]);
  } else if constexpr (W == 4) {
    store4(p, k, v);
  } else {
    static_assert(W == 8 && sizeof(T) == 2, "store_w: 1, 4, or 8 bf16 elements");
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    reinterpret_cast<uint4*>(p)[k] = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

}  // namespace tt::cuda
