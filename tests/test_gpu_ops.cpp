// Every CUDA op against its CPU twin (f32 within 1e-5 relative; bf16 within bf16 tolerance), forward and
// backward, and a whole model's forward+backward on CUDA against the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <tuple>
#include <utility>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/rng.h"
#include "gradcheck.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif
#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "optim/update_in_backward.h"

using namespace tt;
using testing::relative_error;

namespace {

using Op = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs `op` on f32 CPU inputs and on their CUDA copies, backpropagates the same random weights, and
// returns the worst relative error over the output and every input gradient.
double cuda_vs_cpu(const Op& op, const std::vector<Tensor>& cpu_inputs) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : cpu_inputs) {
    Tensor c = t.clone(), g = t.to(Device::cuda(0));
    const bool diff = t.dtype() == DType::f32 || t.dtype() == DType::bf16;
    c.set_requires_grad(diff);
    g.set_requires_grad(diff);
    cpu_in.push_back(c);
    gpu_in.push_back(g);
  }
  const Tensor out_cpu = op(cpu_in), out_gpu = op(gpu_in);
  double worst = relative_error(out_gpu.to_doubles(), out_cpu.to_doubles());
  const std::vector<float> weights = testing::random_floats(out_cpu.numel(), 99);
  const Tensor w_cpu = ops::cast(Tensor::from_floats(weights, out_cpu.shape()), out_cpu.dtype());
  out_cpu.backward(w_cpu);
  out_gpu.backward(w_cpu.to(Device::cuda(0)));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    worst = std::max(worst, relative_error(gpu_in[i].grad().to_doubles(), cpu_in[i].grad().to_doubles()));
  }
  return worst;
}

Tensor randn(const Shape& shape, uint32_t seed, double scale = 1.0) {
  return testing::random_tensor(shape, seed, DType::f32, scale);
}

constexpr double kF32 = 1e-5;

// Copies of `inputs` on the GPU, each a leaf that requires grad.
std::vector<Tensor> gpu_leaves(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    out.push_back(t.to(Device::cuda(0)));
    out.back().set_requires_grad(true);
  }
  return out;
}

// root.backward(), counting the allocations of lo to hi - 1 bytes that Linear and RMSNorm backward nodes make
// meanwhile (the caching allocator reports sizes rounded up to its 512-byte granularity).
struct BackwardAllocations {
  int linear = 0, norm = 0;
};
BackwardAllocations backward_allocations(const Tensor& root, int64_t lo, int64_t hi) {
  BackwardAllocations counts;
  set_memory_recorder([&](const MemoryEvent& e) {
    if (!e.is_alloc || e.bytes < lo || e.bytes >= hi) return;
    if (e.tag == "Linear") ++counts.linear;
    if (e.tag == "RMSNorm") ++counts.norm;
  });
  root.backward();
  set_memory_recorder(nullptr);
  return counts;
}

}  // namespace

TEST_CASE("CUDA elementwise ops equal the CPU") {
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::add_scaled(in[0], in[1], 0.3); },
                    {randn({1000, 3}, 1), randn({1000, 3}, 2)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::scale(in[0], -1.5); }, {randn({4097}, 3)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::sum(in[0]); }, {randn({100000}, 4)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::swiglu(in[0], in[1]); },
                    {randn({33, 257}, 5), randn({33, 257}, 6)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::contiguous(ops::transpose(in[0], 0, 2)); },
                    {randn({3, 5, 7}, 7)}) < kF32);
}

TEST_CASE("CUDA strided copies equal the CPU bit for bit: merged dimensions, wide units, unaligned views") {
  for (DType type : {DType::f32, DType::bf16}) {
    const std::string dtype_text = dtype_name(type);
    CAPTURE(dtype_text);
    const Tensor x = ops::cast(randn({2, 5, 6, 80}, 9), type);
    const Tensor g = x.to(Device::cuda(0));
    // Each view's contiguous copy on the GPU must equal the CPU's exactly.
    auto same = [&](const std::function<Tensor(const Tensor&)>& view) {
      return ops::contiguous(view(g)).to_floats() == ops::contiguous(view(x)).to_floats();
    };
    // The attention layout change (heads and positions swapped): inner runs of 80 move in 16-byte units.
    CHECK(same([](const Tensor& t) { return t.transpose_view(1, 2); }));
    // Innermost dimension strided: element by element.
    CHECK(same([](const Tensor& t) { return t.transpose_view(0, 3); }));
    CHECK(same([](const Tensor& t) { return t.transpose_view(2, 3); }));
    // Size-1 dimensions and dimensions the input walks as one (merged before the copy).
    CHECK(same([](const Tensor& t) { return ops::reshape(t, {2, 1, 5, 6, 1, 80}).transpose_view(1, 4); }));
    CHECK(same([](const Tensor& t) { return ops::reshape(t, {2, 5, 6, 80}).transpose_view(0, 1); }));
    // Runs starting off a 16-byte boundary or of odd length: narrower units or single elements.
    for (int64_t start : {1, 2, 4, 8}) {
      CAPTURE(start);
      CHECK(same([&](const Tensor& t) { return t.narrow_view(3, start, 64).transpose_view(1, 2); }));
      CHECK(same([&](const Tensor& t) { return t.narrow_view(3, start, 71).transpose_view(1, 2); }));
    }
  }
}

#ifdef TT_WITH_CUDA
TEST_CASE("CUDA strided copy of 1.5 * 2^30 elements: 32-bit index arithmetic inside a 64-bit loop") {
  // A transpose (innermost stride not 1, so element by element) of 3 * 2^29 floats: every index and offset
  // fits in 32 bits, but the grid holds more threads than 2^31 minus that, so a 32-bit loop counter would
  // wrap to negative indices. 12 GiB of device memory.
  size_t free_bytes = 0, total_bytes = 0;
  TT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < (size_t{14} << 30)) {
    MESSAGE("skipped: needs 14 GiB of free device memory");
    return;
  }
  const int64_t rows = 3 * 16384, cols = 32768;
  Tensor y;
  {
    const Tensor x = Tensor::full({rows, cols}, 1.0, DType::f32, Device::cuda(0));
    y = ops::contiguous(x.transpose_view(0, 1));
  }
  CHECK(y.shape() == Shape{cols, rows});
  CHECK(ops::sum(y).item() == static_cast<double>(rows * cols));
  y = Tensor();
  empty_cache(Device::cuda(0));
}
#endif

TEST_CASE("CUDA casts round exactly like the CPU") {
  const Tensor x = randn({10007}, 8, 100.0);
  const Tensor cpu_bf = ops::cast(x, DType::bf16);
  const Tensor gpu_bf = ops::cast(x.to(Device::cuda(0)), DType::bf16);
  CHECK(cpu_bf.to_floats() == gpu_bf.to_floats());
  CHECK(ops::cast(gpu_bf, DType::f32).to_floats() == cpu_bf.to_floats());
  // Unaligned starts and ragged tails take the scalar path around the vectorised one.
  const Tensor gx = x.to(Device::cuda(0));
  for (int64_t start : {1, 2, 3, 4}) {
    CAPTURE(start);
    const int64_t len = 10007 - start - 2;
    CHECK(ops::cast(gx.narrow_view(0, start, len), DType::bf16).to_floats() ==
          ops::cast(x.narrow_view(0, start, len), DType::bf16).to_floats());
  }
}

#ifdef TT_WITH_CUDA
TEST_CASE("CUDA add_ranks_scaled (the copy-engine all-reduce's reduction) equals its CPU twin bit for bit") {
  for (DType type : {DType::f32, DType::bf16}) {
    for (int64_t start : {0, 1, 3, 8}) {
      for (int count : {1, 2, 4, 8}) {
        const std::string dtype_text = dtype_name(type);
        CAPTURE(dtype_text);
        CAPTURE(start);
        CAPTURE(count);
        const int64_t n = 10007 - 9;  // room for the offsets
        const Tensor a = ops::cast(randn({10007}, 21), type);
        std::vector<Tensor> others;
        for (int i = 0; i < count; ++i) others.push_back(ops::cast(randn({10007}, 22 + i), type));
        Tensor cpu_dst = a.clone(), gpu_dst = a.to(Device::cuda(0));
        std::vector<Tensor> gpu_others;
        for (const Tensor& t : others) gpu_others.push_back(t.to(Device::cuda(0)));
        // Unaligned starts (dst and the inputs misaligned differently) take the scalar path. dst is one of
        // the inputs (the all-reduce's own copy), at position count / 2, as the rank order puts it.
        Tensor gd = gpu_dst.narrow_view(0, start, n), cd = cpu_dst.narrow_view(0, start, n);
        std::vector<const void*> gpu_in, cpu_in;
        for (int i = 0; i < count; ++i) {
          const int64_t offset = i == 0 ? 0 : (start * (i + 1)) % 9;
          gpu_in.push_back(gpu_others[i].narrow_view(0, offset, n).raw_data());
          cpu_in.push_back(others[i].narrow_view(0, offset, n).raw_data());
        }
        gpu_in[count / 2] = gd.raw_data();
        cpu_in[count / 2] = cd.raw_data();
        for (float scale : {1.0f, 0.5f, 1.0f / 3.0f}) {
          cuda::add_ranks_scaled(gd.raw_data(), gpu_in.data(), count, type, n, scale,
                                 static_cast<cudaStream_t>(compute_stream(0)));
          cpu::add_ranks_scaled(cd.raw_data(), cpu_in.data(), count, type, n, scale);
        }
        CHECK(gpu_dst.to_floats() == cpu_dst.to_floats());
        CHECK(gpu_dst.to_floats() != a.to_floats());
      }
    }
  }
}
#endif

