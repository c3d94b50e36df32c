// Attention of a few new queries over a key/value cache, and the cache's batched write: the decode step of
// generation, the twins of kernels/cpu/decode_attention.cpp. A decode step has one query per sequence and
// head, so the work is reading the cache once (memory-bound): one block per (entry, query, head) walks that
// row's cached positions with an online softmax (f32 running max, sum and weighted values), its lanes in
// groups of one key each, and the groups' partial results are merged at the end.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace tt::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kAttentionThreads = 128;
// Keys a lane group loads before it reduces any of their scores: loads in flight hide the memory latency.
constexpr int kKeysPerGroup = 4;
// d_head beyond the vectorised sizes: lanes take features lane, lane + 32, ...; up to this many each.
constexpr int kGenericPerLane = 16;
constexpr int64_t kMaxGenericDHead = 32 * kGenericPerLane;
constexpr int kAppendThreads = 256;

// Where each entry's tokens live: a device table read by the kernels (not kernel arguments), so a CUDA graph
// of the decode step replays with the entries copied into that table before each replay.
struct CacheEntries {
  const int32_t* rows;    // n of them
  const int32_t* starts;  // n of them
};

// A lane's kPerLane features of one head: consecutive ones loaded 16 bytes at a time (kVectorized), or
// features lane, lane + kLanes, ... (any d_head, any alignment; those past d_head read as 0).
template <class T, int kLanes, int kPerLane, bool kVectorized>
__device__ inline int feature_of(int lane_in_group, int c) {
  return kVectorized ? lane_in_group * kPerLane + c : lane_in_group + kLanes * c;
}

template <class T, int kLanes, int kPerLane, bool kVectorized>
__device__ inline void load_features(const T* head, int lane_in_group, [[maybe_unused]] int d_head,
                                     float (&v)[kPerLane]) {
  if constexpr (kVectorized) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    static_assert(kPerLane % kVec == 0, "a lane's features are whole 16-byte vectors");
#pragma unroll
    for (int c = 0; c < kPerLane / kVec; ++c) {
      float part[kVec];
      load_w<kVec>(head + lane_in_group * kPerLane, c, part);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[c * kVec + e] = part[e];
    }
  } else {
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int e = feature_of<T, kLanes, kPerLane, kVectorized>(lane_in_group, c);
      v[c] = e < d_head ? to_float(head[e]) : 0.0f;
    }
  }
}

// Block (head, query j, entry i): out[i, j, head] = softmax(scale * q k^T) v over positions
// 0 .. starts[i] + j of cache row rows[i]. Groups of kLanes lanes each take one key at a time; a warp walks
// kGroupsPerWarp * kKeysPerGroup consecutive keys per step, the block's warps interleaved.
template <class T, int kLanes, int kPerLane, bool kVectorized>
__global__ void __launch_bounds__(kAttentionThreads)
    cached_attention_kernel(const T* __restrict__ q, const T* __restrict__ keys, const T* __restrict__ values,
                            T* __restrict__ out, int count, int heads, int d_head, int64_t capacity,
                            float scale, const CacheEntries entries) {
  constexpr int kGroupsPerWarp = 32 / kLanes;
  constexpr int kGroups = kAttentionThreads / kLanes;
  constexpr int kFeatures = kLanes * kPerLane;  // the widest d_head this instance takes
  constexpr int kWarpKeys = kGroupsPerWarp * kKeysPerGroup;
  __shared__ float group_max[kGroups], group_sum[kGroups];
  __shared__ float group_acc[kGroups * kFeatures];

  const int head = static_cast<int>(blockIdx.x), j = static_cast<int>(blockIdx.y);
  const int entry = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group_in_warp = lane / kLanes, lane_in_group = lane % kLanes;
  const int group = warp * kGroupsPerWarp + group_in_warp;
  const int64_t dim = static_cast<int64_t>(heads) * d_head;
  const int64_t token = static_cast<int64_t>(entry) * count + j;
  const int64_t seen = static_cast<int64_t>(entries.starts[entry]) + j + 1;
  const int64_t row_offset = static_cast<int64_t>(entries.rows[entry]) * capacity * dim + head * d_head;

  float query[kPerLane];
  load_features<T, kLanes, kPerLane, kVectorized>(q + token * dim + head * d_head, lane_in_group, d_head,
                                                  query);
  float running_max = -INFINITY, running_sum = 0.0f, acc[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0.0f;

  // The loop bound is the same for the whole warp, so every lane reaches the shuffles.
  for (int64_t base = static_cast<int64_t>(warp) * kWarpKeys; base < seen;
       base += static_cast<int64_t>(kAttentionThreads / 32) * kWarpKeys) {
    float k[kKeysPerGroup][kPerLane], v[kKeysPerGroup][kPerLane], score[kKeysPerGroup];
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; ++u) {
      const int64_t t = base + u * kGroupsPerWarp + group_in_warp;
      if (t < seen) {
        load_features<T, kLanes, kPerLane, kVectorized>(keys + row_offset + t * dim, lane_in_group, d_head,
                                                        k[u]);
        load_features<T, kLanes, kPerLane, kVectorized>(values + row_offset + t * dim, lane_in_group, d_head,
                                                        v[u]);
      } else {
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) k[u][c] = v[u][c] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; ++u) {
      score[u] = 0.0f;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) score[u] = fmaf(query[c], k[u][c], score[u]);
    }
    // The group's lanes sum their parts; every lane of the group ends with the same score.
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; ++u) score[u] += __shfl_xor_sync(kFullMask, score[u], offset);
    }
    float chunk_max = running_max;
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; ++u) {
      const int64_t t = base + u * kGroupsPerWarp + group_in_warp;
      score[u] = t < seen ? score[u] * scale : -INFINITY;
      chunk_max = fmaxf(chunk_max, score[u]);
    }
    if (chunk_max != -INFINITY) {  // else: no key for this group yet (its keys lie past the end)
      // One rescale per step: what was summed against the old max is scaled to the new one.
      const float correction = expf(running_max - chunk_max);
      running_sum *= correction;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) acc[c] *= correction;
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; ++u) {
        const float p = expf(score[u] - chunk_max);
        running_sum += p;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) acc[c] = fmaf(p, v[u][c], acc[c]);
      }
      running_max = chunk_max;
    }
  }

  if (lane_in_group == 0) {
    group_max[group] = running_max;
    group_sum[group] = running_sum;
  }
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    group_acc[group * kFeatures + feature_of<T, kLanes, kPerLane, kVectorized>(lane_in_group, c)] = acc[c];
  }
  __syncthreads();
  // Merge the groups: each is weighted by exp(its max - the overall max). Every group that saw a key has a
  // finite max, and position 0 is always seen, so the overall max is finite.
  float overall_max = -INFINITY;
  for (int g = 0; g < kGroups; ++g) overall_max = fmaxf(overall_max, group_max[g]);
  T* o = out + token * dim + head * d_head;
  for (int e = static_cast<int>(threadIdx.x); e < d_head; e += kAttentionThreads) {
    float total = 0.0f, weighted = 0.0f;
    for (int g = 0; g < kGroups; ++g) {
      const float w = group_max[g] == -INFINITY ? 0.0f : expf(group_max[g] - overall_max);
      total = fmaf(group_sum[g], w, total);
      weighted = fmaf(group_acc[g * kFeatures + e], w, weighted);
    }
    o[e] = from_float<T>(weighted / total);
  }
}

