// Memory for tensors. CPU: aligned malloc. CUDA: a caching allocator ordered on the compute stream, so the
// training loop never calls cudaMalloc/cudaFree once warm. Both count current and peak bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/device.h"

namespace tt {

struct MemoryStats {
  // Bytes handed out to tensors now, and the free blocks of a captured graph's pool: its replays use them.
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;      // maximum of current_bytes since the last reset_peak
  int64_t reserved_bytes = 0;  // bytes obtained from the driver (in use + cached)
  int64_t device_allocs = 0;   // calls to cudaMalloc (stays flat in a warm loop)
};

// One allocation or free, for the memory timeline (benchmark --memory-timeline).
struct MemoryEvent {
  bool is_alloc = true;
  int64_t bytes = 0;
  const void* address = nullptr;
  int64_t current_bytes = 0;
  double time_us = 0;
  std::string tag;  // the op or phase that owned the allocation (see MemoryTagGuard)
};

void* allocate_bytes(Device device, size_t bytes);
void free_bytes(Device device, void* ptr, size_t bytes);

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// Returns cached CUDA blocks to the driver (no effect on CPU).
void empty_cache(Device device);

// While a CUDA graph is captured, allocations on `device` come from (and frees return to) a private pool
// that stays reserved afterwards, so the addresses baked into the graph are never handed to anyone else.
// From the capture's end the whole pool counts as in use (MemoryStats::current_bytes): the graph holds it.
void begin_graph_pool(Device device);
void end_graph_pool(Device device);
// When the graph is gone: its free pool blocks return to the general cache, and blocks still held by
// tensors go there when those are freed.
void release_graph_pool(Device device);
// Whether a captured graph holds the pool (or a capture is under way): a second graph would share it, and
// the first one's release would hand the second's blocks to others.
bool graph_pool_held(Device device);

// Installs (or clears, with an empty function) a recorder called on every allocation and free.
void set_memory_recorder(std::function<void(const MemoryEvent&)> recorder);

// Names the owner of allocations made while it lives (nested guards restore the previous tag).
class MemoryTagGuard {
 public:
  explicit MemoryTagGuard(const char* tag);
  ~MemoryTagGuard();
  MemoryTagGuard(const MemoryTagGuard&) = delete;
  MemoryTagGuard& operator=(const MemoryTagGuard&) = delete;

 private:
  const char* previous_;
};
const char* current_memory_tag();

}  // namespace tt