#ifdef TT_WITH_CUDA
TEST_CASE("DeviceClock on CUDA measures GPU time between its points, not the host's") {
  // Twenty 2048^3 f32 products (about 7 ms on an H100) between two points: the host queues them in far less
  // time, the GPU span covers them; an empty span measures next to nothing.
  const Tensor a = randn({2048, 2048}, 31).to(Device::cuda(0));
  Tensor c = ops::matmul(a, a);  // the matmul's plan and memory exist before the timed span
  synchronize(Device::cuda(0));
  DeviceClock clock(Device::cuda(0));
  for (int round = 0; round < 2; ++round) {  // the second round reuses the events
    clock.clear();
    const auto host_start = std::chrono::steady_clock::now();
    const size_t t0 = clock.mark();
    for (int i = 0; i < 20; ++i) c = ops::matmul(a, a);
    const size_t t1 = clock.mark();
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start).count();
    const size_t t2 = clock.mark();
    const double gpu_ms = clock.ms_between(t0, t1);
    CHECK(gpu_ms > 1.0);
    CHECK(gpu_ms > 2 * host_ms);  // the host only queued the products
    CHECK(clock.ms_between(t1, t2) < 0.5);
    CHECK_THROWS_AS(clock.ms_between(t0, t2 + 1), Error);
  }
}
#endif

TEST_CASE("CUDA matmul (cuBLASLt) equals the CPU: f32 and bf16, every transpose, batched") {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      const int64_t m = 67, n = 45, k = 129;
      const Shape as = ta ? Shape{3, k, m} : Shape{3, m, k}, bs = tb ? Shape{3, n, k} : Shape{3, k, n};
      auto op = [&](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1], ta, tb, 0.7); };
      CHECK(cuda_vs_cpu(op, {randn(as, 10), randn(bs, 11)}) < kF32);
      // bf16 inputs: identical bf16 operands on both sides, f32 accumulation, so results agree closely.
      CHECK(cuda_vs_cpu(op, {ops::cast(randn(as, 12), DType::bf16), ops::cast(randn(bs, 13), DType::bf16)}) <
            1e-2);
    }
  }
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::linear(in[0], in[1]); },
                    {randn({4, 16, 96}, 14), randn({80, 96}, 15)}) < kF32);
  // Matmuls planned for fewer SMs (room for communication kernels) give the same results.
  set_matmul_sm_margin(16);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::linear(in[0], in[1]); },
                    {randn({4, 160, 512}, 16), randn({384, 512}, 17)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::linear(in[0], in[1], DType::bf16, DType::f32); },
                    {randn({4, 160, 512}, 18), randn({384, 512}, 19)}) < 1e-2);
  set_matmul_sm_margin(0);
}

TEST_CASE("CUDA model ops equal the CPU") {
  const Tensor ids = Tensor::from_ints({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6});
  CHECK(cuda_vs_cpu([&](const auto& in) { return ops::embedding(in[0], in[1]); },
                    {randn({10, 32}, 20), ids}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rms_norm(in[0], in[1], 1e-5); },
                    {randn({7, 5, 300}, 21), randn({300}, 22)}) < kF32);
  // The backward's blocks take runs of rows for the weight gradient's partial sums: 1101 rows make runs of
  // 5 and a last run of 1. The sums live in shared memory: rows of 13000 need more than the default 48 KiB
  // of it (13001: element by element, 1024 threads); rows of 60000 exceed any device's shared memory and
  // sum in global memory instead.
  auto rms = [](const auto& in) { return ops::rms_norm(in[0], in[1], 1e-5); };
  CHECK(cuda_vs_cpu(rms, {randn({1101, 64}, 31), randn({64}, 32)}) < kF32);
  // The same with x's gradient collected first (the sum's), which the norm's backward then adds into.
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::add(ops::rms_norm(in[0], in[1], 1e-5), in[0]); },
                    {randn({1101, 64}, 39), randn({64}, 40)}) < kF32);
  CHECK(cuda_vs_cpu(rms, {randn({3, 13000}, 33), randn({13000}, 34)}) < kF32);
  CHECK(cuda_vs_cpu(rms, {randn({3, 13001}, 35), randn({13001}, 36)}) < kF32);
  CHECK(cuda_vs_cpu(rms, {randn({5, 60000}, 37), randn({60000}, 38)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 64, 10000.0); },
                    {randn({2, 300, 256}, 23)}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 80, 10000.0); }, {randn({1, 50, 160}, 24)}) <
        kF32);
  // Heads of 3 pairs (a pair at a time, element by element), and rows of 2048 four-element groups (each
  // thread loops over two).
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 6, 10000.0); }, {randn({2, 9, 24}, 39)}) <
        kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 64, 10000.0); }, {randn({1, 3, 8192}, 40)}) <
        kF32);
  // A pair straddling an 8-byte boundary (the input starts one element in): the element-wise path.
  {
    const Tensor flat = randn({2 * 50 * 160 + 1}, 30);
    auto rotate = [](const Tensor& t, DType out) {
      return ops::rope(ops::reshape(t.narrow_view(0, 1, 2 * 50 * 160), {2, 50, 160}), 80, 10000.0, out);
    };
    for (DType out : {DType::f32, DType::bf16}) {
      CHECK(relative_error(rotate(flat.to(Device::cuda(0)), out).to_doubles(),
                           rotate(flat, out).to_doubles()) < (out == DType::f32 ? kF32 : 1e-2));
    }
  }
  for (bool causal : {false, true}) {
    CHECK(cuda_vs_cpu([&](const auto& in) { return ops::softmax(in[0], 0.125, causal); },
                      {randn({3, 130, 130}, 25)}) < kF32);
  }
  const std::vector<int32_t> t = {0, 999, 17, 500, 3, 250};
  CHECK(cuda_vs_cpu([&](const auto& in) { return ops::cross_entropy(in[0], in[1]); },
                    {randn({6, 1000}, 26, 3.0), Tensor::from_ints(t, {6})}) < kF32);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::naive_attention(in[0], in[1], in[2], true); },
                    {randn({2, 3, 40, 16}, 27), randn({2, 3, 40, 16}, 28), randn({2, 3, 40, 16}, 29)}) <
        kF32);
}

TEST_CASE(
    "CUDA linear_cross_entropy (chunked, rows padded) equals its CPU twin: f32 and bf16, V up to 50257") {
  // 300 rows in one chunk or in chunks of 128 (the last one short); vocabularies that are not multiples of 8,
  // GPT-2's among them. cuda_vs_cpu's backward scales the gradients by a random loss gradient; a gradient of
  // exactly 1 (skipped on the device) is checked after. bf16: both round the logits to bf16 (their f32 sums,
  // made in different orders, may round apart now and then) and the logits' gradient; the tolerances are
  // well above that (about 2e-5 on the gradients, 1e-7 on the loss) and below what f32 logits on one side
  // would give (about 1e-3 on the gradients, 5e-6 to 3e-5 on the loss).
  auto bf = [](const Tensor& t) { return ops::cast(t, DType::bf16); };
  for (const int64_t vocab : {int64_t{257}, int64_t{1001}, int64_t{50257}}) {
    std::vector<int32_t> ids(300);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 3) % vocab);
    ids[7] = static_cast<int32_t>(vocab - 1);
    const Tensor targets = Tensor::from_ints(ids, {300});
    const Tensor x = randn({3, 100, 64}, 400), w = randn({vocab, 64}, 401, 0.3);
    for (const int64_t chunk : {int64_t{0}, int64_t{128}}) {
      CAPTURE(vocab);
      CAPTURE(chunk);
      for (const DType compute : {DType::f32, DType::bf16}) {
        const std::string compute_text = dtype_name(compute);
        CAPTURE(compute_text);
        auto op = [&](const std::vector<Tensor>& in) {
          return ops::linear_cross_entropy(in[0], in[1], in[2], compute, chunk);
        };
        // bf16: x in bf16 as the final norm hands it over, the f32 weight cast inside.
        const Tensor x_in = compute == DType::bf16 ? bf(x) : x;
        const double tol = compute == DType::f32 ? kF32 : 3e-4;
        CHECK(cuda_vs_cpu(op, {x_in, w, targets}) < tol);
        std::vector<Tensor> cpu_in = {x_in.clone(), w.clone(), targets};
        std::vector<Tensor> gpu_in = {x_in.to(Device::cuda(0)), w.to(Device::cuda(0)),
                                      targets.to(Device::cuda(0))};
        for (size_t i = 0; i < 2; ++i) {
          cpu_in[i].set_requires_grad(true);
          gpu_in[i].set_requires_grad(true);
        }
        const Tensor cpu_loss = op(cpu_in), gpu_loss = op(gpu_in);
        CHECK(relative_error(gpu_loss.to_doubles(), cpu_loss.to_doubles()) < 2e-6);
        cpu_loss.backward();
        gpu_loss.backward();
        for (size_t i = 0; i < 2; ++i) {
          CHECK(relative_error(gpu_in[i].grad().to_doubles(), cpu_in[i].grad().to_doubles()) < tol);
        }
      }
    }
  }
}

