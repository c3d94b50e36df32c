#include "core/profile.h"

#ifdef TT_WITH_CUDA
#include <cuda_profiler_api.h>
#endif

namespace tt {

void profiler_start() {
#ifdef TT_WITH_CUDA
  cudaProfilerStart();
#endif
}

void profiler_stop() {
#ifdef TT_WITH_CUDA
  cudaProfilerStop();
#endif
}

}  // namespace tt
