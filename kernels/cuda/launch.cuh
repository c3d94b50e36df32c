// Launch helpers shared by the streaming and row kernels: grid sizes, grid-stride indices, alignment tests
// and room in shared memory.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace tt::cuda {

constexpr int kThreads = 256;
// A block per 256 work items however many that makes (beyond 2^30 blocks the kernels loop): on an H100 a
// streaming kernel moved about 6% more bytes per second with the whole grid launched than with 8192 blocks
// looping over the data.
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

inline unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
// Aligned for the four-element (vector) paths.
template <class T>
bool aligned4(const T* p) {
  return aligned_to(p, 4 * sizeof(T));
}

// Whether `bytes` of dynamic shared memory fit on the current device beside a kernel's static shared
// buffers (the row kernels' reduction buffers, at most 256 bytes; 1024 leaves room to spare). Beyond 48 KiB
// a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize), up to the device's limit.
inline bool dynamic_shared_fits(size_t bytes) {
  constexpr size_t kStaticShared = 1024;
  int device = 0, optin = 0;
  TT_CUDA_CHECK(cudaGetDevice(&device));
  TT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes + kStaticShared <= static_cast<size_t>(optin);
}

}  // namespace tt::cuda