#ifdef TT_WITH_CUDA
TEST_CASE(
    "CUDA cross_entropy_rows: one pass where a row fits in shared memory, two beyond; the CPU's values") {
  // Rows of 1024 and of GPT-2's 50304 padded columns fit in shared memory (100 KB in bf16, 201 KB in f32);
  // 1004 bf16 columns are not whole 16-byte groups, and rows of 256 KB exceed what a block may take on an
  // H100 or H200 (227 KB): those go through the two-pass kernel. The gradient in place of the logits or
  // apart; the padding columns hold values no logit has, which neither the loss nor the gradient may see.
  struct Case {
    DType logits, grad;
    int64_t ld, vocab, rows;
    bool in_place;
  };
  const Case cases[] = {
      {DType::f32, DType::f32, 1024, 1001, 7, true},        {DType::f32, DType::bf16, 1024, 1001, 7, false},
      {DType::bf16, DType::bf16, 1024, 1001, 7, true},      {DType::bf16, DType::bf16, 1024, 1001, 7, false},
      {DType::bf16, DType::bf16, 50304, 50257, 5, true},    {DType::f32, DType::f32, 50304, 50257, 3, true},
      {DType::bf16, DType::bf16, 1004, 1001, 5, true},      {DType::f32, DType::f32, 65536, 65519, 3, true},
      {DType::bf16, DType::bf16, 131072, 131063, 3, false},
  };
  const Device gpu = Device::cuda(0);
  const cudaStream_t stream = static_cast<cudaStream_t>(compute_stream(0));
  const double scale = 0.25;
  for (const Case& c : cases) {
    const std::string logits_text = dtype_name(c.logits), grad_text = dtype_name(c.grad);
    CAPTURE(logits_text);
    CAPTURE(grad_text);
    CAPTURE(c.ld);
    CAPTURE(c.in_place);
    std::vector<float> values = testing::random_floats(c.rows * c.ld, static_cast<uint32_t>(c.ld), 3.0f);
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t j = c.vocab; j < c.ld; ++j) values[i * c.ld + j] = 1e4f;
    }
    std::vector<int32_t> ids(static_cast<size_t>(c.rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 1) % c.vocab);
    ids.back() = static_cast<int32_t>(c.vocab - 1);
    const Tensor host_logits = ops::cast(Tensor::from_floats(values, {c.rows, c.ld}), c.logits);
    const Tensor targets = Tensor::from_ints(ids, {c.rows}).to(gpu);
    const Tensor logits = host_logits.to(gpu), losses = Tensor::empty({c.rows}, DType::f32, gpu);
    // The loss alone first, with an out-of-range target in row 0: NaN there, the other rows finite.
    {
      std::vector<int32_t> bad = ids;
      bad[0] = -1;
      const Tensor bad_targets = Tensor::from_ints(bad, {c.rows}).to(gpu);
      cuda::cross_entropy_rows(logits.raw_data(), c.logits, c.ld, bad_targets.data<int32_t>(),
                               losses.data<float>(), nullptr, c.grad, scale, c.rows, c.vocab, stream);
      const std::vector<float> got = losses.to_floats();
      CHECK(std::isnan(got[0]));
      CHECK(std::isfinite(got[1]));
    }
    const Tensor grad = c.in_place ? logits : Tensor::empty({c.rows, c.ld}, c.grad, gpu);
    cuda::cross_entropy_rows(logits.raw_data(), c.logits, c.ld, targets.data<int32_t>(), losses.data<float>(),
                             grad.raw_data(), c.grad, scale, c.rows, c.vocab, stream);
    // The CPU twin: f32 rows, or bf16 ones widened; a bf16 gradient rounded once.
    std::vector<float> cpu_losses(static_cast<size_t>(c.rows));
    Tensor cpu_grad = Tensor::empty({c.rows, c.ld}, c.grad);
    if (c.logits == DType::bf16) {
      cpu::cross_entropy_rows_bf16(host_logits.data<bf16>(), c.ld, ids.data(), cpu_losses.data(),
                                   cpu_grad.data<bf16>(), scale, c.rows, c.vocab);
    } else {
      Tensor wide = Tensor::empty({c.rows, c.ld}, DType::f32);
      cpu::cross_entropy_rows(host_logits.data<float>(), c.ld, ids.data(), cpu_losses.data(),
                              wide.data<float>(), scale, c.rows, c.vocab);
      cpu_grad = ops::cast(wide, c.grad);
    }
    const std::vector<double> got_losses = losses.to_doubles(), got_grad = grad.to_doubles();
    CHECK(relative_error(got_losses, std::vector<double>(cpu_losses.begin(), cpu_losses.end())) < 2e-6);
    // A bf16 element may round the other way where the two f32 values straddle a rounding point.
    CHECK(relative_error(got_grad, cpu_grad.to_doubles()) < (c.grad == DType::f32 ? kF32 : 3e-4));
    double padding = 0;
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t j = c.vocab; j < c.ld; ++j) padding = std::max(padding, std::abs(got_grad[i * c.ld + j]));
    }
    CHECK(padding == 0.0);
  }
}
#endif

TEST_CASE(
    "CUDA linear_cross_entropy at GPT-2's vocabulary: the batch's logits never held, the unfused values") {
  // 8192 rows of 50257 logits are 1.6 GB in f32: two chunks of at most 1 GiB each. Against the unfused ops
  // on the GPU as autocast computes them (cross_entropy over linear's logits, made in the compute dtype and
  // upcast), f32 and bf16.
  const Device gpu = Device::cuda(0);
  const int64_t rows = 8192, vocab = 50257, d = 64;
  std::vector<int32_t> ids(rows);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 11) % vocab);
  const Tensor targets = Tensor::from_ints(ids, {rows}).to(gpu);
  const Tensor x0 = randn({rows, d}, 410).to(gpu), w0 = randn({vocab, d}, 411, 0.3).to(gpu);
  for (const DType compute : {DType::f32, DType::bf16}) {
    const std::string compute_text = dtype_name(compute);
    CAPTURE(compute_text);
    auto run = [&](bool fused, int64_t* largest_bytes) {
      Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
      int64_t largest = 0;
      set_memory_recorder([&](const MemoryEvent& e) {
        if (e.is_alloc) largest = std::max(largest, e.bytes);
      });
      const Tensor loss =
          fused ? ops::linear_cross_entropy(x, w, targets, compute)
                : ops::cross_entropy(ops::cast(ops::linear(x, w, compute, compute), DType::f32), targets);
      loss.backward();
      synchronize(gpu);
      set_memory_recorder(nullptr);
      if (largest_bytes) *largest_bytes = largest;
      return std::vector<std::vector<double>>{loss.to_doubles(), x.grad().to_doubles(),
                                              w.grad().to_doubles()};
    };
    int64_t largest = 0;
    const auto fused = run(true, &largest);
    const auto plain = run(false, nullptr);
    CHECK(largest <= (int64_t{1} << 30));
    const double tol = compute == DType::f32 ? kF32 : 3e-4;
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(relative_error(fused[i], plain[i]) < tol);
    }
  }
}

TEST_CASE("CUDA fused-precision ops equal their CPU twins: bf16 outputs of matmul, RMSNorm, SwiGLU, RoPE") {
  const double kBf16 = 1e-2;
  auto bf = [](const Tensor& t) { return ops::cast(t, DType::bf16); };
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::swiglu(in[0], in[1]); },
                    {bf(randn({33, 257}, 50)), bf(randn({33, 257}, 51))}) < kBf16);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rms_norm(in[0], in[1], 1e-5, DType::bf16); },
                    {randn({7, 5, 300}, 52), randn({300}, 53)}) < kBf16);
  for (DType out : {DType::f32, DType::bf16}) {
    CHECK(cuda_vs_cpu([&](const auto& in) { return ops::linear(in[0], in[1], DType::bf16, out); },
                      {randn({4, 16, 96}, 54), randn({80, 96}, 55)}) < kBf16);
  }
  // RoPE from f32 to bf16 (the model's Q and K), its gradient coming back in bf16.
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 64, 10000.0, DType::bf16); },
                    {randn({2, 33, 128}, 56)}) < kBf16);
  // bf16 in and out (eight-element groups): heads of 80 as in the 2.7b model, and rows of 2048 groups.
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 80, 10000.0); },
                    {bf(randn({2, 33, 320}, 57))}) < kBf16);
  CHECK(cuda_vs_cpu([](const auto& in) { return ops::rope(in[0], 128, 10000.0); },
                    {bf(randn({1, 3, 16384}, 58))}) < kBf16);
  // The model's path: bf16 SwiGLU receiving an f32 gradient (from the f32 product of the next matmul).
  {
    const Tensor a = bf(randn({33, 257}, 59)), b = bf(randn({33, 257}, 60)), g = randn({33, 257}, 61);
    Tensor ac = a.clone(), bc = b.clone(), ag = a.to(Device::cuda(0)), bg = b.to(Device::cuda(0));
    for (Tensor* t : {&ac, &bc, &ag, &bg}) t->set_requires_grad(true);
    ops::swiglu(ac, bc).backward(g);
    ops::swiglu(ag, bg).backward(g.to(Device::cuda(0)));
    CHECK(relative_error(ag.grad().to_doubles(), ac.grad().to_doubles()) < kBf16);
    CHECK(relative_error(bg.grad().to_doubles(), bc.grad().to_doubles()) < kBf16);
  }
  // A bf16 output with a long inner dimension (where split-K is likely) is the f32 product rounded once:
  // within half a bf16 unit (2^-9 relative) of the f32 result, where partial sums meeting in bf16 would not
  // be.
  {
    const Tensor x = bf(randn({8, 8192}, 62)), w = bf(randn({16, 8192}, 63));
    const Tensor xg = x.to(Device::cuda(0)), wg = w.to(Device::cuda(0));
    const std::vector<double> narrow = ops::linear(xg, wg, DType::bf16, DType::bf16).to_doubles();
    const std::vector<double> wide = ops::linear(xg, wg, DType::bf16, DType::f32).to_doubles();
    for (size_t i = 0; i < wide.size(); ++i)
      CHECK(std::abs(narrow[i] - wide[i]) <= std::abs(wide[i]) / 256 + 1e-6);
  }
  // The residual added in the GEMM's epilogue (cuBLASLt reading C from another buffer than D).
  for (DType compute : {DType::f32, DType::bf16}) {
    CAPTURE(static_cast<int>(compute));
    CHECK(cuda_vs_cpu([&](const auto& in) { return ops::linear_residual(in[2], in[0], in[1], compute); },
                      {randn({4, 16, 96}, 64), randn({80, 96}, 65), randn({4, 16, 80}, 66)}) <
          (compute == DType::f32 ? kF32 : kBf16));
  }
  // The sum made in the copy of the residual that RMSNorm wrote (cuBLASLt adding into its own output); the
  // copy itself is x bit for bit, on the four-wide path (96 columns) and the element-wise one (90).
  for (const int64_t d : {96, 90}) {
    for (DType compute : {DType::f32, DType::bf16}) {
      CAPTURE(d);
      CAPTURE(static_cast<int>(compute));
      CHECK(cuda_vs_cpu(
                [&](const auto& in) {
                  Tensor copy;
                  const Tensor n = ops::rms_norm(in[0], in[1], 1e-5, compute, &copy);
                  CHECK(copy.to_floats() == in[0].to_floats());
                  return ops::linear_residual(in[0], n, in[2], compute, false, copy);
                },
                {randn({4, 16, d}, 70), randn({d}, 71), randn({d, d}, 72, 0.2)}) <
            (compute == DType::f32 ? kF32 : kBf16));
    }
  }
  // The fused attention front (one matmul, strided RoPE, flash on the fused layout) against the CPU, in f32
  // and bf16, head dims 64 and 80 (the Hopper and the mma.sync flash kernels).
  for (const int64_t d : {64, 80}) {
    for (DType compute : {DType::f32, DType::bf16}) {
      CAPTURE(d);
      CAPTURE(static_cast<int>(compute));
      const int64_t n = 2 * d;
      CHECK(cuda_vs_cpu(
                [&](const auto& in) {
                  return ops::attention_qkv(in[0], in[1], in[2], in[3], 2, 10000.0, compute);
                },
                {randn({2, 70, 96}, 73), randn({n, 96}, 74, 0.1), randn({n, 96}, 75, 0.1),
                 randn({n, 96}, 76, 0.1)}) < (compute == DType::f32 ? 1e-4 : 2e-2));
    }
  }
  // SwiGLU's two projections as one matmul, the gate read from its two column blocks (rows of n = 100: four
  // elements at a time; 90: one at a time; 70000 rows of 4: more rows than one grid dimension holds).
  for (const auto& [rows, in, n] :
       {std::tuple<int64_t, int64_t, int64_t>{140, 96, 100}, {140, 96, 90}, {70000, 8, 4}}) {
    for (DType compute : {DType::f32, DType::bf16}) {
      CAPTURE(n);
      CAPTURE(static_cast<int>(compute));
      const Tensor x = randn({rows, in}, 77);
      CHECK(cuda_vs_cpu(
                [&](const auto& t) { return ops::swiglu_projection(t[0], t[1], t[2], compute, true); },
                {compute == DType::bf16 ? bf(x) : x, randn({n, in}, 78, 0.1), randn({n, in}, 79, 0.1)}) <
            (compute == DType::f32 ? 1e-4 : 2e-2));
    }
  }
  // The model's bf16 path into a norm: its output feeds one op whose x gradient comes back in bf16, which
  // the norm's kernel reads as it is: rows of 96 (a four-element group per thread), 90 (one element at a
  // time), 4104 (more groups than threads: the general four-wide path) and 12304 (partial sums in more
  // than 48 KiB of shared memory).
  for (const int64_t d : {96, 90, 4104, 12304}) {
    CAPTURE(d);
    CHECK(cuda_vs_cpu(
              [&](const auto& t) {
                const Tensor y = ops::rms_norm(t[0], t[1], 1e-5, DType::bf16);
                return ops::swiglu_projection(y, t[2], t[3], DType::bf16, /*narrow_x_grad=*/true);
              },
              {randn({2, 70, d}, 80), randn({d}, 81), randn({64, d}, 82, 0.1), randn({64, d}, 83, 0.1)}) <
          2e-2);
  }
  // A sole consumer's bf16 input gradient, rounded by cuBLASLt's epilogue (narrow_x_grad).
  CHECK(cuda_vs_cpu(
            [&](const auto& in) {
              return ops::linear_residual(in[2], ops::cast(in[0], DType::bf16), in[1], DType::bf16, true);
            },
            {randn({4, 16, 96}, 67), randn({80, 96}, 68), randn({4, 16, 80}, 69)}) < kBf16);
  // The weight gradient added in place into a pre-assigned .grad (beta = 1 in cuBLASLt) on both devices.
  for (DType compute : {DType::f32, DType::bf16}) {
    CAPTURE(static_cast<int>(compute));
    const Tensor x = randn({3, 8, 64}, 56), w = randn({48, 64}, 57), g0 = randn({48, 64}, 58);
    Tensor wc = w.clone(), wg = w.to(Device::cuda(0));
    wc.set_requires_grad(true);
    wg.set_requires_grad(true);
    wc.set_grad(g0.clone());
    wg.set_grad(g0.to(Device::cuda(0)));
    ops::sum(ops::linear(x, wc, compute, DType::f32)).backward();
    ops::sum(ops::linear(x.to(Device::cuda(0)), wg, compute, DType::f32)).backward();
    CHECK(relative_error(wg.grad().to_doubles(), wc.grad().to_doubles()) <
          (compute == DType::f32 ? kF32 : kBf16));
  }
}

