#include "kernels/cuda/cuda_kernels.h"

namespace tt::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for a CPU run
    return 0;
  }
  return count;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  TT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace tt::cuda
