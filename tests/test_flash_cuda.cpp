// The CUDA FlashAttention-2 kernels (f32 and bf16, tensor-core and simple paths) against the CPU tiled
// implementation in float. bf16 inputs are random floats rounded to bf16, and the CPU reference gets the
// same rounded values, so only the kernels' own rounding separates the two.
#ifdef TT_WITH_CUDA

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/flash_attention.h"

namespace {

using tt::AttentionKernels;
using tt::AttentionProblem;
using tt::AttentionStrides;
using tt::DType;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { TT_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <class T>
  T* as(int64_t element_offset = 0) const {
    return static_cast<T*>(ptr_) + element_offset;
  }
  void upload(const void* host) { TT_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice)); }
  void download(void* host) const { TT_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost)); }
  void poison() { TT_CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_)); }  // all-ones bits: NaN in f32 and bf16

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

struct Shape {
  int64_t batch, heads, seq, d;
  bool causal;
  // Layout: false = separate contiguous (batch, heads, seq, d) tensors; true = q, k, v slices of one
  // fused (batch, seq, 3 * heads * d) projection and O a (batch, seq, heads * d + out_pad) buffer.
  bool fused = false;
  int64_t out_pad = 0;  // a pad that breaks 16-byte row alignment sends bf16 to the simple kernels
  int64_t o_shift = 0;  // O starts this many elements past a 16-byte boundary (aligned rows, unaligned base)
};

struct Views {
  AttentionProblem p;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;
  size_t in_elements = 0, out_elements = 0;
};

Views make_views(const Shape& s) {
  Views w;
  w.p.batch = s.batch;
  w.p.heads = s.heads;
  w.p.seq = s.seq;
  w.p.d_head = s.d;
  w.p.causal = s.causal;
  w.p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  const int64_t one = s.batch * s.heads * s.seq * s.d;
  if (!s.fused) {
    w.p.q = w.p.k = w.p.v = w.p.o = AttentionProblem::contiguous(s.heads, s.seq, s.d);
    w.k_offset = one;
    w.v_offset = 2 * one;
    w.in_elements = static_cast<size_t>(3 * one);
    w.out_elements = static_cast<size_t>(one);
  } else {
    const int64_t row = 3 * s.heads * s.d, out_row = s.heads * s.d + s.out_pad;
    w.p.q = w.p.k = w.p.v = AttentionStrides{s.seq * row, s.d, row};
    w.p.o = AttentionStrides{s.seq * out_row, s.d, out_row};
    w.k_offset = s.heads * s.d;
    w.v_offset = 2 * s.heads * s.d;
    w.in_elements = static_cast<size_t>(s.batch * s.seq * row);
    w.out_elements = static_cast<size_t>(s.batch * s.seq * out_row);
  }
  return w;
}

std::vector<float> random_values(size_t n, std::mt19937& rng, bool round_to_bf16) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& value : x) {
    value = dist(rng);
    if (round_to_bf16) value = static_cast<float>(tt::bf16(value));
  }
  return x;
}

// Host floats <-> device bytes of the given dtype.
std::vector<uint8_t> encode(const std::vector<float>& x, DType dtype) {
  std::vector<uint8_t> bytes(x.size() * tt::dtype_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::bf16) {
      const uint16_t bits = tt::bf16::from_float(x[i]);
      std::memcpy(&bytes[i * 2], &bits, 2);
    } else {
      std::memcpy(&bytes[i * 4], &x[i], 4);
    }
  }
  return bytes;
}
std::vector<float> decode(const DeviceBuffer& buffer, size_t n, DType dtype) {
  std::vector<uint8_t> bytes(n * tt::dtype_size(dtype));
  buffer.download(bytes.data());
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::bf16) {
      uint16_t bits;
      std::memcpy(&bits, &bytes[i * 2], 2);
      x[i] = tt::bf16::to_float(bits);
    } else {
      std::memcpy(&x[i], &bytes[i * 4], 4);
    }
  }
  return x;
}

// The (batch, heads, seq, d) view at offset, as a contiguous array.
std::vector<float> gather(const std::vector<float>& buffer, int64_t offset, const AttentionStrides& s,
                          const AttentionProblem& p) {
  std::vector<float> out;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq; ++i)
        for (int64_t e = 0; e < p.d_head; ++e)
          out.push_back(buffer[offset + b * s.batch + h * s.head + i * s.seq + e]);
  return out;
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, const char* what) {
  const double tol = 1e-2;
  REQUIRE(actual.size() == expected.size());
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (!(err <= tol + tol * std::abs(expected[i]))) {
      if (bad++ == 0) first = i;
    }
    if (!(err <= worst)) worst = err;  // NaN sticks
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << actual.size() << " values differ (max abs error "
                               << worst << "), first at " << first << ": " << actual[first] << " vs "
                               << expected[first]);
}