TEST_CASE("CUDA gradients added in place (GEMM with beta = 1, RMSNorm accumulating) equal the CPU") {
  // A transformer block's pattern: x feeds a norm and the residual, the norm three linears, and so on (the
  // products of the CPU-only mul are SwiGLU gates here).
  // d 64: the four-at-a-time RMSNorm kernels; d 66: element by element.
  for (const auto& [bf16, d] : {std::pair{false, int64_t{64}}, std::pair{true, int64_t{64}},
                                std::pair{false, int64_t{66}}, std::pair{true, int64_t{66}}}) {
    CAPTURE(bf16);
    CAPTURE(d);
    const DType narrow = bf16 ? DType::bf16 : DType::f32;
    auto block = [&](const std::vector<Tensor>& in) {
      auto lin = [&](const Tensor& t, const Tensor& w) { return ops::linear(t, w, narrow, DType::f32); };
      const Tensor n1 = ops::rms_norm(in[0], in[1], 1e-5, narrow);
      const Tensor h = ops::add(in[0], ops::add(lin(n1, in[2]), ops::swiglu(lin(n1, in[3]), lin(n1, in[4]))));
      const Tensor n2 = ops::rms_norm(h, in[5], 1e-5, narrow);
      return ops::add(h, ops::swiglu(lin(n2, in[6]), lin(n2, in[7])));
    };
    const std::vector<Tensor> inputs = {
        randn({2, 24, d}, 130),  randn({d}, 131), randn({d, d}, 132, 0.2), randn({d, d}, 133, 0.2),
        randn({d, d}, 134, 0.2), randn({d}, 135), randn({d, d}, 136, 0.2), randn({d, d}, 137, 0.2)};
    CHECK(cuda_vs_cpu(block, inputs) < (bf16 ? 1e-2 : kF32));
    // On CUDA neither the second and third linears nor the norms allocate an x-sized gradient of their own.
    const int64_t x_bytes = 2 * 24 * d * 4;
    // A scalar root, as a loss is: the gradients flowing back are then the engine's own.
    const Tensor out =
        ops::sum(ops::swiglu(block(gpu_leaves(inputs)), randn({2, 24, d}, 138).to(Device::cuda(0))));
    const BackwardAllocations allocs = backward_allocations(out, x_bytes, x_bytes + 512);
    CHECK(allocs.linear == 2);
    CHECK(allocs.norm == 0);
  }
}

TEST_CASE(
    "CUDA RMSNorm hands a bf16 model's residual gradient a bf16 copy, which the matmul it feeds takes") {
  const Device gpu = Device::cuda(0);
#ifdef TT_WITH_CUDA
  // The kernel: the copy is the final dx (after the in-place addition) rounded once; d 66 goes element by
  // element.
  for (int64_t d : {int64_t{64}, int64_t{66}}) {
    CAPTURE(d);
    const Tensor x = randn({40, d}, 150).to(gpu), dy = randn({40, d}, 151).to(gpu),
                 w = randn({d}, 152).to(gpu);
    Tensor inv_rms = Tensor::empty({40}, DType::f32, gpu), y = Tensor::empty({40, d}, DType::bf16, gpu);
    Tensor dx = randn({40, d}, 153).to(gpu), dw = Tensor::empty({d}, DType::f32, gpu);
    const Tensor copy = ops::cast(Tensor::full({40, d}, NAN, DType::f32, gpu), DType::bf16);
    const cudaStream_t s = static_cast<cudaStream_t>(compute_stream(0));
    cuda::rms_norm_forward(x.data<float>(), w.data<float>(), y.raw_data(), DType::bf16, inv_rms.data<float>(),
                           40, d, 1e-5, s);
    cuda::rms_norm_backward(dy.raw_data(), DType::f32, x.data<float>(), w.data<float>(),
                            inv_rms.data<float>(), dx.data<float>(), dw.raw_data(), 40, d, s, true,
                            DType::f32, copy.raw_data());
    CHECK(copy.to_floats() == ops::cast(dx, DType::bf16).to_floats());
  }
#endif
  // In a graph: h = x + ln1(x) W1^T, out = h + ln2(h) W2^T in bf16. ln2's backward adds into h's gradient
  // (the residual's) and hands W1's backward the bf16 copy; the gradients equal the CPU's, which casts.
  const int64_t rows = 48, d = 64;
  auto net = [&](const std::vector<Tensor>& in) {
    const Tensor h =
        ops::linear_residual(in[0], ops::rms_norm(in[0], in[1], 1e-5, DType::bf16), in[2], DType::bf16);
    return ops::linear_residual(h, ops::rms_norm(h, in[3], 1e-5, DType::bf16), in[4], DType::bf16);
  };
  const std::vector<Tensor> inputs = {randn({rows, d}, 154), randn({d}, 155), randn({d, d}, 156, 0.2),
                                      randn({d}, 157), randn({d, d}, 158, 0.2)};
  CHECK(cuda_vs_cpu(net, inputs) < 1e-2);
  // Only W2's backward (whose incoming gradient is the root's) casts an x-sized gradient to bf16; both
  // norms write a copy.
  const std::vector<Tensor> on_gpu = gpu_leaves(inputs);
  // A scalar root, as a loss is: the gradients flowing back are then the engine's own, free to add into.
  const Tensor out = ops::sum(ops::swiglu(net(on_gpu), randn({rows, d}, 159).to(gpu)));
  const BackwardAllocations bf16_grads = backward_allocations(out, rows * d * 2, rows * d * 2 + 512);
  CHECK(bf16_grads.linear == 1);
  CHECK(bf16_grads.norm == 2);
  CHECK(on_gpu[0].grad().low_precision_copy().defined() == false);  // dropped as x's .grad adopted it
}

