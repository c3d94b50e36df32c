// Elementwise CUDA kernels: add, scale, fills, the deterministic sum, casts, strided gathers and the SwiGLU
// gate. All are memory-bound grid-stride loops, so any n works with a bounded grid.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace tt::cuda {
namespace {

// The loop every vectorised streaming kernel shares. op.apply<W>(k) handles the k-th group of W consecutive
// elements; with `vectorised` (every pointer aligned to W elements, checked on the host) the first n / W * W
// elements go W at a time and the rest one by one, otherwise all one by one. An op computes in f32 whatever
// the storage (f32 or bf16) and rounds once on the store.
template <int W, class Op>
__global__ void elementwise_kernel(Op op, int64_t n, bool vectorised) {
  int64_t done = 0;
  if (vectorised) {
    const int64_t groups = n / W;
    for (int64_t k = thread_index(); k < groups; k += grid_threads()) op.template apply<W>(k);
    done = groups * W;
  }
  for (int64_t i = done + thread_index(); i < n; i += grid_threads()) op.template apply<1>(i);
}

template <int W, class Op>
void launch_elementwise(const Op& op, int64_t n, bool vectorised, cudaStream_t stream) {
  if (n == 0) return;
  elementwise_kernel<W>
      <<<blocks_for(vectorised ? std::max<int64_t>(1, n / W) : n), kThreads, 0, stream>>>(op, n, vectorised);
  TT_CUDA_LAUNCH_CHECK();
}

// out = f(a, b) element by element, f a function object on f32 values.
template <class T, class F>
struct BinaryOp {
  const T* a;
  const T* b;
  T* out;
  F f;
  template <int W>
  __device__ void apply(int64_t k) const {
    float va[W], vb[W];
    load_w<W>(a, k, va);
    load_w<W>(b, k, vb);
#pragma unroll
    for (int j = 0; j < W; ++j) va[j] = f(va[j], vb[j]);
    store_w<W>(out, k, va);
  }
};

// a + alpha * b, product and sum rounded separately (no fused multiply-add) so the result matches the CPU
// twin bit for bit.
struct AddScaled {
  float alpha;
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, __fmul_rn(alpha, b)); }
};

__global__ void scale_kernel(const float* a, float* out, int64_t n, float s) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) out[i] = a[i] * s;
}

// dst = (inputs[0] + inputs[1] + ... ) * scale, added in that order in f32 and rounded once, sixteen bytes
// per access when every pointer allows it (the gradient buckets of the copy-engine all-reduce are large and
// aligned). dst may be one of the inputs: each element is read before it is written, by the same thread.
template <class T>
struct AddRanksScaledOp {
  static constexpr int kPack = 16 / sizeof(T);
  T* dst;
  const T* inputs[kMaxAddInputs];
  int count;
  float scale;
  template <int W>
  __device__ void apply(int64_t k) const {
    float acc[W], v[W];
    load_w<W>(inputs[0], k, acc);
    for (int i = 1; i < count; ++i) {
      load_w<W>(inputs[i], k, v);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] = __fadd_rn(acc[j], v[j]);
    }
#pragma unroll
    for (int j = 0; j < W; ++j) acc[j] = __fmul_rn(acc[j], scale);
    store_w<W>(dst, k, acc);
  }
};

template <class T>
__global__ void fill_kernel(T* x, int64_t n, T value) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) x[i] = value;
}

// ---------------------------------------------------------------------------------------------------------
// Sum. The grid depends only on n and every reduction tree is fixed, so the same input always gives the same
// bits: the gradient norm (and with it clipping and the whole run) must not depend on scheduling. Partials
// accumulate in double like the CPU reference does; a float accumulator over billions of squared gradients
// would drop the small terms, and the kernel is memory-bound, so double costs nothing.

constexpr int kSumThreads = 512;
// Up to this many elements one block sums everything and no scratch is needed.
constexpr int64_t kSumSingleBlockMax = int64_t{1} << 16;
constexpr int64_t kSumElementsPerBlock = int64_t{kSumThreads} * 16;
constexpr int64_t kSumMaxPartials = 1024;