template <class T, int kLanes, int kPerLane, bool kVectorized>
void launch_attention(const void* q, const void* keys, const void* values, void* out, int64_t count,
                      int64_t heads, int64_t d_head, int64_t capacity, float scale,
                      const CacheEntries& entries, int64_t n, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(count), static_cast<unsigned>(n));
  cached_attention_kernel<T, kLanes, kPerLane, kVectorized><<<grid, kAttentionThreads, 0, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(keys), static_cast<const T*>(values),
      static_cast<T*>(out), static_cast<int>(count), static_cast<int>(heads), static_cast<int>(d_head),
      capacity, scale, entries);
  TT_CUDA_LAUNCH_CHECK();
}

// The instance for a d_head of kDHead loaded 16 bytes at a time: as many lanes per key as take one vector
// each (up to a warp), more vectors per lane beyond that.
template <class T, int kDHead>
void launch_vectorized(const void* q, const void* keys, const void* values, void* out, int64_t count,
                       int64_t heads, int64_t capacity, float scale, const CacheEntries& entries, int64_t n,
                       cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kLanes = std::min(32, kDHead / kVec);
  launch_attention<T, kLanes, kDHead / kLanes, true>(q, keys, values, out, count, heads, kDHead, capacity,
                                                     scale, entries, n, stream);
}

template <class T>
void attention_of_type(const void* q, const void* keys, const void* values, void* out, int64_t count,
                       int64_t heads, int64_t d_head, int64_t capacity, float scale,
                       const CacheEntries& entries, int64_t n, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // With 16-byte aligned bases, heads and rows of these sizes start on 16-byte boundaries too.
  if (aligned(q) && aligned(keys) && aligned(values) && aligned(out)) {
    auto vectorized = [&](auto size) {
      launch_vectorized<T, decltype(size)::value>(q, keys, values, out, count, heads, capacity, scale,
                                                  entries, n, stream);
    };
    switch (d_head) {
      case 16:
        return vectorized(std::integral_constant<int, 16>{});
      case 32:
        return vectorized(std::integral_constant<int, 32>{});
      case 64:
        return vectorized(std::integral_constant<int, 64>{});
      case 128:
        return vectorized(std::integral_constant<int, 128>{});
      case 256:
        return vectorized(std::integral_constant<int, 256>{});
      default:
        break;
    }
  }
  launch_attention<T, 32, kGenericPerLane, false>(q, keys, values, out, count, heads, d_head, capacity, scale,
                                                  entries, n, stream);
}

