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

// Scratch for the other ranks' copies of a slice while they are added: large enough that a chunk's copy
// runs at the copy engine's full rate, small next to a model's gradients. Split into world - 1 slots.
constexpr size_t kMaxScratchBytes = size_t{64} << 20;
// Slices and chunks start at multiples of this many elements, so large tensors stay 16-byte aligned.
constexpr int64_t kSplitElements = 64;
constexpr int kFlagWords = 64;      // one allocation: inbox words [0, 3 * kMaxRanks), staging words [32, 35)
constexpr int kStagingOffset = 32;  // its own 128-byte line
static_assert(3 * PeerAllReduce::kMaxRanks <= kStagingOffset, "the inbox words overlap the staging words");
static_assert(PeerAllReduce::kMaxRanks <= cuda::kMaxAddInputs, "the add kernel takes every rank's copy");

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

// Every rank's Exchange, indexed by rank.
std::vector<Exchange> exchange_all(const Exchange& mine, int world) {
  std::vector<Exchange> all(static_cast<size_t>(world));
  TT_MPI_CHECK(MPI_Allgather(&mine, static_cast<int>(sizeof(mine)), MPI_BYTE, all.data(),
                             static_cast<int>(sizeof(mine)), MPI_BYTE, MPI_COMM_WORLD));
  return all;
}

void* open_remote(const cudaIpcMemHandle_t& handle, int rank, int owner) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error(
        "copy-engine all-reduce: rank " + std::to_string(rank) + " cannot map rank " + std::to_string(owner) +
        "'s GPU memory (cudaIpcOpenMemHandle: " + cudaGetErrorString(rc) +
        "); every pair of GPUs needs peer access (NVLink or PCIe P2P) and all must be visible to each "
        "process - use the NCCL all-reduce instead");
  }
  return ptr;
}

