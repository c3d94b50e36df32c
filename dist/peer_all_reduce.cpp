#include "dist/peer_all_reduce.h"

#include <cuda.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/allocator.h"
#include "core/cuda_context.h"
#include "dist/mpi_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tt::dist {

namespace {

// Scratch for the peer's half while it is added: large enough that a chunk's copy runs at the copy engine's
// full rate, small next to a model's gradients.
constexpr size_t kMaxScratchBytes = size_t{64} << 20;
// Halves and chunks start at multiples of this many elements, so large tensors stay 16-byte aligned.
constexpr int64_t kSplitElements = 64;
constexpr int kFlagWords = 64;      // one allocation: inbox words [0, 3), staging words [32, 35)
constexpr int kStagingOffset = 32;  // its own 128-byte line

template <class F>
F driver_function(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  TT_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status));
  TT_CHECK(status == cudaDriverEntryPointSuccess && fn != nullptr,
           std::string("copy-engine all-reduce: the CUDA driver does not provide ") + name);
  return reinterpret_cast<F>(fn);
}

struct Exchange {
  cudaIpcMemHandle_t handle;
  uint64_t offset = 0;  // bytes from the allocation's start to the buffer
  uint64_t bytes = 0;
};

Exchange swap_with_peer(const Exchange& mine, int rank) {
  Exchange theirs{};
  TT_MPI_CHECK(MPI_Sendrecv(&mine, static_cast<int>(sizeof(mine)), MPI_BYTE, 1 - rank, 71, &theirs,
                            static_cast<int>(sizeof(theirs)), MPI_BYTE, 1 - rank, 71, MPI_COMM_WORLD,
                            MPI_STATUS_IGNORE));
  return theirs;
}

void* open_peer(const cudaIpcMemHandle_t& handle, int rank) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error("copy-engine all-reduce: rank " + std::to_string(rank) + " cannot map rank " +
                std::to_string(1 - rank) + "'s GPU memory (cudaIpcOpenMemHandle: " + cudaGetErrorString(rc) +
                "); the two GPUs need peer access (NVLink or PCIe P2P) and must both be visible to each "
                "process - use the NCCL all-reduce instead");
  }
  return ptr;
}

std::string env_or(const char* name, const char* fallback) {
  const char* text = std::getenv(name);
  return text == nullptr || *text == '\0' ? fallback : text;
}

}  // namespace

struct PeerAllReduce::Driver {
  using StreamValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  using ErrorName = CUresult (*)(CUresult, const char**);
  StreamValue32 wait_value = driver_function<StreamValue32>("cuStreamWaitValue32");
  StreamValue32 write_value = driver_function<StreamValue32>("cuStreamWriteValue32");
  ErrorName error_name = driver_function<ErrorName>("cuGetErrorName");

  void check(CUresult rc, const char* call) const {
    if (rc == CUDA_SUCCESS) return;
    const char* name = nullptr;
    if (error_name(rc, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown error";
    throw Error(std::string("copy-engine all-reduce: ") + call + " failed: " + name + " (" +
                std::to_string(rc) + ")");
  }
};

PeerAllReduce::PeerAllReduce(int rank, int device, cudaStream_t comm_stream)
    : rank_(rank), device_(device), comm_stream_(comm_stream) {
  // Every step that can fail on one rank only is followed by an agreement, so both ranks throw together
  // (and a caller can fall back to NCCL on both) instead of one waiting for the other forever.
  Exchange mine{};
  std::string error;
  try {
    set_current_device(device_);
    driver_ = std::make_unique<Driver>();
    const std::string priority = env_or("TT_COPY_ENGINE_PRIORITY", "low");
    TT_CHECK(priority == "low" || priority == "high",
             "TT_COPY_ENGINE_PRIORITY must be low or high, got '" + priority + "'");
    const std::string wait = env_or("TT_COPY_ENGINE_WAIT", "stream");
    TT_CHECK(wait == "stream" || wait == "kernel",
             "TT_COPY_ENGINE_WAIT must be stream or kernel, got '" + wait + "'");
    kernel_wait_ = wait == "kernel";
    int least = 0, greatest = 0;
    TT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    TT_CUDA_CHECK(
        cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority == "low" ? least : greatest));
    TT_CUDA_CHECK(cudaEventCreateWithFlags(&begin_, cudaEventDisableTiming));
    TT_CUDA_CHECK(cudaEventCreateWithFlags(&end_, cudaEventDisableTiming));
    TT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&flags_), kFlagWords * sizeof(uint32_t)));
    TT_CUDA_CHECK(cudaMemset(flags_, 0, kFlagWords * sizeof(uint32_t)));
    TT_CUDA_CHECK(cudaDeviceSynchronize());
    TT_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, flags_));
    mine.bytes = kFlagWords * sizeof(uint32_t);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "set up its half of the copy-engine all-reduce", true);
  const Exchange theirs = swap_with_peer(mine, rank_);
  try {
    peer_flags_ = static_cast<uint32_t*>(open_peer(theirs.handle, rank_));
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "map this rank's memory", true);
  // Neither rank signals before both inboxes are mapped and zeroed.
  TT_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

