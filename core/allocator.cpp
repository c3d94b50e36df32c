#include "core/allocator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "core/cuda_context.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt {

namespace {

constexpr int kMaxDevices = 16;
constexpr size_t kCpuAlignment = 64;

std::mutex g_mutex;
MemoryStats g_cpu_stats;
std::function<void(const MemoryEvent&)> g_recorder;
thread_local const char* g_tag = "";

double now_us() {
  static const auto start = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

void record(bool is_alloc, int64_t bytes, const void* ptr, int64_t current) {
  if (g_recorder) g_recorder(MemoryEvent{is_alloc, bytes, ptr, current, now_us(), g_tag});
}

// What the host can still back with memory: MemAvailable + SwapFree from /proc/meminfo, in bytes; -1 where
// it cannot be read. Linux grants a large allocation without backing it, so a tensor larger than this would
// be written into until the kernel's OOM killer ends the process with no message.
int64_t host_bytes_available() {
  std::FILE* file = std::fopen("/proc/meminfo", "r");
  if (!file) return -1;
  char line[256];
  int64_t total_kib = 0;
  int found = 0;
  while (std::fgets(line, sizeof(line), file)) {
    long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1 ||
        std::sscanf(line, "SwapFree: %lld kB", &kib) == 1) {
      total_kib += kib;
      ++found;
    }
  }
  std::fclose(file);
  return found == 2 ? total_kib * 1024 : -1;
}

// Large host allocations only: reading /proc/meminfo costs microseconds.
constexpr size_t kCheckHostBytesFrom = size_t{64} << 20;

void count_alloc(MemoryStats& stats, int64_t bytes) {
  stats.current_bytes += bytes;
  if (stats.current_bytes > stats.peak_bytes) stats.peak_bytes = stats.current_bytes;
}

#ifdef TT_WITH_CUDA
// Blocks are reused only by exactly the rounded size class (small) or by a cached block at most 25% larger
// (large), which keeps waste bounded while a training loop's fixed shapes hit the cache every step. All
// tensors are used on the device's compute stream, so a block freed on the host after its last kernel was
// enqueued can be handed to the next kernel on that stream without waiting.
struct CudaCache {
  std::multimap<size_t, void*> free_blocks;        // rounded size -> block
  std::multimap<size_t, void*> graph_free_blocks;  // the same for the graph pool
  std::unordered_map<void*, size_t> block_size;    // every live or cached block
  std::unordered_map<void*, bool> in_graph_pool;   // blocks reserved for captured graphs
  bool capturing = false;
  // After a capture, until release_graph_pool: the graph holds its pool, and its free blocks' bytes count in
  // stats.current_bytes.
  bool graph_held = false;
  int64_t graph_free_bytes = 0;
  MemoryStats stats;
};
CudaCache g_cuda[kMaxDevices];

size_t round_size(size_t bytes) {
  constexpr size_t kSmall = 1 << 20, kSmallUnit = 512, kLargeUnit = 2 << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmall) return (bytes + kSmallUnit - 1) / kSmallUnit * kSmallUnit;
  return (bytes + kLargeUnit - 1) / kLargeUnit * kLargeUnit;
}

void release_cached(CudaCache& cache) {
  for (auto& [size, ptr] : cache.free_blocks) {
    cudaFree(ptr);  // synchronises the device; only reached on OOM or an explicit empty_cache
    cache.block_size.erase(ptr);
    cache.stats.reserved_bytes -= static_cast<int64_t>(size);
  }
  cache.free_blocks.clear();
}

void* cuda_allocate(int device, size_t bytes) {
  CudaCache& cache = g_cuda[device];
  const size_t rounded = round_size(bytes);
  std::multimap<size_t, void*>& pool = cache.capturing ? cache.graph_free_blocks : cache.free_blocks;
  auto it = pool.lower_bound(rounded);
  const size_t slack = rounded <= (1 << 20) ? 0 : rounded / 4;
  if (it != pool.end() && it->first <= rounded + slack) {
    void* ptr = it->second;
    pool.erase(it);
    const auto size = static_cast<int64_t>(cache.block_size[ptr]);
    if (cache.capturing && cache.graph_held) {
      cache.graph_free_bytes -= size;  // counted already, as a held graph's
    } else {
      count_alloc(cache.stats, size);
    }
    return ptr;
  }
  set_current_device(device);
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, rounded);
  if (err == cudaErrorMemoryAllocation && !cache.capturing) {  // cudaFree is not allowed while capturing
    cudaGetLastError();
    release_cached(cache);
    err = cudaMalloc(&ptr, rounded);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw OutOfMemory("CUDA out of memory on cuda:" + std::to_string(device) + " allocating " +
                      std::to_string(rounded >> 20) + " MiB (in use " +
                      std::to_string(cache.stats.current_bytes >> 20) + " MiB, reserved " +
                      std::to_string(cache.stats.reserved_bytes >> 20) + " MiB)");
  }
  cache.block_size[ptr] = rounded;
  if (cache.capturing) cache.in_graph_pool[ptr] = true;
  cache.stats.reserved_bytes += static_cast<int64_t>(rounded);
  cache.stats.device_allocs += 1;
  count_alloc(cache.stats, static_cast<int64_t>(rounded));
  return ptr;
}