TEST_CASE("CUDA RMSNorm writes its weight gradient into a zero-marked .grad, f32 or bf16 (rounded once)") {
  const Device gpu = Device::cuda(0);
  // 300 rows: blocks of two rows in the two-stage dw sum; 5 rows: a block per row.
  for (int64_t rows : {int64_t{300}, int64_t{5}}) {
    CAPTURE(rows);
    const Tensor x = randn({rows, 96}, 140).to(gpu), g = randn({rows, 96}, 141).to(gpu);
    Tensor w = randn({96}, 142).to(gpu);
    w.set_requires_grad(true);
    ops::rms_norm(x, w, 1e-5).backward(g);
    const Tensor returned = w.grad();
    for (DType type : {DType::f32, DType::bf16}) {
      w.set_grad(ops::cast(Tensor::full({96}, NAN, DType::f32, gpu), type));
      mark_grad_zeroed(w);
      ops::rms_norm(x, w, 1e-5).backward(g);
      CHECK(w.grad().dtype() == type);
      CHECK(w.grad().to_floats() == ops::cast(returned, type).to_floats());
    }
  }
}

TEST_CASE("CUDA AdamW equals the CPU") {
  const int64_t n = 10003;
  Tensor cpu_p = randn({n}, 30), gpu_p = cpu_p.to(Device::cuda(0));
  cpu_p.set_requires_grad(true);
  gpu_p.set_requires_grad(true);
  optim::AdamW cpu_opt({cpu_p}), gpu_opt({gpu_p});
  for (int step = 0; step < 3; ++step) {
    const Tensor g = randn({n}, 31 + step);
    cpu_p.set_grad(g);
    gpu_p.set_grad(g.to(Device::cuda(0)));
    cpu_opt.step();
    gpu_opt.step();
  }
  CHECK(relative_error(gpu_p.to_doubles(), cpu_p.to_doubles()) < 1e-6);
}

TEST_CASE("CUDA allocator caches blocks and tracks peak bytes") {
  const Device gpu = Device::cuda(0);
  { const Tensor warm = Tensor::empty({1 << 20}, DType::f32, gpu); }
  const MemoryStats before = memory_stats(gpu);
  for (int i = 0; i < 10; ++i) {
    const Tensor t = Tensor::empty({1 << 20}, DType::f32, gpu);
  }
  const MemoryStats after = memory_stats(gpu);
  CHECK(after.device_allocs == before.device_allocs);  // served from the cache
  CHECK(after.current_bytes == before.current_bytes);
  CHECK(after.peak_bytes >= before.current_bytes + (4 << 20));
}

TEST_CASE("CUDA allocator counts a captured graph's pool as in use until the graph is gone") {
  const Device gpu = Device::cuda(0);
  Tensor out = Tensor::zeros({16}, DType::f32, gpu);
  synchronize(gpu);
  const int64_t before = memory_stats(gpu).current_bytes;
  constexpr int64_t kTemporary = 8 << 20;  // a multiple of the large-block rounding
  {
    CudaGraph graph(gpu);
    graph.capture([&] {
      Tensor temporary = Tensor::zeros({kTemporary / 4}, DType::f32, gpu);  // freed inside the capture
      out.copy_(temporary.narrow_view(0, 0, 16));
    });
    // The temporary's block is free but the graph's: its replays write it.
    CHECK(memory_stats(gpu).current_bytes == before + kTemporary);
    CHECK(memory_stats(gpu).peak_bytes >= before + kTemporary);
    graph.replay();
    synchronize(gpu);
    {
      // An eager allocation of the same size cannot take the graph's block: it counts on top.
      const Tensor eager = Tensor::empty({kTemporary / 4}, DType::f32, gpu);
      CHECK(memory_stats(gpu).current_bytes >= before + 2 * kTemporary);
    }
  }
  CHECK(memory_stats(gpu).current_bytes == before);
}

TEST_CASE("tiny model forward+backward on CUDA equals the CPU (f32 and bf16)") {
  for (const char* precision : {"f32", "bf16"}) {
    for (const char* attention : {"naive", "flash"}) {
      CAPTURE(precision);
      CAPTURE(attention);
      nn::ModelConfig config = nn::preset("tiny");
      config.vocab_size = 300;
      config.context_length = 64;
      config.precision = nn::parse_precision(precision);
      config.attention = nn::parse_attention(attention);
      nn::TransformerLM cpu_model(config), gpu_model(config);
      nn::FlatParameters cpu_flat(cpu_model, Device::cpu(), 5), gpu_flat(gpu_model, Device::cuda(0), 5);
      CHECK(cpu_flat.flat_params().to_floats() == gpu_flat.flat_params().to_floats());
      std::vector<int32_t> ids(2 * 64), targets(2 * 64);
      CounterRng rng{3, 0};
      for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(300));
      for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(300));
      const Tensor x = Tensor::from_ints(ids, {2, 64}), y = Tensor::from_ints(targets, {2, 64});
      const Tensor cpu_loss = cpu_model.loss(x, y);
      const Tensor gpu_loss = gpu_model.loss(x.to(Device::cuda(0)), y.to(Device::cuda(0)));
      cpu_loss.backward();
      gpu_loss.backward();
      const double tol = std::string(precision) == "f32" ? 1e-4 : 2e-2;
      CHECK(gpu_loss.item() == doctest::Approx(cpu_loss.item()).epsilon(tol));
      CHECK(relative_error(gpu_flat.flat_grads().to_doubles(), cpu_flat.flat_grads().to_doubles()) < tol);
    }
  }
}

TEST_CASE("device-side clipping and gradient scaling in AdamW equal host clipping (f32 and bf16 gradients)") {
  for (const DType grad_dtype : {DType::f32, DType::bf16}) {
    const std::string dtype_text = dtype_name(grad_dtype);
    CAPTURE(dtype_text);
    const int64_t n = 5003;  // a tail past the groups of four
    Tensor cpu_p = randn({n}, 40), gpu_p = cpu_p.to(Device::cuda(0));
    cpu_p.set_requires_grad(true);
    gpu_p.set_requires_grad(true);
    optim::AdamW cpu_opt({cpu_p}), gpu_opt({gpu_p});
    Tensor norm = Tensor::zeros({1}, DType::f32, Device::cuda(0)),
           factor = Tensor::zeros({1}, DType::f32, Device::cuda(0));
    gpu_opt.set_grad_scale(factor);
    for (int step = 0; step < 3; ++step) {
      // The GPU's gradients in their dtype; the CPU reference runs on them widened to f32 (the GPU scales
      // them in f32 inside AdamW).
      const Tensor g = ops::cast(randn({n}, 41 + step, 3.0), grad_dtype);
      cpu_p.set_grad(ops::cast(g, DType::f32));
      gpu_p.set_grad(g.to(Device::cuda(0)));
      const double cpu_norm = optim::clip_grad_norm({cpu_p.grad()}, 1.0);
      CHECK(cpu_norm > 1.0);
      CHECK(optim::clip_grad_norm({gpu_p.grad()}, 0.0) == doctest::Approx(cpu_norm).epsilon(1e-5));
      optim::clip_factor_on_device(gpu_p.grad(), 1.0, norm, factor);
      cpu_opt.step();
      gpu_opt.step();
      CHECK(norm.item() == doctest::Approx(cpu_norm).epsilon(1e-5));
    }
    CHECK(relative_error(gpu_p.to_doubles(), cpu_p.to_doubles()) < 1e-6);
  }
}

namespace {
// The tiny preset in bf16 with a 200-token vocabulary and context 32: the CUDA training-step tests' model.
nn::ModelConfig tiny_bf16_config(nn::AttentionKind attention) {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 200;
  config.context_length = 32;
  config.precision = nn::Precision::bf16;
  config.attention = attention;
  return config;
}
}  // namespace

TEST_CASE("a training step captured in a CUDA graph and replayed equals the eager step") {
  const nn::ModelConfig config = tiny_bf16_config(nn::AttentionKind::flash);
  nn::TransformerLM eager_model(config), graph_model(config);
  nn::FlatParameters eager(eager_model, Device::cuda(0), 9), graphed(graph_model, Device::cuda(0), 9);
  optim::AdamW eager_opt({eager.flat_params()}), graph_opt({graphed.flat_params()});
  std::vector<int32_t> ids(2 * 32), targets(2 * 32);
  CounterRng rng{5, 0};
  for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(200));
  for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(200));
  const Tensor x = Tensor::from_ints(ids, {2, 32}, Device::cuda(0)),
               y = Tensor::from_ints(targets, {2, 32}, Device::cuda(0));
  auto step_body = [&](nn::TransformerLM& model, nn::FlatParameters& params, optim::AdamW& opt) {
    params.zero_grad();
    model.loss(x, y).backward();
    opt.apply();
  };
  // Step 1 eagerly on both (warm-up: plans and allocator cache), then 3 more: eager vs graph replays.
  eager_opt.prepare_step();
  step_body(eager_model, eager, eager_opt);
  graph_opt.prepare_step();
  step_body(graph_model, graphed, graph_opt);
  synchronize(Device::cuda(0));
  CudaGraph graph(Device::cuda(0));
  graph.capture([&] { step_body(graph_model, graphed, graph_opt); });
  for (int i = 0; i < 3; ++i) {
    eager_opt.prepare_step();
    step_body(eager_model, eager, eager_opt);
    graph_opt.prepare_step();
    graph.replay();
  }
  synchronize(Device::cuda(0));
  // Same kernels on the same inputs; only flash's atomic dQ accumulation may reorder additions.
  CHECK(relative_error(graphed.flat_params().to_doubles(), eager.flat_params().to_doubles()) < 1e-5);
}