PeerAllReduce::~PeerAllReduce() {
  set_current_device(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  release();
}

void PeerAllReduce::release() {
  for (Mapping& m : mappings_) {
    if (m.base != nullptr) cudaIpcCloseMemHandle(m.base);
    m.base = nullptr;
  }
  if (peer_flags_ != nullptr) cudaIpcCloseMemHandle(peer_flags_);
  if (scratch_ != nullptr) free_bytes(Device::cuda(device_), scratch_, scratch_bytes_);
  if (flags_ != nullptr) cudaFree(flags_);
  if (begin_ != nullptr) cudaEventDestroy(begin_);
  if (end_ != nullptr) cudaEventDestroy(end_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  peer_flags_ = nullptr;
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  flags_ = nullptr;
  begin_ = end_ = nullptr;
  stream_ = nullptr;
  cudaGetLastError();  // nothing above may leave an error for the next launch check to find
}

void PeerAllReduce::agree_or_throw(const std::string& local_error, const char* step, bool constructing) {
  const int ok = local_error.empty() ? 1 : 0;
  int all = 0;
  TT_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (all == 1) return;
  if (constructing) release();  // a failed construction: the destructor will not run
  throw Error(local_error.empty()
                  ? "copy-engine all-reduce: rank " + std::to_string(1 - rank_) + " failed to " + step
                  : local_error);
}

void PeerAllReduce::register_buffer(const Tensor& buffer) {
  Exchange mine{};
  std::string error;
  char* first = static_cast<char*>(buffer.raw_data());
  try {
    TT_CHECK(buffer.device() == Device::cuda(device_) && buffer.is_contiguous(),
             "copy-engine all-reduce: register_buffer needs a contiguous tensor on " +
                 Device::cuda(device_).str() + ", got " + buffer.describe());
    set_current_device(device_);
    char* base = static_cast<char*>(buffer.storage()->data());
    TT_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, base));
    mine.offset = static_cast<uint64_t>(first - base);
    mine.bytes = buffer.nbytes();
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "register its buffer", false);
  const Exchange theirs = swap_with_peer(mine, rank_);
  TT_CHECK(theirs.bytes == mine.bytes, "copy-engine all-reduce: rank " + std::to_string(rank_) +
                                           " registers a buffer of " + std::to_string(mine.bytes) +
                                           " bytes, rank " + std::to_string(1 - rank_) + " one of " +
                                           std::to_string(theirs.bytes));
  std::array<char, 64> key{};
  static_assert(sizeof(theirs.handle) <= sizeof(key));
  std::memcpy(key.data(), &theirs.handle, sizeof(theirs.handle));
  // Everything that can fail first (mapping the peer's buffer, a larger scratch); the state changes after
  // both ranks agree.
  size_t index = 0;
  while (index < mappings_.size() && !(mappings_[index].base != nullptr && mappings_[index].handle == key))
    ++index;
  void* opened = nullptr;
  void* grown = nullptr;
  const size_t wanted = std::min(kMaxScratchBytes, (mine.bytes / 2 + 511) / 256 * 256);
  try {
    if (index == mappings_.size()) opened = open_peer(theirs.handle, rank_);
    if (wanted > scratch_bytes_) grown = allocate_bytes(Device::cuda(device_), wanted);
  } catch (const std::exception& e) {
    error = e.what();
    if (opened != nullptr) cudaIpcCloseMemHandle(opened);
    cudaGetLastError();
  }
  agree_or_throw(error, "register its buffer", false);
  if (opened != nullptr) {
    // A new mapping, in a slot freed by unregister_buffer when there is one.
    index = 0;
    while (index < mappings_.size() && mappings_[index].base != nullptr) ++index;
    if (index == mappings_.size()) mappings_.emplace_back();
    mappings_[index] = {key, opened, 0};
  }
  ++mappings_[index].users;
  if (grown != nullptr) {
    // Grown to the largest half a tensor of this buffer can have (up to the cap); the old one may still be
    // read by queued copies.
    TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (scratch_ != nullptr) free_bytes(Device::cuda(device_), scratch_, scratch_bytes_);
    scratch_ = static_cast<char*>(grown);
    scratch_bytes_ = wanted;
  }
  registrations_.push_back(
      {buffer, first, static_cast<char*>(mappings_[index].base) + theirs.offset, mine.bytes, index});
}