// Every warp reduces the same per-warp totals in the same order, so all threads return the same value.
__device__ double block_sum(double v) {
  __shared__ double warp_totals[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_totals[lane] : 0.0;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ double widen(float v) {
  return v;
}
__device__ double widen(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// With `vec` (x 16-byte aligned) 16 bytes per load: element-sized loads of bf16 gradients left two thirds of
// the bandwidth unused (xl's 2.1 G bf16 gradients: 3.3 ms for the norm on an H100).
template <class In, class Out>
__global__ void sum_partial_kernel(const In* x, int64_t n, bool squares, Out* partials, bool vec) {
  double acc = 0;
  int64_t done = 0;
  if (vec) {
    constexpr int kPerLoad = 16 / sizeof(In);
    const int64_t groups = n / kPerLoad;
    const uint4* x16 = reinterpret_cast<const uint4*>(x);
#pragma unroll 4
    for (int64_t k = thread_index(); k < groups; k += grid_threads()) {
      const uint4 raw = __ldcs(x16 + k);
      const In* e = reinterpret_cast<const In*>(&raw);
#pragma unroll
      for (int j = 0; j < kPerLoad; ++j) {
        const double v = widen(e[j]);
        acc += squares ? v * v : v;
      }
    }
    done = groups * kPerLoad;
  }
  for (int64_t i = done + thread_index(); i < n; i += grid_threads()) {
    const double v = widen(x[i]);
    acc += squares ? v * v : v;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = static_cast<Out>(total);
}

__global__ void sum_partials_kernel(const double* partials, int count, float* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = static_cast<float>(total);
}

// ---------------------------------------------------------------------------------------------------------
// Casts. tt::bf16 and __nv_bfloat16 are both the upper 16 bits of a float, so the buffers are
// interchangeable.

struct FloatToBf16 {
  __device__ __nv_bfloat16 operator()(float v) const { return __float2bfloat16_rn(v); }
};
struct Bf16ToFloat {
  __device__ float operator()(__nv_bfloat16 v) const { return __bfloat162float(v); }
};
struct IntToFloat {
  __device__ float operator()(int32_t v) const { return static_cast<float>(v); }
};
// Truncates toward zero like the CPU cast; out-of-range values saturate instead of being undefined.
struct FloatToInt {
  __device__ int32_t operator()(float v) const { return static_cast<int32_t>(v); }
};

template <class In, class Out, class Convert>
__global__ void cast_kernel(const In* in, Out* out, int64_t n, Convert convert) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) out[i] = convert(in[i]);
}

// f32 -> bf16 four at a time (16-byte loads, 8-byte stores): the mixed-precision casts of weights and
// activations are pure bandwidth, and scalar 4-byte accesses leave a third of it unused.
__global__ void cast_f32_bf16_vec4_kernel(const float4* in, uint2* out, int64_t groups) {
  for (int64_t i = thread_index(); i < groups; i += grid_threads()) {
    const float4 v = in[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    out[i] = packed;
  }
}

template <class In, class Out, class Convert>
void launch_cast(const void* in, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if constexpr (std::is_same_v<In, float> && std::is_same_v<Out, __nv_bfloat16>) {
    const bool aligned =
        reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
    if (aligned && n >= 4) {
      const int64_t groups = n / 4;
      cast_f32_bf16_vec4_kernel<<<blocks_for(groups), kThreads, 0, stream>>>(
          static_cast<const float4*>(in), static_cast<uint2*>(out), groups);
      TT_CUDA_LAUNCH_CHECK();
      const int64_t done = groups * 4;
      if (done == n) return;
      in = static_cast<const float*>(in) + done;
      out = static_cast<__nv_bfloat16*>(out) + done;
      n -= done;
    }
  }
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const In*>(in), static_cast<Out*>(out), n,
                                                      Convert{});
  TT_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------------
// Strided gather. The layout travels by value in the kernel parameters, so no device copy of it is needed and
// the launch stays capturable. Dimensions are walked with compile-time indices to keep the arrays in
// registers.

constexpr int kMaxDims = 8;

struct StridedLayout {
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  int ndim;
};

// I is the type of the index arithmetic: 32-bit when every element index and offset fits, as division by a
// runtime divisor costs several times more in 64 bits and each element pays it once per dimension. The
// loop itself counts in 64 bits (the grid may hold more threads than 2^31 - total).
template <class E, class I>
__global__ void strided_copy_kernel(const E* in, E* out, int64_t total, StridedLayout layout) {
  for (int64_t i = thread_index(); i < total; i += grid_threads()) {
    I remaining = static_cast<I>(i), offset = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d < layout.ndim) {
        const I size = static_cast<I>(layout.shape[d]);
        const I next = remaining / size;
        offset += (remaining - next * size) * static_cast<I>(layout.strides[d]);
        remaining = next;
      }
    }
    out[i] = in[offset];
  }
}

template <class E>
void launch_strided_copy(const void* in, void* out, int64_t total, int64_t max_offset,
                         const StridedLayout& layout, cudaStream_t stream) {
  const unsigned int blocks = blocks_for(total);
  if (total < (int64_t{1} << 31) && max_offset < (int64_t{1} << 31)) {
    strided_copy_kernel<E, int32_t>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const E*>(in), static_cast<E*>(out), total, layout);
  } else {
    strided_copy_kernel<E, int64_t>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const E*>(in), static_cast<E*>(out), total, layout);
  }
  TT_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------------