// A launch's grid takes up to this many entries (its y or z dimension); more go in several launches.
constexpr int64_t kEntriesPerLaunch = 65535;

// Entries first .. of the table of n: its two halves are rows, then starts.
CacheEntries entries_of(const int32_t* table, int64_t n, int64_t first) {
  return CacheEntries{table + first, table + n + first};
}

// Each entry's `count` tokens are one contiguous span of the cache row: a flat copy of `units` per entry.
template <class Unit>
__global__ void __launch_bounds__(kAppendThreads)
    cache_append_kernel(Unit* __restrict__ store, const Unit* __restrict__ src, int64_t units_per_entry,
                        int64_t units_per_position, int64_t capacity, const CacheEntries entries) {
  const int entry = static_cast<int>(blockIdx.y);
  Unit* dst = store + (static_cast<int64_t>(entries.rows[entry]) * capacity + entries.starts[entry]) *
                          units_per_position;
  const Unit* from = src + entry * units_per_entry;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units_per_entry;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[u] = from[u];
  }
}

template <class Unit>
void launch_append(void* store, const void* src, int64_t bytes_per_position, int64_t count, int64_t capacity,
                   const CacheEntries& entries, int64_t n, cudaStream_t stream) {
  const int64_t units_per_position = bytes_per_position / static_cast<int64_t>(sizeof(Unit));
  const int64_t units_per_entry = units_per_position * count;
  const int64_t blocks = std::min<int64_t>((units_per_entry + kAppendThreads - 1) / kAppendThreads, 1024);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(n));
  cache_append_kernel<Unit>
      <<<grid, kAppendThreads, 0, stream>>>(static_cast<Unit*>(store), static_cast<const Unit*>(src),
                                            units_per_entry, units_per_position, capacity, entries);
  TT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void cached_attention(const void* q, const void* keys, const void* values, void* out, DType type,
                      const int32_t* table, int64_t n, int64_t count, int64_t heads, int64_t d_head,
                      int64_t capacity, double scale, cudaStream_t stream) {
  TT_ASSERT(type == DType::f32 || type == DType::bf16, "cuda::cached_attention: f32 or bf16");
  TT_CHECK(d_head >= 1 && d_head <= kMaxGenericDHead, "cached attention on CUDA takes d_head up to " +
                                                          std::to_string(kMaxGenericDHead) + ", got " +
                                                          std::to_string(d_head));
  TT_CHECK(count <= 65535 && heads <= INT32_MAX && capacity <= INT32_MAX,
           "cached attention on CUDA takes up to 65535 new tokens per step, got " + std::to_string(count));
  if (n == 0 || count == 0 || heads == 0) return;
  const size_t bytes_per_entry = static_cast<size_t>(count * heads * d_head) * dtype_size(type);
  for (int64_t first = 0; first < n; first += kEntriesPerLaunch) {
    const int64_t part = std::min(kEntriesPerLaunch, n - first);
    const CacheEntries entries = entries_of(table, n, first);
    const void* q_part = static_cast<const char*>(q) + static_cast<size_t>(first) * bytes_per_entry;
    void* out_part = static_cast<char*>(out) + static_cast<size_t>(first) * bytes_per_entry;
    if (type == DType::f32) {
      attention_of_type<float>(q_part, keys, values, out_part, count, heads, d_head, capacity,
                               static_cast<float>(scale), entries, part, stream);
    } else {
      attention_of_type<__nv_bfloat16>(q_part, keys, values, out_part, count, heads, d_head, capacity,
                                       static_cast<float>(scale), entries, part, stream);
    }
  }
}

void cache_append(void* store, const void* src, int64_t elem_bytes, const int32_t* table, int64_t n,
                  int64_t count, int64_t capacity, int64_t dim, cudaStream_t stream) {
  TT_ASSERT(elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8,
            "cuda::cache_append: 2, 4 or 8-byte elements");
  if (n == 0 || count == 0 || dim == 0) return;
  const int64_t bytes_per_position = dim * elem_bytes;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool wide = bytes_per_position % 16 == 0 && aligned(store) && aligned(src);
  for (int64_t first = 0; first < n; first += kEntriesPerLaunch) {
    const int64_t part = std::min(kEntriesPerLaunch, n - first);
    const CacheEntries entries = entries_of(table, n, first);
    const void* src_part = static_cast<const char*>(src) + first * count * bytes_per_position;
    if (wide) {
      launch_append<uint4>(store, src_part, bytes_per_position, count, capacity, entries, part, stream);
    } else if (elem_bytes == 2) {
      launch_append<uint16_t>(store, src_part, bytes_per_position, count, capacity, entries, part, stream);
    } else if (elem_bytes == 4) {
      launch_append<uint32_t>(store, src_part, bytes_per_position, count, capacity, entries, part, stream);
    } else {
      launch_append<uint64_t>(store, src_part, bytes_per_position, count, capacity, entries, part, stream);
    }
  }
}

}  // namespace tt::cuda