void run_case(const Shape& s, DType dtype, AttentionKernels kernels = AttentionKernels::automatic) {
  CAPTURE(s.batch);
  CAPTURE(s.heads);
  CAPTURE(s.seq);
  CAPTURE(s.d);
  CAPTURE(s.causal);
  CAPTURE(s.fused);
  CAPTURE(s.out_pad);
  CAPTURE(tt::dtype_name(dtype));
  CAPTURE(static_cast<int>(kernels));
  const Views w = make_views(s);
  AttentionProblem p = w.p;
  p.kernels = kernels;
  std::mt19937 rng(static_cast<unsigned>(7 + s.seq * 31 + s.d));
  const bool bf16 = dtype == DType::bf16;
  const std::vector<float> in = random_values(w.in_elements, rng, bf16);
  const std::vector<float> d_o = random_values(w.out_elements, rng, bf16);
  const size_t lse_elements = static_cast<size_t>(p.batch * p.heads * p.seq);

  // CPU reference in float.
  std::vector<float> o_ref(w.out_elements, 0.0f), lse_ref(lse_elements), grad_ref(w.in_elements, 0.0f);
  tt::cpu::flash_attention_forward<float>(p, in.data() + w.q_offset, in.data() + w.k_offset,
                                          in.data() + w.v_offset, o_ref.data(), lse_ref.data());
  tt::cpu::flash_attention_backward<float>(p, in.data() + w.q_offset, in.data() + w.k_offset,
                                           in.data() + w.v_offset, o_ref.data(), d_o.data(), lse_ref.data(),
                                           grad_ref.data() + w.q_offset, grad_ref.data() + w.k_offset,
                                           grad_ref.data() + w.v_offset);

  const size_t elem = tt::dtype_size(dtype);
  DeviceBuffer in_dev(w.in_elements * elem), d_o_dev(w.out_elements * elem);
  DeviceBuffer o_dev((w.out_elements + static_cast<size_t>(s.o_shift)) * elem);
  DeviceBuffer lse_dev(lse_elements * sizeof(float)), grad_dev(w.in_elements * elem);
  in_dev.upload(encode(in, dtype).data());
  d_o_dev.upload(encode(d_o, dtype).data());
  o_dev.poison();
  lse_dev.poison();
  grad_dev.poison();
  const auto at = [&](const DeviceBuffer& b, int64_t offset) -> void* {
    return static_cast<uint8_t*>(b.get()) + offset * static_cast<int64_t>(elem);
  };
  void* o_ptr = at(o_dev, s.o_shift);
  tt::cuda::flash_attention_forward(p, dtype, at(in_dev, w.q_offset), at(in_dev, w.k_offset),
                                    at(in_dev, w.v_offset), o_ptr, lse_dev.as<float>(), nullptr);
  tt::cuda::flash_attention_backward(p, dtype, at(in_dev, w.q_offset), at(in_dev, w.k_offset),
                                     at(in_dev, w.v_offset), o_ptr, d_o_dev.get(), lse_dev.as<float>(),
                                     at(grad_dev, w.q_offset), at(grad_dev, w.k_offset),
                                     at(grad_dev, w.v_offset), nullptr);
  TT_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> o = decode(o_dev, w.out_elements + static_cast<size_t>(s.o_shift), dtype);
  o.erase(o.begin(), o.begin() + s.o_shift);
  const std::vector<float> grad = decode(grad_dev, w.in_elements, dtype);
  std::vector<float> lse(lse_elements);
  lse_dev.download(lse.data());
  expect_close(gather(o, 0, p.o, p), gather(o_ref, 0, p.o, p), "O");
  expect_close(lse, lse_ref, "L");
  expect_close(gather(grad, w.q_offset, p.q, p), gather(grad_ref, w.q_offset, p.q, p), "dQ");
  expect_close(gather(grad, w.k_offset, p.k, p), gather(grad_ref, w.k_offset, p.k, p), "dK");
  expect_close(gather(grad, w.v_offset, p.v, p), gather(grad_ref, w.v_offset, p.v, p), "dV");
  if (s.fused && s.out_pad > 0) {
    // The padding columns of O must still hold the poison.
    size_t written = 0;
    for (int64_t row = 0; row < p.batch * p.seq; ++row)
      for (int64_t e = p.heads * p.d_head; e < p.o.seq; ++e)
        written += std::isnan(o[row * p.o.seq + e]) ? 0 : 1;
    CHECK(written == 0);
  }
}