// SwiGLU gate, the same expressions as the CPU twin.

__device__ float sigmoid(float a) {
  return 1.0f / (1.0f + expf(-a));
}

// Values are read as f32 whatever their storage (f32 or bf16) and results rounded once on the store, so a
// bf16 SwiGLU equals the f32 one on bf16-rounded inputs, rounded to bf16.
__device__ float swiglu_value(float a, float b) {
  return a * sigmoid(a) * b;
}
// d out / d b = silu(a); d out / d a = b * sig * (1 + a * (1 - sig)).
__device__ void swiglu_grads(float g, float a, float b, float& da, float& db) {
  const float sig = sigmoid(a);
  db = g * (a * sig);
  da = g * b * sig * (1.0f + a * (1.0f - sig));
}

struct Swiglu {
  __device__ float operator()(float a, float b) const { return swiglu_value(a, b); }
};

template <class T, class G>
struct SwigluBackwardOp {
  const G* dout;
  const T* a;
  const T* b;
  T* da;
  T* db;
  template <int W>
  __device__ void apply(int64_t k) const {
    float vg[W], va[W], vb[W], vda[W], vdb[W];
    load_w<W>(dout, k, vg);
    load_w<W>(a, k, va);
    load_w<W>(b, k, vb);
#pragma unroll
    for (int j = 0; j < W; ++j) swiglu_grads(vg[j], va[j], vb[j], vda[j], vdb[j]);
    store_w<W>(da, k, vda);
    store_w<W>(db, k, vdb);
  }
};

// An elementwise op over the rows of a matrix whose operands are column blocks of wider rows (SwiGLU's a
// and b, side by side in one matmul's output): op.row(r) is the flat op on row r's `cols` elements. Blocks
// take rows along y and a row's groups along x, so no element index is ever divided by the row length.
template <int W, class RowOp>
__global__ void rows_kernel(RowOp op, int64_t rows, int64_t cols, bool vectorised) {
  const int64_t first = thread_index();
  const int64_t step = grid_threads();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const auto row = op.row(r);
    int64_t done = 0;
    if (vectorised) {
      const int64_t groups = cols / W;
      for (int64_t k = first; k < groups; k += step) row.template apply<W>(k);
      done = groups * W;
    }
    for (int64_t i = done + first; i < cols; i += step) row.template apply<1>(i);
  }
}

template <int W, class RowOp>
void launch_rows(const RowOp& op, int64_t rows, int64_t cols, bool vectorised, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t per_row = vectorised ? std::max<int64_t>(1, cols / W) : cols;
  const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((per_row + kThreads - 1) / kThreads, 65535)),
                  static_cast<unsigned int>(std::min<int64_t>(rows, 65535)));
  rows_kernel<W><<<grid, kThreads, 0, stream>>>(op, rows, cols, vectorised);
  TT_CUDA_LAUNCH_CHECK();
}

// ab (rows, 2 cols): a | b; out (rows, cols).
template <class T>
struct SwigluRows {
  const T* ab;
  T* out;
  int64_t cols;
  __device__ BinaryOp<T, Swiglu> row(int64_t r) const {
    const T* a = ab + r * 2 * cols;
    return {a, a + cols, out + r * cols, {}};
  }
};