void cuda_free(int device, void* ptr) {
  CudaCache& cache = g_cuda[device];
  const size_t size = cache.block_size.at(ptr);
  const bool pool = cache.in_graph_pool.count(ptr) > 0;
  if (pool && cache.graph_held) {
    cache.graph_free_bytes += static_cast<int64_t>(size);  // still the graph's: stays counted
  } else {
    cache.stats.current_bytes -= static_cast<int64_t>(size);
  }
  (pool ? cache.graph_free_blocks : cache.free_blocks).emplace(size, ptr);
}
#endif

}  // namespace

void* allocate_bytes(Device device, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  if (device.is_cpu() && rounded >= kCheckHostBytesFrom) {  // before the lock: other threads need not wait
    const int64_t available = host_bytes_available();
    if (available >= 0 && static_cast<int64_t>(rounded) > available)
      throw OutOfMemory("out of host memory allocating " + std::to_string(bytes) +
                        " bytes (the machine has " + std::to_string(available) + " free)");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (device.is_cpu()) {
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (!ptr) throw OutOfMemory("out of host memory allocating " + std::to_string(bytes) + " bytes");
    count_alloc(g_cpu_stats, static_cast<int64_t>(bytes));
    record(true, static_cast<int64_t>(bytes), ptr, g_cpu_stats.current_bytes);
    return ptr;
  }
#ifdef TT_WITH_CUDA
  TT_CHECK(device.index >= 0 && device.index < kMaxDevices, "bad CUDA device index");
  void* ptr = cuda_allocate(device.index, bytes);
  record(true, static_cast<int64_t>(g_cuda[device.index].block_size[ptr]), ptr,
         g_cuda[device.index].stats.current_bytes);
  return ptr;
#else
  throw Error("this build has no CUDA support (device " + device.str() + ")");
#endif
}

void free_bytes(Device device, void* ptr, size_t bytes) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (device.is_cpu()) {
    g_cpu_stats.current_bytes -= static_cast<int64_t>(bytes);
    record(false, static_cast<int64_t>(bytes), ptr, g_cpu_stats.current_bytes);
    std::free(ptr);
    return;
  }
#ifdef TT_WITH_CUDA
  const int64_t size = static_cast<int64_t>(g_cuda[device.index].block_size.at(ptr));
  cuda_free(device.index, ptr);
  record(false, size, ptr, g_cuda[device.index].stats.current_bytes);
#endif
}

MemoryStats memory_stats(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
#ifdef TT_WITH_CUDA
  if (device.is_cuda()) return g_cuda[device.index].stats;
#endif
  return g_cpu_stats;
}

void reset_peak_memory(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& stats = device.is_cpu() ? g_cpu_stats
#ifdef TT_WITH_CUDA
                                       : g_cuda[device.index].stats;
#else
                                       : g_cpu_stats;
#endif
  stats.peak_bytes = stats.current_bytes;
}

void empty_cache(Device device) {
#ifdef TT_WITH_CUDA
  std::lock_guard<std::mutex> lock(g_mutex);
  if (device.is_cuda()) release_cached(g_cuda[device.index]);
#endif
}

void begin_graph_pool(Device device) {
#ifdef TT_WITH_CUDA
  std::lock_guard<std::mutex> lock(g_mutex);
  if (device.is_cuda()) g_cuda[device.index].capturing = true;
#endif
}

void end_graph_pool(Device device) {
#ifdef TT_WITH_CUDA
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!device.is_cuda()) return;
  CudaCache& cache = g_cuda[device.index];
  cache.capturing = false;
  if (cache.graph_held) return;  // a second graph beside the first: the pool's free bytes count already
  cache.graph_held = true;
  cache.graph_free_bytes = 0;
  for (const auto& [size, ptr] : cache.graph_free_blocks)
    cache.graph_free_bytes += static_cast<int64_t>(size);
  count_alloc(cache.stats, cache.graph_free_bytes);
#endif
}

bool graph_pool_held(Device device) {
#ifdef TT_WITH_CUDA
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!device.is_cuda()) return false;
  const CudaCache& cache = g_cuda[device.index];
  return cache.graph_held || cache.capturing;
#else
  (void)device;
  return false;
#endif
}

void release_graph_pool(Device device) {
#ifdef TT_WITH_CUDA
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!device.is_cuda()) return;
  CudaCache& cache = g_cuda[device.index];
  if (cache.graph_held) cache.stats.current_bytes -= cache.graph_free_bytes;
  cache.graph_held = false;
  cache.graph_free_bytes = 0;
  cache.free_blocks.insert(cache.graph_free_blocks.begin(), cache.graph_free_blocks.end());
  cache.graph_free_blocks.clear();
  cache.in_graph_pool.clear();
#endif
}

void set_memory_recorder(std::function<void(const MemoryEvent&)> recorder) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_recorder = std::move(recorder);
}

MemoryTagGuard::MemoryTagGuard(const char* tag) : previous_(g_tag) {
  g_tag = tag;
}
MemoryTagGuard::~MemoryTagGuard() {
  g_tag = previous_;
}
const char* current_memory_tag() {
  return g_tag;
}

}  // namespace tt
