#include <atomic>

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

bool can_access_peer(int device, int peer) {
  const int count = device_count();
  if (device < 0 || peer < 0 || device >= count || peer >= count || device == peer) return false;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return can != 0;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

int current_device_major() {
  static std::atomic<int> majors[64];
  int device = 0;
  TT_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) return 0;
  if (majors[device].load() == 0) {
    int major = 0;
    TT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    majors[device].store(major);
  }
  return majors[device].load();
}

}  // namespace tt::cuda
