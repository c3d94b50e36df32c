#include "core/cuda_graph.h"

#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_context.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt {

CudaGraph::CudaGraph(Device device) : device_(device) {
  TT_CHECK(device.is_cuda(), "CUDA graphs need a CUDA device, got " + device.str());
}

CudaGraph::~CudaGraph() {
#ifdef TT_WITH_CUDA
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  if (exec_ || graph_) {
    cudaStreamSynchronize(
        static_cast<cudaStream_t>(compute_stream(device_.index)));  // replays still in flight
    release_graph_pool(device_);
  }
#endif
}

void CudaGraph::capture(const std::function<void()>& body) {
#ifdef TT_WITH_CUDA
  TT_ASSERT(!exec_, "CudaGraph::capture called twice");
  set_current_device(device_.index);
  const auto stream = static_cast<cudaStream_t>(compute_stream(device_.index));
  // Relaxed mode lets the allocator call cudaMalloc for the graph pool during capture.
  TT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  begin_graph_pool(device_);
  try {
    body();
  } catch (...) {
    end_graph_pool(device_);
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();
    release_graph_pool(device_);  // nothing will replay: the pool's blocks go back to the cache
    throw;
  }
  end_graph_pool(device_);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    release_graph_pool(device_);  // no graph holds it
    TT_CUDA_CHECK(ended);
  }
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  TT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
#else
  (void)body;
#endif
}

void CudaGraph::replay() {
#ifdef TT_WITH_CUDA
  TT_ASSERT(exec_, "CudaGraph::replay before capture");
  TT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_),
                                static_cast<cudaStream_t>(compute_stream(device_.index))));
#endif
}

}  // namespace tt