// dout (rows, cols); ab and dab (rows, 2 cols): a | b and da | db.
template <class T, class G>
struct SwigluBackwardRows {
  const G* dout;
  const T* ab;
  T* dab;
  int64_t cols;
  __device__ SwigluBackwardOp<T, G> row(int64_t r) const {
    const T* a = ab + r * 2 * cols;
    T* da = dab + r * 2 * cols;
    return {dout + r * cols, a, a + cols, da, da + cols};
  }
};

}  // namespace

void add(const float* a, const float* b, float* out, int64_t n, double alpha, cudaStream_t stream) {
  const bool vectorised = aligned4(a) && aligned4(b) && aligned4(out);
  launch_elementwise<4>(BinaryOp<float, AddScaled>{a, b, out, {static_cast<float>(alpha)}}, n, vectorised,
                        stream);
}

void scale(const float* a, float* out, int64_t n, double s, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, out, n, static_cast<float>(s));
  TT_CUDA_LAUNCH_CHECK();
}

void fill(float* x, int64_t n, double value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(x, n, static_cast<float>(value));
  TT_CUDA_LAUNCH_CHECK();
}

void fill_i32(int32_t* x, int64_t n, int32_t value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<int32_t><<<blocks_for(n), kThreads, 0, stream>>>(x, n, value);
  TT_CUDA_LAUNCH_CHECK();
}

template <class In>
void sum_of(const In* x, int64_t n, bool squares, float* out, cudaStream_t stream) {
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (n == 0) {
    TT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream));  // all-zero bits are 0.0f
    return;
  }
  if (n <= kSumSingleBlockMax) {
    sum_partial_kernel<In, float><<<1, kSumThreads, 0, stream>>>(x, n, squares, out, vec);
    TT_CUDA_LAUNCH_CHECK();
    return;
  }
  const int64_t partial_count =
      std::min((n + kSumElementsPerBlock - 1) / kSumElementsPerBlock, kSumMaxPartials);
  // Stream-ordered scratch: a few KiB, returned to the pool as soon as the final kernel has run.
  double* partials = nullptr;
  TT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), partial_count * sizeof(double), stream));
  sum_partial_kernel<In, double>
      <<<static_cast<unsigned int>(partial_count), kSumThreads, 0, stream>>>(x, n, squares, partials, vec);
  TT_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<1, kSumThreads, 0, stream>>>(partials, static_cast<int>(partial_count), out);
  TT_CUDA_LAUNCH_CHECK();
  TT_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

void sum(const float* x, int64_t n, bool squares, float* out, cudaStream_t stream) {
  sum_of(x, n, squares, out, stream);
}

void sum(const bf16* x, int64_t n, bool squares, float* out, cudaStream_t stream) {
  sum_of(reinterpret_cast<const __nv_bfloat16*>(x), n, squares, out, stream);
}

