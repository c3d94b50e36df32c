// Elementwise CPU kernels: add, scale, fill, sums, casts, strided gathers, SwiGLU gate.
#include <cmath>
#include <type_traits>

#include "base/error.h"
#include "kernels/cpu/cpu_kernels.h"

namespace tt::cpu {

template <class T>
void add(const T* a, const T* b, T* out, int64_t n, double alpha) {
  const T al = static_cast<T>(alpha);
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + al * b[i];
}

template <class T>
void scale(const T* a, T* out, int64_t n, double s) {
  const T sv = static_cast<T>(s);
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * sv;
}

template <class T>
void fill(T* x, int64_t n, double value) {
  const T v = static_cast<T>(value);
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

template <class T>
double sum(const T* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]);
  return acc;
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return acc;
}

void add_ranks_scaled(void* dst, const void* const* inputs, int count, DType type, int64_t n, float scale) {
  TT_ASSERT(type == DType::f32 || type == DType::bf16,
            std::string("add_ranks_scaled: f32 or bf16 only, got ") + dtype_name(type));
  TT_ASSERT(count >= 1, "add_ranks_scaled: no inputs");
  auto run = [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    // Element by element across the inputs, so that dst may be one of them.
    for (int64_t i = 0; i < n; ++i) {
      float acc = static_cast<float>(static_cast<const T*>(inputs[0])[i]);
      for (int k = 1; k < count; ++k) acc += static_cast<float>(static_cast<const T*>(inputs[k])[i]);
      d[i] = T(acc * scale);
    }
  };
  if (type == DType::f32) {
    run(static_cast<float*>(dst));
  } else {
    run(static_cast<bf16*>(dst));
  }
}

namespace {
double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f64:
      return static_cast<const double*>(p)[i];
    case DType::bf16:
      return static_cast<float>(static_cast<const bf16*>(p)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(p)[i];
  }
  return 0;
}
}  // namespace

void cast(const void* in, DType in_type, void* out, DType out_type, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    switch (out_type) {
      case DType::f32:
        // Through float, not double, for bf16 -> f32 exactness; f64 -> f32 rounds once.
        static_cast<float*>(out)[i] = in_type == DType::f64
                                          ? static_cast<float>(static_cast<const double*>(in)[i])
                                          : static_cast<float>(load_as_double(in, in_type, i));
        break;
      case DType::f64:
        static_cast<double*>(out)[i] = load_as_double(in, in_type, i);
        break;
      case DType::bf16: {
        // Round f32 -> bf16 exactly as CUDA does; f64 goes through f32 first.
        const float f = in_type == DType::f32 ? static_cast<const float*>(in)[i]
                                              : static_cast<float>(load_as_double(in, in_type, i));
        static_cast<bf16*>(out)[i] = bf16(f);
        break;
      }
      case DType::i32:
        static_cast<int32_t*>(out)[i] = static_cast<int32_t>(load_as_double(in, in_type, i));
        break;
    }
  }
}

namespace {
template <class E>
void strided_copy_typed(const E* in, E* out, int ndim, const int64_t* shape, const int64_t* strides) {
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  int64_t index[8] = {0};
  int64_t offset = 0;
  for (int64_t i = 0; i < total; ++i) {
    out[i] = in[offset];
    for (int d = ndim - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}
}  // namespace

void strided_copy(const void* in, void* out, int64_t elem_bytes, int ndim, const int64_t* shape,
                  const int64_t* in_strides) {
  TT_CHECK(ndim <= 8, "strided_copy supports at most 8 dimensions");
  switch (elem_bytes) {
    case 2:
      strided_copy_typed(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), ndim, shape,
                         in_strides);
      break;
    case 4:
      strided_copy_typed(static_cast<const uint32_t*>(in), static_cast<uint32_t*>(out), ndim, shape,
                         in_strides);
      break;
    case 8:
      strided_copy_typed(static_cast<const uint64_t*>(in), static_cast<uint64_t*>(out), ndim, shape,
                         in_strides);
      break;
    default:
      throw Error("strided_copy: unsupported element size");
  }
}

template <class T>
void swiglu_forward(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-a[i]));
    out[i] = a[i] * sig * b[i];
  }
}

template <class T>
void swiglu_backward(const T* dout, const T* a, const T* b, T* da, T* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-a[i]));
    const T silu = a[i] * sig;
    db[i] = dout[i] * silu;
    // d silu / da = sig * (1 + a * (1 - sig))
    da[i] = dout[i] * b[i] * sig * (T(1) + a[i] * (T(1) - sig));
  }
}

#define TT_INSTANTIATE(T)                                           \
  template void add<T>(const T*, const T*, T*, int64_t, double);    \
  template void scale<T>(const T*, T*, int64_t, double);            \
  template void fill<T>(T*, int64_t, double);                       \
  template double sum<T>(const T*, int64_t);                        \
  template double sum_squares<T>(const T*, int64_t);                \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);
TT_INSTANTIATE(float)
TT_INSTANTIATE(double)
#undef TT_INSTANTIATE
template void fill<int32_t>(int32_t*, int64_t, double);

}  // namespace tt::cpu