TEST_CASE("bf16 weight mirror on CUDA: written by AdamW, eager and graph-replayed, trains like casting") {
  // Naive attention: no atomics anywhere, so runs must agree bit for bit.
  const nn::ModelConfig config = tiny_bf16_config(nn::AttentionKind::naive);
  const Device gpu = Device::cuda(0);
  nn::TransformerLM cast_model(config), eager_model(config), graph_model(config);
  // Padded to an odd multiple so the flat buffers' tails take the kernel's element-wise path too.
  nn::FlatParameters cast(cast_model, gpu, 4, DType::f32, 3), eager(eager_model, gpu, 4, DType::f32, 3),
      graphed(graph_model, gpu, 4, DType::f32, 3);
  optim::AdamW cast_opt({cast.flat_params()}), eager_opt({eager.flat_params()}),
      graph_opt({graphed.flat_params()});
  eager.enable_bf16_mirror();
  eager_opt.write_bf16_mirror(&eager);
  graphed.enable_bf16_mirror();
  graph_opt.write_bf16_mirror(&graphed);
  std::vector<int32_t> ids(2 * 32), targets(2 * 32);
  CounterRng rng{6, 0};
  for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(200));
  for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(200));
  const Tensor x = Tensor::from_ints(ids, {2, 32}, gpu), y = Tensor::from_ints(targets, {2, 32}, gpu);
  auto step_body = [&](nn::TransformerLM& model, nn::FlatParameters& params, optim::AdamW& opt) {
    params.zero_grad();
    model.loss(x, y).backward();
    opt.apply();
  };
  for (auto [model, params, opt] :
       {std::tuple{&cast_model, &cast, &cast_opt}, std::tuple{&eager_model, &eager, &eager_opt},
        std::tuple{&graph_model, &graphed, &graph_opt}}) {
    opt->prepare_step();
    step_body(*model, *params, *opt);
  }
  synchronize(gpu);
  CudaGraph graph(gpu);
  graph.capture([&] { step_body(graph_model, graphed, graph_opt); });
  for (int i = 0; i < 3; ++i) {
    cast_opt.prepare_step();
    step_body(cast_model, cast, cast_opt);
    eager_opt.prepare_step();
    step_body(eager_model, eager, eager_opt);
    graph_opt.prepare_step();
    graph.replay();
  }
  synchronize(gpu);
  const std::vector<double> reference = cast.flat_params().to_doubles();
  CHECK(eager.flat_params().to_doubles() == reference);
  CHECK(graphed.flat_params().to_doubles() == reference);
  CHECK(eager.bf16_mirror_is_current());
  CHECK(graphed.bf16_mirror_is_current());
}

namespace {
// Three copies of the tiny bf16 model (naive attention) on the GPU, starting from the same weights, each with
// its flat parameters and AdamW: one for the plain step, two (eager and graph-captured) updated in backward;
// and one batch of tokens.
struct UpdateInBackwardRig {
  UpdateInBackwardRig(DType grad_dtype, bool bf16_mirror, bool in_matmul)
      : plain_model(config()),
        fused_model(config()),
        graph_model(config()),
        plain(plain_model, gpu, 9),
        fused(fused_model, gpu, 9),
        graphed(graph_model, gpu, 9),
        plain_opt({prepared(plain, grad_dtype, bf16_mirror)}),
        fused_opt({prepared(fused, grad_dtype, bf16_mirror)}),
        graph_opt({prepared(graphed, grad_dtype, bf16_mirror)}),
        fused_update(fused, fused_opt, in_matmul, kGroup),
        graph_update(graphed, graph_opt, in_matmul, kGroup) {
    if (bf16_mirror) {
      plain_opt.write_bf16_mirror(&plain);
      fused_opt.write_bf16_mirror(&fused);
      graph_opt.write_bf16_mirror(&graphed);
    }
    std::vector<int32_t> ids(2 * 32), targets(2 * 32);
    CounterRng rng{6, 0};
    for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(200));
    for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(200));
    x = Tensor::from_ints(ids, {2, 32}, gpu);
    y = Tensor::from_ints(targets, {2, 32}, gpu);
  }
  static nn::ModelConfig config() { return tiny_bf16_config(nn::AttentionKind::naive); }
  // Weights per gemm_adamw launch: fewer than the tiny model's 15 linear weights, so that launches happen
  // during backward as well as at finish().
  static constexpr size_t kGroup = 4;
  // The flat parameters, their gradient buffer and mirror set up before the optimizer sees them.
  static Tensor prepared(nn::FlatParameters& f, DType grad_dtype, bool bf16_mirror) {
    f.set_grad_dtype(grad_dtype);
    if (bf16_mirror) f.enable_bf16_mirror();
    return f.flat_params();
  }

  const Device gpu = Device::cuda(0);
  nn::TransformerLM plain_model, fused_model, graph_model;
  nn::FlatParameters plain, fused, graphed;
  optim::AdamW plain_opt, fused_opt, graph_opt;
  optim::UpdateInBackward fused_update, graph_update;
  Tensor x, y;
};
}  // namespace

TEST_CASE("AdamW fused into backward on CUDA (side stream; eager and graph-captured) equals the plain step") {
  // Naive attention: no atomics anywhere, so runs must agree bit for bit. f32 and bf16 gradient buffers.
  for (const DType grad_dtype : {DType::f32, DType::bf16}) {
    const std::string dtype_text = dtype_name(grad_dtype);
    CAPTURE(dtype_text);
    UpdateInBackwardRig rig(grad_dtype, false, false);
    auto& [gpu, plain_model, fused_model, graph_model, plain, fused, graphed, plain_opt, fused_opt, graph_opt,
           fused_update, graph_update, x, y] = rig;
    auto plain_step = [&] {
      plain_opt.prepare_step();
      plain_model.loss(x, y).backward();
      plain_opt.apply();
      plain.zero_grad();
    };
    auto fused_body = [&](nn::TransformerLM& model, optim::UpdateInBackward& update) {
      update.begin();
      model.loss(x, y).backward();
      update.finish();
    };
    // Step 1 eagerly everywhere (warm-up: cuBLASLt plans, allocator cache), then the graph is captured once
    // (capturing runs nothing) and replayed for steps 2..4.
    plain_step();
    fused_opt.prepare_step();
    fused_body(fused_model, fused_update);
    graph_opt.prepare_step();
    fused_body(graph_model, graph_update);
    synchronize(gpu);
    CudaGraph graph(gpu);
    graph.capture([&] { fused_body(graph_model, graph_update); });
    for (int step = 2; step <= 4; ++step) {
      plain_step();
      fused_opt.prepare_step();
      fused_body(fused_model, fused_update);
      graph_opt.prepare_step();
      graph.replay();
    }
    synchronize(gpu);
    CHECK(fused.flat_params().to_floats() == plain.flat_params().to_floats());
    CHECK(graphed.flat_params().to_floats() == plain.flat_params().to_floats());
    CHECK(fused_update.updated_in_backward() > 0);
    const std::vector<float> g = fused.flat_grads().to_floats();
    CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
  }
}

namespace {
// Whether the GPU is a Hopper, where the weight-gradient matmul with AdamW in its epilogue runs.
bool hopper_gpu() {
#ifdef TT_WITH_CUDA
  return cuda::current_device_major() == 9;
#else
  return false;
#endif
}
}  // namespace

TEST_CASE("AdamW inside the weight-gradient matmul (Hopper kernel) equals its CPU twin") {
  if (!hopper_gpu()) {
    MESSAGE("skipped: the kernel is for Hopper GPUs");
    return;
  }
  // Three weights of one flat buffer, updated by one launch: one off every tile boundary (128 x 128 tiles),
  // one exact, and one with more tiles than an H100 has SMs (blocks that take several tiles, stage loads
  // running ahead into the next tile and the next weight). Gaps between the weights, and token counts off the
  // 64-token stage and with many stages.
  struct Weight {
    int64_t out, in, begin;
  };
  const int64_t gap = 12;
  std::vector<Weight> weights;
  int64_t n = gap;
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{200, 136}, {256, 384}, {2056, 1280}}) {
    weights.push_back({out, in, n});
    n += out * in + gap;
  }
  for (const int64_t tokens : {int64_t{77}, int64_t{1024}}) {
    for (const DType grad_dtype : {DType::f32, DType::bf16}) {
      const std::string dtype_text = dtype_name(grad_dtype);
      CAPTURE(tokens);
      CAPTURE(dtype_text);
      Tensor cpu_p = randn({n}, 40), gpu_p = cpu_p.to(Device::cuda(0));
      cpu_p.set_requires_grad(true);
      gpu_p.set_requires_grad(true);
      cpu_p.set_grad(Tensor::zeros({n}, grad_dtype, Device::cpu()));
      gpu_p.set_grad(Tensor::zeros({n}, grad_dtype, Device::cuda(0)));
      optim::AdamW cpu_opt({cpu_p}), gpu_opt({gpu_p});
      // Moments from earlier steps (the second one non-negative), step 5: every term of the update matters.
      cpu_opt.exp_avg()[0] = randn({n}, 41, 0.1);
      cpu_opt.exp_avg_sq()[0] = ops::mul(randn({n}, 42, 0.1), randn({n}, 42, 0.1));
      gpu_opt.exp_avg()[0] = cpu_opt.exp_avg()[0].to(Device::cuda(0));
      gpu_opt.exp_avg_sq()[0] = cpu_opt.exp_avg_sq()[0].to(Device::cuda(0));
      for (optim::AdamW* o : {&cpu_opt, &gpu_opt}) {
        o->set_step_count(4);
        o->prepare_step();
      }
      std::vector<optim::AdamW::FactoredGradient> on_cpu, on_gpu;
      uint32_t seed = 43;
      for (const Weight& w : weights) {
        // The second weight's dy is some columns of a wider matrix (rows 16 elements longer, starting 8 in),
        // as a fused q|k|v product hands each projection its gradient.
        const bool strided = w.begin == weights[1].begin;
        const Tensor wide = ops::cast(randn({tokens, w.out + (strided ? 16 : 0)}, seed++), DType::bf16);
        const Tensor dy = strided ? wide.narrow_view(1, 8, w.out) : wide,
                     x = ops::cast(randn({tokens, w.in}, seed++), DType::bf16);
        on_cpu.push_back({w.begin, dy, x});
        const Tensor dy_gpu =
            strided ? wide.to(Device::cuda(0)).narrow_view(1, 8, w.out) : dy.to(Device::cuda(0));
        on_gpu.push_back({w.begin, dy_gpu, x.to(Device::cuda(0))});
        CHECK(gpu_opt.takes_factored_gradient(0, on_gpu.back()));
      }
      cpu_opt.apply_factored_gradients(0, on_cpu);
      gpu_opt.apply_factored_gradients(0, on_gpu);
      synchronize(Device::cuda(0));
      // The products differ in summation order only; a bf16 gradient may then round to the neighbouring
      // value, which moves the first moment by at most 0.1 * 2^-8 of it. Compared weight by weight.
      const double tolerance = grad_dtype == DType::f32 ? 1e-5 : 2e-4;
      const std::vector<double> gpu_values[3] = {gpu_p.to_doubles(), gpu_opt.exp_avg()[0].to_doubles(),
                                                 gpu_opt.exp_avg_sq()[0].to_doubles()};
      const std::vector<double> cpu_values[3] = {cpu_p.to_doubles(), cpu_opt.exp_avg()[0].to_doubles(),
                                                 cpu_opt.exp_avg_sq()[0].to_doubles()};
      for (const Weight& w : weights) {
        CAPTURE(w.out);
        CAPTURE(w.in);
        for (int k = 0; k < 3; ++k) {
          CAPTURE(k);
          const auto range = [&](const std::vector<double>& v) {
            return std::vector<double>(v.begin() + w.begin, v.begin() + w.begin + w.out * w.in);
          };
          CHECK(relative_error(range(gpu_values[k]), range(cpu_values[k])) < tolerance);
        }
      }
      // Elements between and around the weights are untouched, and the gradient buffer is neither read nor
      // written.
      const std::vector<float> before = randn({n}, 40).to_floats(), after = gpu_p.to_floats();
      int64_t at = 0;
      for (const Weight& w : weights) {
        for (int64_t i = at; i < w.begin; ++i) CHECK(after[i] == before[i]);
        at = w.begin + w.out * w.in;
      }
      for (int64_t i = at; i < n; ++i) CHECK(after[i] == before[i]);
      const std::vector<double> g = gpu_p.grad().to_doubles();
      CHECK(std::all_of(g.begin(), g.end(), [](double v) { return v == 0.0; }));
    }
  }
}

