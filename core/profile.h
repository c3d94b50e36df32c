// NVTX ranges, so an Nsight Systems or Nsight Compute profile reads like the model ("layer 3 / attention /
// softmax"). Free when no profiler is attached; compiled out without CUDA.
#pragma once

#ifdef TT_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace tt {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#ifdef TT_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#ifdef TT_WITH_CUDA
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Marks the region a profiler started with "capture range = CUDA profiler API" records (benchmark
// --profile-steps): only the measured steps.
void profiler_start();
void profiler_stop();

}  // namespace tt