// The first element of slice j of n elements cut into `world` slices (slice `world` is the end).
int64_t slice_begin(int64_t n, int j, int world) {
  return j == world ? n : n * j / world / kSplitElements * kSplitElements;
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

PeerAllReduce::PeerAllReduce(int rank, int world, int device, cudaStream_t comm_stream)
    : rank_(rank), world_(world), device_(device), comm_stream_(comm_stream) {
  // Every step that can fail on one rank only is followed by an agreement, so all ranks throw together
  // (and a caller can fall back to NCCL on all) instead of some waiting for the others forever.
  Exchange mine{};
  std::string error;
  try {
    TT_CHECK(world_ >= 2 && world_ <= kMaxRanks, "copy-engine all-reduce: 2 to " + std::to_string(kMaxRanks) +
                                                     " ranks, got " + std::to_string(world_));
    set_current_device(device_);
    driver_ = std::make_unique<Driver>();
    // CUDA's default stream priority, the compute stream's too: raising either measured alike on 2 x H200.
    TT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
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
  agree_or_throw(error, "set up its part of the copy-engine all-reduce", true);
  const std::vector<Exchange> all = exchange_all(mine, world_);
  try {
    for (int p = 0; p < world_; ++p) {
      if (p != rank_) remote_flags_[p] = static_cast<uint32_t*>(open_remote(all[p].handle, rank_, p));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "map another rank's memory", true);
  // No rank signals before every inbox is mapped and zeroed.
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
  for (uint32_t*& remote : remote_flags_) {
    if (remote != nullptr) cudaIpcCloseMemHandle(remote);
    remote = nullptr;
  }
  if (scratch_ != nullptr)
    free_bytes(Device::cuda(device_), scratch_, static_cast<size_t>(world_ - 1) * scratch_slot_bytes_);
  if (flags_ != nullptr) cudaFree(flags_);
  if (begin_ != nullptr) cudaEventDestroy(begin_);
  if (end_ != nullptr) cudaEventDestroy(end_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  scratch_ = nullptr;
  scratch_slot_bytes_ = 0;
  flags_ = nullptr;
  begin_ = end_ = nullptr;
  stream_ = nullptr;
  cudaGetLastError();  // nothing above may leave an error for the next launch check to find
}

void PeerAllReduce::agree_or_throw(const std::string& local_error, const char* step, bool constructing) {
  // The lowest failing rank, or world_ when every rank succeeded.
  const int mine = local_error.empty() ? world_ : rank_;
  int failed = 0;
  TT_MPI_CHECK(MPI_Allreduce(&mine, &failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (failed == world_) return;
  if (constructing) release();  // a failed construction: the destructor will not run
  throw Error(local_error.empty()
                  ? "copy-engine all-reduce: rank " + std::to_string(failed) + " failed to " + step
                  : local_error);
}

void PeerAllReduce::register_buffer(const Tensor& buffer) {
  Exchange mine{};
  std::string error;
  char* first = static_cast<char*>(buffer.raw_data());
  try {
    TT_ASSERT(buffer.device() == Device::cuda(device_) && buffer.is_contiguous(),
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
  const std::vector<Exchange> all = exchange_all(mine, world_);
  for (int p = 0; p < world_; ++p) {
    TT_CHECK(all[p].bytes == mine.bytes, "copy-engine all-reduce: rank " + std::to_string(rank_) +
                                             " registers a buffer of " + std::to_string(mine.bytes) +
                                             " bytes, rank " + std::to_string(p) + " one of " +
                                             std::to_string(all[p].bytes));
  }
  // Everything that can fail first (mapping the other ranks' buffers, a larger scratch); the state changes
  // after every rank agrees.
  auto key_of = [](const Exchange& e) {
    std::array<char, 64> key{};
    static_assert(sizeof(e.handle) <= sizeof(key));
    std::memcpy(key.data(), &e.handle, sizeof(e.handle));
    return key;
  };
  auto find_mapping = [&](int owner, const std::array<char, 64>& key) {
    size_t i = 0;
    while (i < mappings_.size() &&
           !(mappings_[i].base != nullptr && mappings_[i].owner == owner && mappings_[i].handle == key))
      ++i;
    return i;
  };
  std::array<void*, kMaxRanks> opened{};
  void* grown = nullptr;
  const int64_t largest_slice = static_cast<int64_t>(mine.bytes) / world_ + kSplitElements * 4;
  // Slots are whole multiples of 256 bytes, so that every slot starts aligned for 16-byte accesses.
  const size_t wanted = std::min(kMaxScratchBytes / static_cast<size_t>(world_ - 1) / 256 * 256,
                                 (static_cast<size_t>(largest_slice) + 255) / 256 * 256);
  try {
    for (int p = 0; p < world_; ++p) {
      if (p != rank_ && find_mapping(p, key_of(all[p])) == mappings_.size())
        opened[p] = open_remote(all[p].handle, rank_, p);
    }
    if (wanted > scratch_slot_bytes_)
      grown = allocate_bytes(Device::cuda(device_), static_cast<size_t>(world_ - 1) * wanted);
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    agree_or_throw(error, "register its buffer", false);
  } catch (...) {
    // This rank or another failed: nothing of this registration is kept.
    for (void* o : opened) {
      if (o != nullptr) cudaIpcCloseMemHandle(o);
    }
    if (grown != nullptr) free_bytes(Device::cuda(device_), grown, static_cast<size_t>(world_ - 1) * wanted);
    cudaGetLastError();
    throw;
  }
  if (grown != nullptr) {
    // Grown to the largest slice a tensor of this buffer can have (up to the cap); the old one may still be
    // read by queued copies.
    TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (scratch_ != nullptr)
      free_bytes(Device::cuda(device_), scratch_, static_cast<size_t>(world_ - 1) * scratch_slot_bytes_);
    scratch_ = static_cast<char*>(grown);
    scratch_slot_bytes_ = wanted;
  }
  Registration reg{buffer, first, {}, mine.bytes, {}};
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) {
      reg.remote[p] = first;
      continue;
    }
    size_t index = find_mapping(p, key_of(all[p]));
    if (opened[p] != nullptr) {
      // A new mapping, in a slot freed by unregister_buffer when there is one.
      index = 0;
      while (index < mappings_.size() && mappings_[index].base != nullptr) ++index;
      if (index == mappings_.size()) mappings_.emplace_back();
      mappings_[index] = {p, key_of(all[p]), opened[p], 0};
    }
    ++mappings_[index].users;
    reg.remote[p] = static_cast<char*>(mappings_[index].base) + all[p].offset;
    reg.mapping[p] = index;
  }
  registrations_.push_back(reg);
}

void PeerAllReduce::unregister_buffer(const Tensor& buffer) {
  const char* first = static_cast<const char*>(buffer.raw_data());
  auto it = std::find_if(registrations_.begin(), registrations_.end(), [&](const Registration& r) {
    return r.local == first && r.bytes == buffer.nbytes();
  });
  TT_ASSERT(it != registrations_.end(),
            "copy-engine all-reduce: unregister_buffer of a buffer never registered");
  set_current_device(device_);
  // Every queued transfer has passed its DONE wait once the stream drains: no rank reads ours any more.
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Mapping& m = mappings_[it->mapping[p]];
    if (--m.users == 0) {
      TT_CUDA_CHECK(cudaIpcCloseMemHandle(m.base));
      m.base = nullptr;  // a free slot
    }
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
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    TT_CUDA_CHECK(cudaMemcpyAsync(remote_flags_[p] + kind * kMaxRanks + rank_, staging, sizeof(uint32_t),
                                  cudaMemcpyDefault, stream_));
  }
}

void PeerAllReduce::wait(Signal kind, uint32_t sequence) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    // The stream's own wait uses no SM; a one-warp polling kernel instead measured the same on 2 x H200.
    uint32_t* inbox = flags_ + kind * kMaxRanks + p;
    const CUresult rc =
        driver_->wait_value(reinterpret_cast<CUstream>(stream_), reinterpret_cast<CUdeviceptr>(inbox),
                            sequence, CU_STREAM_WAIT_VALUE_GEQ);
    driver_->check(rc, "cuStreamWaitValue32");
  }
}

void PeerAllReduce::pull(const std::array<const char*, kMaxRanks>& from,
                         const std::array<char*, kMaxRanks>& into,
                         const std::array<size_t, kMaxRanks>& bytes) {
  // One stream: pulls from several ranks on streams of their own (separate copy engines side by side)
  // measured no faster on 4 x H200.
  for (int p = 0; p < world_; ++p) {
    if (p != rank_ && bytes[p] > 0)
      TT_CUDA_CHECK(cudaMemcpyAsync(into[p], from[p], bytes[p], cudaMemcpyDefault, stream_));
  }
}

void PeerAllReduce::issue(Tensor& t, float scale) {
  const Registration* r = find(t);
  TT_ASSERT(r != nullptr, "copy-engine all-reduce: " + t.describe() + " is not in a registered buffer");
  const int64_t n = t.numel();
  if (n == 0) return;
  const size_t element = dtype_size(t.dtype());
  char* local = static_cast<char*>(t.raw_data());
  const size_t at = static_cast<size_t>(local - r->local);  // the tensor's offset in every rank's buffer
  const int64_t own_begin = slice_begin(n, rank_, world_), own_end = slice_begin(n, rank_ + 1, world_);
  const int64_t chunk = std::max<int64_t>(
      kSplitElements, static_cast<int64_t>(scratch_slot_bytes_ / element) / kSplitElements * kSplitElements);
  const uint32_t sequence = ++sequence_;

  // On this transport's own stream, ordered after everything queued on the communication stream so far.
  TT_CUDA_CHECK(cudaEventRecord(begin_, comm_stream_));
  TT_CUDA_CHECK(cudaStreamWaitEvent(stream_, begin_, 0));
  signal(ready, sequence);
  wait(ready, sequence);
  for (int64_t begin = own_begin; begin < own_end; begin += chunk) {
    const int64_t count = std::min(chunk, own_end - begin);
    const size_t offset = static_cast<size_t>(begin) * element, bytes = static_cast<size_t>(count) * element;
    // The ranks' copies in rank order: ours in place, the others pulled into the scratch slots.
    std::array<const void*, kMaxRanks> inputs{};
    std::array<const char*, kMaxRanks> from{};
    std::array<char*, kMaxRanks> into{};
    std::array<size_t, kMaxRanks> sizes{};
    size_t slot = 0;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) {
        inputs[p] = local + offset;
        continue;
      }
      from[p] = r->remote[p] + at + offset;
      into[p] = scratch_ + slot++ * scratch_slot_bytes_;
      sizes[p] = bytes;
      inputs[p] = into[p];
    }
    pull(from, into, sizes);
    cuda::add_ranks_scaled(local + offset, inputs.data(), world_, t.dtype(), count, scale, stream_);
  }
  signal(reduced, sequence);
  wait(reduced, sequence);
  // Every other rank's reduced slice over our copy of it.
  std::array<const char*, kMaxRanks> from{};
  std::array<char*, kMaxRanks> into{};
  std::array<size_t, kMaxRanks> sizes{};
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const int64_t begin = slice_begin(n, p, world_), end = slice_begin(n, p + 1, world_);
    const size_t offset = static_cast<size_t>(begin) * element;
    from[p] = r->remote[p] + at + offset;
    into[p] = local + offset;
    sizes[p] = static_cast<size_t>(std::max<int64_t>(0, end - begin)) * element;
  }
  pull(from, into, sizes);
  signal(done, sequence);
  wait(done, sequence);
  TT_CUDA_CHECK(cudaEventRecord(end_, stream_));
  TT_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, end_, 0));
}

}  // namespace tt::dist
