// Host-to-GPU copies of small inputs (token ids) that do not make the host wait. A plain upload from
// pageable memory must synchronise the compute stream before returning, which stalls the host until every
// kernel queued so far has run, so the GPU idles while the next step is being queued. Here the values go
// through pinned staging buffers, copied on the compute stream; a buffer is reused only once its copy is
// done (a ring of `slots`, so with two uploads per micro-batch four slots never wait in practice).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tt {

class PinnedUpload {
 public:
  explicit PinnedUpload(Device device, int slots = 4);
  ~PinnedUpload();
  PinnedUpload(const PinnedUpload&) = delete;
  PinnedUpload& operator=(const PinnedUpload&) = delete;

  // An i32 tensor on the device holding `values`, ordered on the compute stream (Tensor::from_ints on the
  // CPU).
  Tensor ints(const std::vector<int32_t>& values, const Shape& shape);
  // The same into an existing i32 tensor of as many elements (a CUDA graph's static input).
  void ints_into(const std::vector<int32_t>& values, Tensor& dst);

 private:
  struct Slot {
    void* host = nullptr;  // pinned
    size_t capacity = 0;
    void* copied = nullptr;  // cudaEvent_t, recorded after the copy from `host`
  };
  Device device_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace tt