TEST_CASE(
    "AdamW inside the weight-gradient matmul, in a model on CUDA (eager and graph-captured), trains like "
    "the plain step") {
  const bool hopper = hopper_gpu();
  for (const DType grad_dtype : {DType::f32, DType::bf16}) {
    const std::string dtype_text = dtype_name(grad_dtype);
    CAPTURE(dtype_text);
    UpdateInBackwardRig rig(grad_dtype, true, true);
    auto& [gpu, plain_model, fused_model, graph_model, plain, fused, graphed, plain_opt, fused_opt, graph_opt,
           fused_update, graph_update, x, y] = rig;
    // Each model's steps one after another: a gradient's zero mark lasts until the next backward pass of any
    // model ends, and the update inside the matmul is taken only for a .grad known to hold zeros.
    std::vector<double> plain_losses;
    for (int step = 1; step <= 6; ++step) {
      plain_opt.prepare_step();
      const Tensor loss = plain_model.loss(x, y);
      loss.backward();
      plain_opt.apply();
      plain.zero_grad();
      plain_losses.push_back(loss.item());
    }
    std::vector<double> fused_losses;
    auto fused_body = [&](nn::TransformerLM& model, optim::UpdateInBackward& update, bool record) {
      update.begin();
      const Tensor loss = model.loss(x, y);
      loss.backward();
      update.finish();
      if (record) fused_losses.push_back(loss.item());
    };
    for (int step = 1; step <= 6; ++step) {
      fused_opt.prepare_step();
      fused_body(fused_model, fused_update, true);
    }
    // q, k, v, o, w1, w2, w3 of both layers on Hopper, in four launches (three groups of
    // UpdateInBackwardRig::kGroup during backward, then the rest at finish()). The output projection takes
    // its gradient from the fused classifier + loss, through the side-stream path.
    CHECK(fused_update.updated_in_matmul() == (hopper ? 2 * 7 : 0));
    graph_opt.prepare_step();
    fused_body(graph_model, graph_update, false);
    synchronize(gpu);
    CudaGraph graph(gpu);
    graph.capture([&] { fused_body(graph_model, graph_update, false); });
    CHECK(graph_update.updated_in_matmul() == (hopper ? 2 * 7 : 0));
    for (int step = 2; step <= 6; ++step) {
      graph_opt.prepare_step();
      graph.replay();
    }
    synchronize(gpu);
    // Another kernel sums the weight gradients in another order: close, not identical.
    const double tolerance = 2e-3;
    CHECK(relative_error(fused.flat_params().to_doubles(), plain.flat_params().to_doubles()) < tolerance);
    CHECK(relative_error(graphed.flat_params().to_doubles(), fused.flat_params().to_doubles()) < tolerance);
    CHECK(relative_error(fused_losses, plain_losses) < 1e-3);
    CHECK(fused.bf16_mirror_is_current());
    CHECK(graphed.bf16_mirror_is_current());
    const std::vector<float> g = fused.flat_grads().to_floats();
    CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE(
    "bf16 gradients on CUDA: the f32 gradients rounded (within bf16 rounding), written by the matmuls") {
  const nn::ModelConfig config = tiny_bf16_config(nn::AttentionKind::naive);
  const Device gpu = Device::cuda(0);
  nn::TransformerLM wide_model(config), narrow_model(config);
  nn::FlatParameters wide(wide_model, gpu, 4), narrow(narrow_model, gpu, 4);
  narrow.set_grad_dtype(DType::bf16);
  std::vector<int32_t> ids(2 * 32), targets(2 * 32);
  CounterRng rng{12, 0};
  for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(200));
  for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(200));
  const Tensor x = Tensor::from_ints(ids, {2, 32}, gpu), y = Tensor::from_ints(targets, {2, 32}, gpu);
  wide_model.loss(x, y).backward();
  // Poisoned but marked zero after the pass above: every element must be overwritten.
  narrow.flat_grads().copy_(
      ops::cast(Tensor::full(narrow.flat_grads().shape(), NAN, DType::f32, gpu), DType::bf16));
  for (const nn::NamedParameter& p : narrow.parameters()) mark_grad_zeroed(*p.tensor);
  narrow_model.loss(x, y).backward();
  const std::vector<float> w = wide.flat_grads().to_floats(), n = narrow.flat_grads().to_floats();
  REQUIRE(w.size() == n.size());
  size_t beyond = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    // The GEMM's own rounding of its f32 accumulator may differ from rounding cuBLASLt's f32 result by the
    // order of the sums: one bf16 step (2^-8 relative) at most.
    if (!(std::fabs(n[i] - w[i]) <= std::fabs(w[i]) * (1.0f / 128) + 1e-30f)) ++beyond;
  }
  CHECK(beyond == 0);
}

TEST_CASE(
    "a bf16 weight .grad on CUDA marked zero is written by the GEMM (no f32 temporary); unmarked, added") {
  // Few rows and a wide weight: the f32 temporary of the accumulator's path (4 MiB) is far larger than
  // anything else the linear's backward allocates.
  const Device gpu = Device::cuda(0);
  const int64_t rows = 4, in = 1024, out = 1024;
  // A second, frozen layer v makes the gradient reaching w's output differ from column to column.
  const Tensor x = randn({rows, in}, 120).to(gpu), v = randn({8, out}, 121).to(gpu);
  Tensor w = randn({out, in}, 122, 0.05).to(gpu);
  w.set_requires_grad(true);
  auto backward = [&] { ops::sum(ops::linear(ops::linear(x, w, DType::bf16, DType::f32), v)).backward(); };
  w.set_grad(Tensor::zeros({out, in}, DType::f32, gpu));
  backward();
  const std::vector<float> g = w.grad().to_floats();
  int64_t largest = 0;  // the largest allocation of the linear's backward node
  set_memory_recorder([&](const MemoryEvent& e) {
    if (e.is_alloc && e.tag == "Linear") largest = std::max(largest, e.bytes);
  });
  w.set_grad(ops::cast(Tensor::full({out, in}, NAN, DType::f32, gpu), DType::bf16));
  mark_grad_zeroed(w);
  backward();
  const int64_t direct_largest = largest;
  const std::vector<float> first = w.grad().to_floats();
  largest = 0;
  backward();  // the mark has lapsed: the product is made in f32 and the accumulator adds it
  const int64_t added_largest = largest;
  set_memory_recorder(nullptr);
  const int64_t weight_f32_bytes = out * in * 4;
  CHECK(direct_largest < weight_f32_bytes);
  CHECK(added_largest >= weight_f32_bytes);
  size_t beyond = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    // cuBLASLt's bf16 epilogue rounds its own f32 sum, whose order may differ from the f32 run's.
    if (!(std::fabs(first[i] - g[i]) <= std::fabs(g[i]) * (1.0f / 128) + 1e-30f)) ++beyond;
  }
  CHECK(beyond == 0);
}

TEST_CASE("CUDA rope_at equals CUDA rope at those positions of the whole sequence, and the CPU's rope_at") {
  NoGradGuard no_grad;
  const Device gpu = Device::cuda(0);
  const int64_t len = 300, heads = 12, d_head = 64, dim = heads * d_head;
  const std::vector<int32_t> starts = {0, 297, 17, 150};
  const auto n = static_cast<int64_t>(starts.size());
  for (int64_t count : {1, 3}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::string dtype_text = dtype_name(dtype);
      CAPTURE(dtype_text);
      CAPTURE(count);
      const Tensor whole = ops::cast(randn({1, len, dim}, 811), dtype);
      const std::vector<double> whole_values = whole.to_doubles();
      const std::vector<double> rotated = ops::rope(whole.to(gpu), d_head, 10000.0).to_doubles();
      // Row b: the whole sequence's tokens starts[b] .. starts[b] + count - 1.
      const std::vector<double> part = testing::rows_from(whole_values, starts, count, dim);
      const std::vector<double> expected = testing::rows_from(rotated, starts, count, dim);
      const Tensor x = ops::cast(Tensor::from_doubles(part, {n, count, dim}), dtype);
      const Tensor on_gpu = ops::rope_at(x.to(gpu), Tensor::from_ints(starts, {n}, gpu), d_head, 10000.0);
      CHECK(on_gpu.to_doubles() == expected);  // the same kernel at the same positions
      const Tensor on_cpu = ops::rope_at(x, Tensor::from_ints(starts, {n}), d_head, 10000.0);
      CHECK(relative_error(on_gpu.to_doubles(), on_cpu.to_doubles()) < (dtype == DType::f32 ? kF32 : 1e-2));
    }
  }
}

