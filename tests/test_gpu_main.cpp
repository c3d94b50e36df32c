// Main of the GPU suites: exits with code 77 (reported by ctest as "skipped") when no CUDA device exists.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

int main(int argc, char** argv) {
#ifdef TT_WITH_CUDA
  const bool have_gpu = tt::cuda::device_count() > 0;
#else
  const bool have_gpu = false;
#endif
  if (!have_gpu) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
