// Whole-step CUDA graphs: capture once what a step enqueues on the compute stream, then replay it with one
// launch per step, which removes the host's per-kernel launch cost (the counterpart of torch.compile's
// CUDA graphs). The step must not read anything back to the host and must not change shapes; its inputs
// are refreshed in place (copy into the same tensors) before each replay. Host-side decisions are fixed at
// capture: a backward captured right after zero_grad overwrites the weight gradients (mark_grad_zeroed) in
// every replay, so a captured body that accumulates gradients must contain its own zero_grad.
#pragma once

#include <functional>
#include <memory>

#include "core/device.h"

namespace tt {

class CudaGraph {
 public:
  explicit CudaGraph(Device device);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `body` once under stream capture (nothing executes) and instantiates the graph. Allocations made
  // inside come from the allocator's graph pool.
  void capture(const std::function<void()>& body);
  void replay();
  bool captured() const { return exec_ != nullptr; }

 private:
  Device device_;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace tt