TEST_CASE("CUDA rope_into_cache equals rope_at and cache_append, bit for bit, and the CPU's") {
  NoGradGuard no_grad;
  const Device gpu = Device::cuda(0);
  const int64_t cache_rows = 5, capacity = 40, heads = 4, d_head = 64, dim = heads * d_head;
  const std::vector<int64_t> rows = {3, 0, 4}, starts = {0, 37, 12};
  const auto n = static_cast<int64_t>(rows.size());
  for (int64_t count : {1, 3}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::string dtype_text = dtype_name(dtype);
      CAPTURE(dtype_text);
      CAPTURE(count);
      const auto seed = static_cast<uint32_t>(900 + count);
      const Tensor q = ops::cast(randn({n, count, dim}, seed, 2.0), dtype).to(gpu);
      const Tensor k = ops::cast(randn({n, count, dim}, seed + 1, 2.0), dtype).to(gpu);
      const Tensor v = ops::cast(randn({n, count, dim}, seed + 2), dtype).to(gpu);
      // Every position holds values first: a write to a wrong position would show.
      const Tensor keys0 = ops::cast(randn({cache_rows, capacity, dim}, seed + 3), dtype);
      const Tensor values0 = ops::cast(randn({cache_rows, capacity, dim}, seed + 4), dtype);
      const ops::CacheEntries on_gpu = ops::cache_entries(rows, starts, gpu);
      Tensor keys = keys0.to(gpu), values = values0.to(gpu);
      const Tensor q_fused = ops::rope_into_cache(q, k, v, keys, values, on_gpu, d_head, 10000.0);
      const Tensor gpu_starts = ops::reshape(on_gpu.table.narrow_view(0, 1, 1), {n});
      Tensor keys_ref = keys0.to(gpu), values_ref = values0.to(gpu);
      const Tensor q_ref = ops::rope_at(q, gpu_starts, d_head, 10000.0);
      ops::cache_append(keys_ref, on_gpu, ops::rope_at(k, gpu_starts, d_head, 10000.0));
      ops::cache_append(values_ref, on_gpu, v);
      CHECK(q_fused.to_doubles() == q_ref.to_doubles());
      CHECK(keys.to_doubles() == keys_ref.to_doubles());
      CHECK(values.to_doubles() == values_ref.to_doubles());
      // The CPU's op (rope_at and cache_append themselves) within rounding of cosf/sinf.
      Tensor cpu_keys = keys0.clone(), cpu_values = values0.clone();
      const Tensor q_cpu =
          ops::rope_into_cache(q.to(Device::cpu()), k.to(Device::cpu()), v.to(Device::cpu()), cpu_keys,
                               cpu_values, ops::cache_entries(rows, starts, Device::cpu()), d_head, 10000.0);
      const double limit = dtype == DType::f32 ? kF32 : 1e-2;
      CHECK(relative_error(q_fused.to_doubles(), q_cpu.to_doubles()) < limit);
      CHECK(relative_error(keys.to_doubles(), cpu_keys.to_doubles()) < limit);
      CHECK(values.to_doubles() == cpu_values.to_doubles());
    }
  }
}

TEST_CASE("CUDA cached_attention equals its CPU twin: f32 and bf16, d_head 16 to 256, ragged rows") {
  // Each case: heads, d_head, capacity, new tokens per entry, the entries' rows and starts. Rows out of order
  // and a subset; lengths from 1 position to the full capacity; 40 is no vectorised size (the generic
  // kernel); 70 entries, and 70000 (two launches).
  struct Case {
    int64_t heads, d_head, capacity, count;
    std::vector<int64_t> rows, starts;
  };
  std::vector<Case> cases = {
      {4, 16, 40, 1, {2, 0, 3}, {39, 0, 17}},
      {12, 64, 300, 1, {5, 1, 0, 7}, {299, 0, 150, 33}},
      {12, 64, 300, 4, {6, 2}, {296, 1}},
      {8, 128, 200, 1, {1, 3, 0}, {199, 64, 5}},
      {8, 128, 200, 5, {1, 3}, {195, 60}},
      {3, 40, 50, 2, {4, 0}, {48, 9}},
      {2, 256, 70, 1, {0, 1}, {69, 13}},
      {2, 16, 20, 1, {}, {}},
      {1, 16, 3, 1, {}, {}},
  };
  for (int64_t i = 0; i < 70; ++i) {
    cases[cases.size() - 2].rows.push_back(69 - i);
    cases[cases.size() - 2].starts.push_back(i % 20);
  }
  // More entries than one launch's grid takes (65535).
  for (int64_t i = 0; i < 70000; ++i) {
    cases.back().rows.push_back((i * 7919) % 70000);
    cases.back().starts.push_back(i % 3);
  }
  const Device gpu = Device::cuda(0);
  uint32_t seed = 500;
  for (const Case& c : cases) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::string dtype_text = dtype_name(dtype);
      CAPTURE(dtype_text);
      CAPTURE(c.d_head);
      CAPTURE(c.count);
      CAPTURE(c.capacity);
      const auto n = static_cast<int64_t>(c.rows.size());
      const int64_t cache_rows = *std::max_element(c.rows.begin(), c.rows.end()) + 1,
                    dim = c.heads * c.d_head;
      const Tensor keys = ops::cast(randn({cache_rows, c.capacity, dim}, seed++), dtype);
      const Tensor values = ops::cast(randn({cache_rows, c.capacity, dim}, seed++), dtype);
      // One element more than q needs: q at offset 0 (aligned) and at offset 1 (the generic kernel's
      // element-wise loads).
      const Tensor q_buffer = ops::cast(randn({n * c.count * dim + 1}, seed++, 2.0), dtype);
      for (int64_t offset : {0, 1}) {
        CAPTURE(offset);
        auto run = [&](const Tensor& buffer, const Tensor& k, const Tensor& v) {
          const Tensor q =
              ops::reshape(buffer.narrow_view(0, offset, n * c.count * dim), {n, c.count, c.heads, c.d_head});
          return ops::cached_attention(q, k, v, ops::cache_entries(c.rows, c.starts, k.device()));
        };
        const Tensor cpu_out = run(q_buffer, keys, values);
        const Tensor gpu_out = run(q_buffer.to(gpu), keys.to(gpu), values.to(gpu));
        CHECK(gpu_out.shape() == cpu_out.shape());
        CHECK(gpu_out.dtype() == dtype);
        // bf16: the kernel leaves the probabilities in f32 where the CPU rounds them to bf16
        // (ops::naive_attention's cast), and both round the output once.
        CHECK(relative_error(gpu_out.to_doubles(), cpu_out.to_doubles()) <
              (dtype == DType::f32 ? kF32 : 1e-2));
      }
    }
  }
}

TEST_CASE("CUDA cache_append and cached_attention over decode steps equal the CPU") {
  // A prompt of 4 tokens, then one token per step for every entry, queued without waiting.
  const Device gpu = Device::cuda(0);
  const int64_t cache_rows = 3, capacity = 32, heads = 4, d_head = 64, dim = heads * d_head;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string dtype_text = dtype_name(dtype);
    CAPTURE(dtype_text);
    Tensor cpu_keys = Tensor::zeros({cache_rows, capacity, dim}, dtype);
    Tensor cpu_values = Tensor::zeros({cache_rows, capacity, dim}, dtype);
    Tensor gpu_keys = cpu_keys.to(gpu), gpu_values = cpu_values.to(gpu);
    const std::vector<int64_t> rows = {2, 0};
    std::vector<int64_t> starts = {0, 0};
    std::vector<Tensor> cpu_outs, gpu_outs;
    for (int step = 0; step < 8; ++step) {
      const int64_t count = step == 0 ? 4 : 1;
      const auto seed = static_cast<uint32_t>(600 + 3 * step);
      const Tensor q = ops::cast(randn({2, count, heads, d_head}, seed, 2.0), dtype);
      const Tensor k = ops::cast(randn({2, count, dim}, seed + 1), dtype);
      const Tensor v = ops::cast(randn({2, count, dim}, seed + 2), dtype);
      const ops::CacheEntries on_cpu = ops::cache_entries(rows, starts, Device::cpu());
      const ops::CacheEntries on_gpu = ops::cache_entries(rows, starts, gpu);
      ops::cache_append(cpu_keys, on_cpu, k);
      ops::cache_append(cpu_values, on_cpu, v);
      ops::cache_append(gpu_keys, on_gpu, k.to(gpu));
      ops::cache_append(gpu_values, on_gpu, v.to(gpu));
      cpu_outs.push_back(ops::cached_attention(q, cpu_keys, cpu_values, on_cpu));
      gpu_outs.push_back(ops::cached_attention(q.to(gpu), gpu_keys, gpu_values, on_gpu));
      for (int64_t& s : starts) s += count;
    }
    CHECK(gpu_keys.to_floats() == cpu_keys.to_floats());
    CHECK(gpu_values.to_floats() == cpu_values.to_floats());
    for (size_t step = 0; step < cpu_outs.size(); ++step) {
      CAPTURE(step);
      CHECK(relative_error(gpu_outs[step].to_doubles(), cpu_outs[step].to_doubles()) <
            (dtype == DType::f32 ? kF32 : 1e-2));
    }
  }
  // Element-wise copies (rows of 6 bf16 values are not whole 16-byte units), for more entries than one
  // launch's grid takes (65535).
  const int64_t many = 70000, narrow_dim = 6;
  Tensor cpu_store = ops::cast(randn({many, 5, narrow_dim}, 700), DType::bf16);
  Tensor gpu_store = cpu_store.to(gpu);
  std::vector<int64_t> many_rows, many_starts;
  for (int64_t i = 0; i < many; ++i) {
    many_rows.push_back((i * 37) % many);
    many_starts.push_back(i % 4);
  }
  const Tensor fresh = ops::cast(randn({many, 1, narrow_dim}, 701), DType::bf16);
  ops::cache_append(cpu_store, ops::cache_entries(many_rows, many_starts, Device::cpu()), fresh);
  ops::cache_append(gpu_store, ops::cache_entries(many_rows, many_starts, gpu), fresh.to(gpu));
  CHECK(gpu_store.to_floats() == cpu_store.to_floats());
}