void PeerAllReduce::unregister_buffer(const Tensor& buffer) {
  const char* first = static_cast<const char*>(buffer.raw_data());
  auto it = std::find_if(registrations_.begin(), registrations_.end(), [&](const Registration& r) {
    return r.local == first && r.bytes == buffer.nbytes();
  });
  TT_CHECK(it != registrations_.end(),
           "copy-engine all-reduce: unregister_buffer of a buffer never registered");
  set_current_device(device_);
  // Every queued transfer has passed its DONE wait once the stream drains: the peer no longer reads ours.
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  Mapping& m = mappings_[it->mapping];
  if (--m.users == 0) {
    TT_CUDA_CHECK(cudaIpcCloseMemHandle(m.base));
    m.base = nullptr;  // a free slot
  }
  registrations_.erase(it);
}

const PeerAllReduce::Registration* PeerAllReduce::find(const Tensor& t) const {
  if (!t.device().is_cuda() || !t.is_contiguous() || (t.dtype() != DType::f32 && t.dtype() != DType::bf16))
    return nullptr;
  const char* first = static_cast<const char*>(t.raw_data());
  for (const Registration& r : registrations_) {
    if (first >= r.local && first + t.nbytes() <= r.local + r.bytes) return &r;
  }
  return nullptr;
}

bool PeerAllReduce::covers(const Tensor& t) const {
  return find(t) != nullptr;
}

void PeerAllReduce::signal(Signal kind, uint32_t sequence) {
  uint32_t* staging = flags_ + kStagingOffset + kind;
  const CUresult rc = driver_->write_value(reinterpret_cast<CUstream>(stream_),
                                           reinterpret_cast<CUdeviceptr>(staging), sequence, 0);
  driver_->check(rc, "cuStreamWriteValue32");
  TT_CUDA_CHECK(cudaMemcpyAsync(peer_flags_ + kind, staging, sizeof(uint32_t), cudaMemcpyDefault, stream_));
}

void PeerAllReduce::wait(Signal kind, uint32_t sequence) {
  if (kernel_wait_) {
    cuda::wait_flag_at_least(flags_ + kind, sequence, stream_);
    return;
  }
  const CUresult rc =
      driver_->wait_value(reinterpret_cast<CUstream>(stream_), reinterpret_cast<CUdeviceptr>(flags_ + kind),
                          sequence, CU_STREAM_WAIT_VALUE_GEQ);
  driver_->check(rc, "cuStreamWaitValue32");
}

void PeerAllReduce::issue(Tensor& t, float scale) {
  const Registration* r = find(t);
  TT_CHECK(r != nullptr, "copy-engine all-reduce: " + t.describe() + " is not in a registered buffer");
  const int64_t n = t.numel();
  if (n == 0) return;
  const size_t element = dtype_size(t.dtype());
  char* local = static_cast<char*>(t.raw_data());
  const char* peer = r->peer + (local - r->local);
  // Rank 0 reduces [0, split), rank 1 [split, n).
  const int64_t split = n / 2 / kSplitElements * kSplitElements;
  const int64_t own_begin = rank_ == 0 ? 0 : split, own_end = rank_ == 0 ? split : n;
  const int64_t peer_begin = rank_ == 0 ? split : 0, peer_end = rank_ == 0 ? n : split;
  const int64_t chunk = std::max<int64_t>(
      kSplitElements, static_cast<int64_t>(scratch_bytes_ / element) / kSplitElements * kSplitElements);
  const uint32_t sequence = ++sequence_;

  // On this transport's own stream, ordered after everything queued on the communication stream so far.
  TT_CUDA_CHECK(cudaEventRecord(begin_, comm_stream_));
  TT_CUDA_CHECK(cudaStreamWaitEvent(stream_, begin_, 0));
  signal(ready, sequence);
  wait(ready, sequence);
  for (int64_t begin = own_begin; begin < own_end; begin += chunk) {
    const int64_t count = std::min(chunk, own_end - begin);
    const size_t offset = static_cast<size_t>(begin) * element, bytes = static_cast<size_t>(count) * element;
    TT_CUDA_CHECK(cudaMemcpyAsync(scratch_, peer + offset, bytes, cudaMemcpyDefault, stream_));
    cuda::add_pair_scaled(local + offset, scratch_, t.dtype(), count, scale, stream_);
  }
  signal(reduced, sequence);
  wait(reduced, sequence);
  if (peer_end > peer_begin) {
    const size_t offset = static_cast<size_t>(peer_begin) * element;
    TT_CUDA_CHECK(cudaMemcpyAsync(local + offset, peer + offset,
                                  static_cast<size_t>(peer_end - peer_begin) * element, cudaMemcpyDefault,
                                  stream_));
  }
  signal(done, sequence);
  wait(done, sequence);
  TT_CUDA_CHECK(cudaEventRecord(end_, stream_));
  TT_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, end_, 0));
}

}  // namespace tt::dist