void cast(const void* in, DType in_type, void* out, DType out_type, int64_t n, cudaStream_t stream) {
  if (in_type == out_type) {
    if (n > 0) {
      TT_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<size_t>(n) * dtype_size(in_type),
                                    cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }
  if (in_type == DType::f32 && out_type == DType::bf16)
    return launch_cast<float, __nv_bfloat16, FloatToBf16>(in, out, n, stream);
  if (in_type == DType::bf16 && out_type == DType::f32)
    return launch_cast<__nv_bfloat16, float, Bf16ToFloat>(in, out, n, stream);
  if (in_type == DType::i32 && out_type == DType::f32)
    return launch_cast<int32_t, float, IntToFloat>(in, out, n, stream);
  if (in_type == DType::f32 && out_type == DType::i32)
    return launch_cast<float, int32_t, FloatToInt>(in, out, n, stream);
  throw Error(std::string("cuda::cast: unsupported conversion ") + dtype_name(in_type) + " -> " +
              dtype_name(out_type) + " (supported: f32<->bf16, i32<->f32)");
}

void add_ranks_scaled(void* dst, const void* const* inputs, int count, DType type, int64_t n, float scale,
                      cudaStream_t stream) {
  TT_ASSERT(type == DType::f32 || type == DType::bf16,
            std::string("cuda::add_ranks_scaled: f32 or bf16 only, got ") + dtype_name(type));
  TT_ASSERT(count >= 1 && count <= kMaxAddInputs, "cuda::add_ranks_scaled: 1 to " +
                                                      std::to_string(kMaxAddInputs) + " inputs, got " +
                                                      std::to_string(count));
  if (n == 0) return;
  bool vectorised = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  for (int i = 0; i < count; ++i) vectorised = vectorised && reinterpret_cast<uintptr_t>(inputs[i]) % 16 == 0;
  auto launch = [&](auto* typed_dst) {
    using T = std::remove_pointer_t<decltype(typed_dst)>;
    AddRanksScaledOp<T> op{typed_dst, {}, count, scale};
    for (int i = 0; i < count; ++i) op.inputs[i] = static_cast<const T*>(inputs[i]);
    launch_elementwise<AddRanksScaledOp<T>::kPack>(op, n, vectorised, stream);
  };
  if (type == DType::f32) {
    launch(static_cast<float*>(dst));
  } else {
    launch(static_cast<__nv_bfloat16*>(dst));
  }
}

void strided_copy(const void* in, void* out, int64_t elem_bytes, int ndim, const int64_t* shape,
                  const int64_t* in_strides, cudaStream_t stream) {
  TT_CHECK(ndim >= 0 && ndim <= kMaxDims,
           "cuda::strided_copy supports 0 to 8 dimensions, got " + std::to_string(ndim));
  if (elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) {
    throw Error("cuda::strided_copy: unsupported element size " + std::to_string(elem_bytes) +
                " bytes (supported: 2, 4, 8)");
  }
  // The same copy with fewer, wider pieces: size-1 dimensions dropped, a dimension merged into the one
  // before it where the input walks them as one, and a contiguous innermost run moved in units of up to 16
  // bytes (every stride and pointer permitting). The output is dense, so only the input constrains this.
  StridedLayout layout{};
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    total *= shape[d];
    if (shape[d] == 1) continue;
    const int k = layout.ndim;
    if (k > 0 && layout.strides[k - 1] == in_strides[d] * shape[d]) {
      layout.shape[k - 1] *= shape[d];
      layout.strides[k - 1] = in_strides[d];
    } else {
      layout.shape[k] = shape[d];
      layout.strides[k] = in_strides[d];
      layout.ndim = k + 1;
    }
  }
  if (total == 0) return;
  int64_t unit = elem_bytes;
  if (layout.ndim > 0 && layout.strides[layout.ndim - 1] == 1) {
    for (int64_t wide = 16; wide > elem_bytes; wide /= 2) {
      const int64_t factor = wide / elem_bytes;
      bool fits = layout.shape[layout.ndim - 1] % factor == 0 &&
                  reinterpret_cast<uintptr_t>(in) % wide == 0 && reinterpret_cast<uintptr_t>(out) % wide == 0;
      for (int d = 0; d + 1 < layout.ndim && fits; ++d) fits = layout.strides[d] % factor == 0;
      if (!fits) continue;
      layout.shape[layout.ndim - 1] /= factor;
      for (int d = 0; d + 1 < layout.ndim; ++d) layout.strides[d] /= factor;
      total /= factor;
      unit = wide;
      break;
    }
  }
  int64_t max_offset = 0;
  for (int d = 0; d < layout.ndim; ++d) max_offset += (layout.shape[d] - 1) * std::abs(layout.strides[d]);
  switch (unit) {
    case 2:
      launch_strided_copy<uint16_t>(in, out, total, max_offset, layout, stream);
      break;
    case 4:
      launch_strided_copy<uint32_t>(in, out, total, max_offset, layout, stream);
      break;
    case 8:
      launch_strided_copy<uint64_t>(in, out, total, max_offset, layout, stream);
      break;
    default:
      launch_strided_copy<uint4>(in, out, total, max_offset, layout, stream);
      break;
  }
}

namespace {
template <class T>
void launch_swiglu_forward(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  const bool vectorised = aligned4(a) && aligned4(b) && aligned4(out);
  launch_elementwise<4>(BinaryOp<T, Swiglu>{a, b, out, {}}, n, vectorised, stream);
}
}  // namespace

void swiglu_forward(const void* a, const void* b, void* out, DType type, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (type == DType::bf16) {
    using B = __nv_bfloat16;
    launch_swiglu_forward(static_cast<const B*>(a), static_cast<const B*>(b), static_cast<B*>(out), n,
                          stream);
  } else {
    TT_CHECK(type == DType::f32, "cuda::swiglu: f32 or bf16 inputs");
    launch_swiglu_forward(static_cast<const float*>(a), static_cast<const float*>(b),
                          static_cast<float*>(out), n, stream);
  }
}

