// The copy-engine all-reduce of the ranks of one host (2 to 8; internal to the NCCL backend).
//
// NCCL's all-reduce runs as kernels: for the whole time a bucket travels, its thread blocks occupy SMs and
// compete with the backward pass it is meant to hide behind. Between GPUs that can address each other's
// memory (NVLink, CUDA IPC) the same result needs very little SM time: each of the N ranks owns one slice of
// the tensor (slice r of N), pulls the other ranks' copies of that slice with the copy engines (DMA; no SM
// involved), adds them to its own with one short memory-bound kernel, and then pulls every other rank's
// reduced slice. Per tensor, on the communication stream of rank r:
//
//   signal READY        -> wait for every other rank's READY    (all tensors are final)
//   copy the others' slice r into scratch, add                  (in chunks of the scratch size)
//   signal REDUCED      -> wait for every REDUCED               (every slice holds the sum)
//   copy each other rank's slice over our own copy of it
//   signal DONE         -> wait for every DONE                  (nobody still reads from us)
//
// A slice is summed in rank order (x_0 + x_1 + ... in f32, scaled, rounded once) by its owner and copied to
// the others, so every rank ends with bitwise identical tensors; with two ranks that is the single addition
// NCCL makes too. Signals are 32-bit sequence numbers: a stream memory operation writes the number into a
// local staging word, 4-byte copies put it into each other rank's inbox (one word per sender), and the
// waiting side's stream blocks on its own inbox words with cuStreamWaitValue32 - the GPU's front end waits,
// no kernel spins on an SM. The three waits are also what makes reuse safe: a rank changes a slice only after
// every other rank has read it.
//
// Tensors must lie inside a buffer registered on every rank (the same size, e.g. the flat gradient buffer,
// whose views correspond element for element), at the same offset everywhere: the other ranks' copies are
// found by that offset. Their buffers are mapped with cudaIpcOpenMemHandle. Every setup step that can fail on
// one rank only (mapping, allocation) is agreed on, so all ranks throw together and can fall back to NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"

namespace tt::dist {

class PeerAllReduce {
 public:
  static constexpr int kMaxRanks = kCopyEngineMaxRanks;

  // Collective over MPI_COMM_WORLD, which must hold 2 to kMaxRanks ranks, all on one host. Each all-reduce is
  // ordered after the work queued on `comm_stream` and the work queued there afterwards after it; in
  // between it runs on a stream of its own, at CUDA's default priority like the compute stream. Throws
  // tt::Error saying why when another rank's memory cannot be reached.
  PeerAllReduce(int rank, int world, int device, cudaStream_t comm_stream);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // Collective: maps the other ranks' counterparts of `buffer` (a whole or partial view of a CUDA
  // allocation, the same size on every rank). The buffer is kept alive until unregister_buffer.
  void register_buffer(const Tensor& buffer);
  // Collective in effect (every rank unregisters the same buffers); waits for the stream first.
  void unregister_buffer(const Tensor& buffer);
  // Whether `t` (contiguous) lies inside a registered buffer and has a dtype this transport adds (f32, bf16).
  bool covers(const Tensor& t) const;
  // Queues the all-reduce of `t` on the stream: t = (sum over the ranks of t) * scale.
  void issue(Tensor& t, float scale);

 private:
  struct Registration {
    Tensor buffer;
    char* local = nullptr;                  // first byte of the buffer
    std::array<char*, kMaxRanks> remote{};  // each other rank's first byte, mapped (ours: local)
    size_t bytes = 0;
    std::array<size_t, kMaxRanks> mapping{};  // per other rank, an index into mappings_
  };
  struct Mapping {
    int owner = -1;                 // the rank whose allocation this is
    std::array<char, 64> handle{};  // its cudaIpcMemHandle_t bytes
    void* base = nullptr;
    int users = 0;
  };
  enum Signal { ready = 0, reduced = 1, done = 2 };

  // Collective: returns when every rank's step succeeded, else throws on every rank (this rank's reason, or
  // that another rank failed), first releasing everything when `constructing` (the destructor will not run).
  void agree_or_throw(const std::string& local_error, const char* step, bool constructing);
  void release();  // frees what is held; safe on a partly constructed object
  void signal(Signal kind, uint32_t sequence);
  void wait(Signal kind, uint32_t sequence);
  // Queues on stream_ the copies of bytes[p] bytes from[p] -> into[p] for every other rank p with
  // bytes[p] > 0, in rank order.
  void pull(const std::array<const char*, kMaxRanks>& from, const std::array<char*, kMaxRanks>& into,
            const std::array<size_t, kMaxRanks>& bytes);
  // The registration holding `t` when this transport can carry it (contiguous f32 or bf16 on CUDA), else
  // null.
  const Registration* find(const Tensor& t) const;

  int rank_, world_, device_;
  cudaStream_t comm_stream_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
  uint32_t sequence_ = 0;
  // Inbox words, one per (signal, sender), written by the other ranks; three staging words read by the
  // copies to them.
  uint32_t* flags_ = nullptr;
  std::array<uint32_t*, kMaxRanks> remote_flags_{};  // each other rank's flag words, mapped
  char* scratch_ = nullptr;                          // world - 1 slots of scratch_slot_bytes_
  size_t scratch_slot_bytes_ = 0;
  std::vector<Registration> registrations_;
  std::vector<Mapping> mappings_;
  struct Driver;
  std::unique_ptr<Driver> driver_;
};

}  // namespace tt::dist
