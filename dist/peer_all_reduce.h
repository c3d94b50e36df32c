// The copy-engine all-reduce of two ranks on one host (internal to the NCCL backend).
//
// NCCL's all-reduce runs as kernels: for the whole time a bucket travels, its thread blocks occupy SMs and
// compete with the backward pass it is meant to hide behind. Between two GPUs that can address each other's
// memory (NVLink, CUDA IPC) the same result needs very little SM time: each rank owns one half of the tensor,
// pulls the peer's copy of that half with the copy engines (a DMA; no SM involved), adds it to its own with
// one short memory-bound kernel, and then pulls the peer's reduced half. Per tensor, on the communication
// stream of rank r (peer p):
//
//   signal READY        -> wait for the peer's READY        (both tensors are final)
//   copy peer half r into scratch, add into own half r       (in chunks of the scratch size)
//   signal REDUCED      -> wait for the peer's REDUCED      (both halves hold the sum)
//   copy peer half p over own half p
//   signal DONE         -> wait for the peer's DONE         (the peer has read everything it needs from us)
//
// Both ranks end with bitwise identical tensors (each half is computed once and copied). Signals are 32-bit
// sequence numbers: a stream memory operation writes the number into a local staging word, a 4-byte copy
// puts it into the peer's inbox, and the waiting side's stream blocks on its own inbox with
// cuStreamWaitValue32 - the GPU's front end waits, no kernel spins on an SM. The three waits are also what
// makes reuse safe: a rank changes a half only after the peer has read it.
//
// Tensors must lie inside a buffer registered on both ranks (the same size, e.g. the flat gradient buffer,
// whose views correspond element for element), at the same offset on both: the peer's copy is found by
// that offset. The peer's buffer is mapped with cudaIpcOpenMemHandle. Every setup step that can fail on
// one rank only (mapping, allocation) is agreed on, so both ranks throw together and can fall back to NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tt::dist {

class PeerAllReduce {
 public:
  // Collective over MPI_COMM_WORLD, which must hold exactly two ranks on one host. Each all-reduce is
  // ordered after the work queued on `comm_stream` and the work queued there afterwards after it; in
  // between it runs on a stream of its own, at CUDA's lowest priority unless TT_COPY_ENGINE_PRIORITY=high.
  // That is also the compute stream's default; with TT_COMPUTE_STREAM_PRIORITY=high the compute stream
  // ranks above it and the add kernels only fill SMs the computation leaves idle. Throws tt::Error saying
  // why when the peer's memory cannot be reached.
  PeerAllReduce(int rank, int device, cudaStream_t comm_stream);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // Collective: maps the peer's counterpart of `buffer` (a whole or partial view of a CUDA allocation, the
  // same size on both ranks). The buffer is kept alive until unregister_buffer.
  void register_buffer(const Tensor& buffer);
  // Collective in effect (both ranks unregister the same buffers); waits for the stream first.
  void unregister_buffer(const Tensor& buffer);
  // Whether `t` (contiguous) lies inside a registered buffer and has a dtype this transport adds (f32, bf16).
  bool covers(const Tensor& t) const;
  // Queues the all-reduce of `t` on the stream: t = (t + peer's t) * scale.
  void issue(Tensor& t, float scale);

 private:
  struct Registration {
    Tensor buffer;
    char* local = nullptr;  // first byte of the buffer
    char* peer = nullptr;   // the peer's first byte, mapped
    size_t bytes = 0;
    size_t mapping = 0;  // index into mappings_
  };
  struct Mapping {
    std::array<char, 64> handle{};  // the peer's cudaIpcMemHandle_t bytes
    void* base = nullptr;
    int users = 0;
  };
  enum Signal { ready = 0, reduced = 1, done = 2 };

  // Collective: returns when every rank's step succeeded, else throws on every rank (this rank's reason, or
  // which rank failed), first releasing everything when `constructing` (the destructor will not run).
  void agree_or_throw(const std::string& local_error, const char* step, bool constructing);
  void release();  // frees what is held; safe on a partly constructed object
  void signal(Signal kind, uint32_t sequence);
  void wait(Signal kind, uint32_t sequence);
  // The registration holding `t` when this transport can carry it (contiguous f32 or bf16 on CUDA), else
  // null.
  const Registration* find(const Tensor& t) const;

  int rank_, device_;
  cudaStream_t comm_stream_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
  bool kernel_wait_ =
      false;  // TT_COPY_ENGINE_WAIT=kernel: a one-warp polling kernel instead of the stream wait
  uint32_t sequence_ = 0;
  // Three inbox words (written by the peer) and three staging words (read by the copy to the peer).
  uint32_t* flags_ = nullptr;
  uint32_t* peer_flags_ = nullptr;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<Registration> registrations_;
  std::vector<Mapping> mappings_;
  struct Driver;
  std::unique_ptr<Driver> driver_;
};

}  // namespace tt::dist