namespace {
template <class T, class G>
void launch_swiglu_backward_as(const G* dout, const T* a, const T* b, T* da, T* db, int64_t n,
                               cudaStream_t stream) {
  const bool vectorised = aligned4(dout) && aligned4(a) && aligned4(b) && aligned4(da) && aligned4(db);
  launch_elementwise<4>(SwigluBackwardOp<T, G>{dout, a, b, da, db}, n, vectorised, stream);
}

template <class T>
void launch_swiglu_backward(const void* dout, DType dout_type, const T* a, const T* b, T* da, T* db,
                            int64_t n, cudaStream_t stream) {
  if (dout_type == DType::bf16) {
    launch_swiglu_backward_as(static_cast<const __nv_bfloat16*>(dout), a, b, da, db, n, stream);
  } else {
    TT_CHECK(dout_type == DType::f32, "cuda::swiglu_backward: f32 or bf16 gradient");
    launch_swiglu_backward_as(static_cast<const float*>(dout), a, b, da, db, n, stream);
  }
}
}  // namespace

void swiglu_backward(const void* dout, DType dout_type, const void* a, const void* b, void* da, void* db,
                     DType type, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (type == DType::bf16) {
    using B = __nv_bfloat16;
    launch_swiglu_backward(dout, dout_type, static_cast<const B*>(a), static_cast<const B*>(b),
                           static_cast<B*>(da), static_cast<B*>(db), n, stream);
  } else {
    TT_CHECK(type == DType::f32, "cuda::swiglu_backward: f32 or bf16 inputs");
    launch_swiglu_backward(dout, dout_type, static_cast<const float*>(a), static_cast<const float*>(b),
                           static_cast<float*>(da), static_cast<float*>(db), n, stream);
  }
}

namespace {
template <class T>
void launch_swiglu_rows(const T* ab, T* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  const bool vectorised = cols % 4 == 0 && aligned4(ab) && aligned4(out);
  launch_rows<4>(SwigluRows<T>{ab, out, cols}, rows, cols, vectorised, stream);
}

template <class T, class G>
void launch_swiglu_backward_rows(const G* dout, const T* ab, T* dab, int64_t rows, int64_t cols,
                                 cudaStream_t stream) {
  const bool vectorised = cols % 4 == 0 && aligned4(dout) && aligned4(ab) && aligned4(dab);
  launch_rows<4>(SwigluBackwardRows<T, G>{dout, ab, dab, cols}, rows, cols, vectorised, stream);
}

template <class T>
void swiglu_backward_rows_as(const void* dout, DType dout_type, const T* ab, T* dab, int64_t rows,
                             int64_t cols, cudaStream_t stream) {
  if (dout_type == DType::bf16) {
    launch_swiglu_backward_rows(static_cast<const __nv_bfloat16*>(dout), ab, dab, rows, cols, stream);
  } else {
    TT_CHECK(dout_type == DType::f32, "cuda::swiglu_backward_rows: f32 or bf16 gradient");
    launch_swiglu_backward_rows(static_cast<const float*>(dout), ab, dab, rows, cols, stream);
  }
}
}  // namespace

void swiglu_forward_rows(const void* ab, void* out, DType type, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  if (type == DType::bf16) {
    using B = __nv_bfloat16;
    launch_swiglu_rows(static_cast<const B*>(ab), static_cast<B*>(out), rows, cols, stream);
  } else {
    TT_CHECK(type == DType::f32, "cuda::swiglu_forward_rows: f32 or bf16 inputs");
    launch_swiglu_rows(static_cast<const float*>(ab), static_cast<float*>(out), rows, cols, stream);
  }
}

void swiglu_backward_rows(const void* dout, DType dout_type, const void* ab, void* dab, DType type,
                          int64_t rows, int64_t cols, cudaStream_t stream) {
  if (type == DType::bf16) {
    using B = __nv_bfloat16;
    swiglu_backward_rows_as(dout, dout_type, static_cast<const B*>(ab), static_cast<B*>(dab), rows, cols,
                            stream);
  } else {
    TT_CHECK(type == DType::f32, "cuda::swiglu_backward_rows: f32 or bf16 inputs");
    swiglu_backward_rows_as(dout, dout_type, static_cast<const float*>(ab), static_cast<float*>(dab), rows,
                            cols, stream);
  }
}

}  // namespace tt::cuda