// Runs the case on every path that applies: f32 (simple kernels), bf16 on the tensor-core kernels (on an
// sm_90 GPU with d_head 64 or 128 the forward is a wgmma kernel: the TMA-fed one for 64, the cp.async
// one for 128; then the cp.async one for 64 too, and the mma.sync forward), and bf16 pinned to the simple
// kernels.
void run_all_paths(const Shape& s) {
  run_case(s, DType::f32);
  for (const AttentionKernels kernels : {AttentionKernels::automatic, AttentionKernels::cp_async_forward,
                                         AttentionKernels::mma_sync, AttentionKernels::simple}) {
    run_case(s, DType::bf16, kernels);
  }
}

bool have_gpu() {
  if (tt::cuda::device_count() == 0) {
    MESSAGE("no CUDA device");
    return false;
  }
  return true;
}

}  // namespace

// Suite "gpu": run alone with --test-suite=gpu.
TEST_SUITE("gpu") {
  TEST_CASE("cuda flash attention on the course shape (4, 128, 64)") {
    if (!have_gpu()) return;
    for (const bool causal : {false, true}) run_all_paths({4, 1, 128, 64, causal});
  }

  TEST_CASE("cuda flash attention on every supported head dim") {
    if (!have_gpu()) return;
    for (const int64_t d : {16, 32, 64, 80, 96, 128}) {
      for (const bool causal : {false, true}) run_all_paths({2, 2, 200, d, causal});
    }
  }

  TEST_CASE("cuda flash attention on odd sequence lengths") {
    if (!have_gpu()) return;
    for (const int64_t seq : {1, 77, 200, 1000}) {
      for (const bool causal : {false, true}) run_all_paths({1, 2, seq, 64, causal});
    }
    for (const bool causal : {false, true}) {
      run_all_paths({1, 3, 333, 128, causal});
      run_all_paths({1, 2, 1000, 128, causal});
      // Head dims whose rows take 10 or 12 of a 16-lane group in D's vectorised pass: a partial last block.
      run_all_paths({1, 2, 77, 80, causal});
      run_all_paths({1, 2, 77, 96, causal});
    }
  }

  TEST_CASE("cuda flash attention on strided (fused projection) layouts") {
    if (!have_gpu()) return;
    for (const bool causal : {false, true}) {
      run_all_paths({2, 3, 129, 64, causal, true, 0});
      run_all_paths({2, 4, 100, 32, causal, true, 0});
      // Misaligned O rows (pad 3): bf16 falls back to the simple kernels on its own.
      run_all_paths({2, 3, 129, 80, causal, true, 3});
    }
  }

  TEST_CASE("cuda flash attention with O's base 8 bytes off a 16-byte boundary") {
    if (!have_gpu()) return;
    // Rows stay aligned, so only the base decides: bf16 must leave the 16-byte vectorised kernels.
    for (const bool causal : {false, true}) run_all_paths({2, 2, 200, 64, causal, false, 0, 4});
  }

  TEST_CASE("cuda flash attention with several heads and a partial last tile") {
    if (!have_gpu()) return;
    for (const bool causal : {false, true}) {
      run_all_paths({3, 5, 320, 64, causal});
      run_all_paths({2, 3, 320, 128, causal});
    }
  }

  TEST_CASE("cuda flash attention over more (batch, head) pairs than one chunk of its launch order") {
    if (!have_gpu()) return;
    // At T 1024 and d 64 the blocks take the pairs in chunks of 32 (forward) and 15 (backward): 39 pairs
    // end in a partial chunk either way.
    for (const bool causal : {false, true}) {
      for (const AttentionKernels kernels : {AttentionKernels::automatic, AttentionKernels::mma_sync})
        run_case({3, 13, 1024, 64, causal}, DType::bf16, kernels);
    }
  }

  TEST_CASE("cuda flash attention rejects unsupported head dims") {
    if (!have_gpu()) return;
    AttentionProblem p;
    p.d_head = 48;
    p.q = p.k = p.v = p.o = AttentionProblem::contiguous(1, 1, 48);
    CHECK_THROWS_AS(tt::cuda::flash_attention_forward(p, DType::bf16, nullptr, nullptr, nullptr, nullptr,
                                                      nullptr, nullptr),
                    tt::Error);
  }

}  // TEST_SUITE("gpu")

#endif  // TT_WITH_CUDA
