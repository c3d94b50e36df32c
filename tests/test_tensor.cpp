// Tensor views and copies, the autograd engine's contracts, the allocator's accounting and the RNG.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/rng.h"
#include "gradcheck.h"

using namespace tt;

TEST_CASE("views share storage; strides and contiguity") {
  Tensor t = Tensor::from_floats({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(t.is_contiguous());
  CHECK(t.strides() == Shape{3, 1});
  const Tensor tr = t.transpose_view(0, 1);
  CHECK(tr.shape() == Shape{3, 2});
  CHECK(!tr.is_contiguous());
  CHECK(tr.to_floats() == std::vector<float>{0, 3, 1, 4, 2, 5});
  const Tensor row = t.narrow_view(0, 1, 1);
  CHECK(row.to_floats() == std::vector<float>{3, 4, 5});
  const Tensor col = t.narrow_view(1, 2, 1);
  CHECK(col.to_floats() == std::vector<float>{2, 5});
  t.data<float>()[4] = 40;  // visible through every view
  CHECK(tr.to_floats()[3] == 40);
  CHECK(t.view({3, -1}).shape() == Shape{3, 2});
  CHECK_THROWS_WITH_AS(t.view({4, 2}), doctest::Contains("cannot view"), Error);
  CHECK_THROWS_WITH_AS(tr.view({6}), doctest::Contains("contiguous"), Error);
  CHECK_THROWS_AS(t.data<double>(), Error);
}

TEST_CASE("TT_CHECK reports the user's mistake; TT_ASSERT reports a bug in tinytrain, with its place") {
  const auto user = [] { TT_CHECK(false, "--batch must be positive"); };
  const auto bug = [] { TT_ASSERT(1 + 1 == 3, "Widget::finish without begin"); };
  try {
    user();
    FAIL("no exception");
  } catch (const InternalError&) {
    FAIL("a user's mistake is not an internal error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "--batch must be positive");
    CHECK(error_line(e) == "error: --batch must be positive");
  }
  try {
    bug();
    FAIL("no exception");
  } catch (const InternalError& e) {
    const std::string what = e.what();
    CHECK(what.rfind("internal error: Widget::finish without begin (tests/test_tensor.cpp:", 0) == 0);
    CHECK(what.find("please report") != std::string::npos);
    CHECK(error_line(e) == what);
  }
}

TEST_CASE("dtype conversions and copies") {
  const Tensor i = Tensor::from_ints({1, -2, 3}, {3});
  CHECK(i.to_floats() == std::vector<float>{1, -2, 3});
  const Tensor d = Tensor::from_doubles({0.5, 1.25}, {2});
  CHECK(ops::cast(d, DType::f32).to_floats() == std::vector<float>{0.5f, 1.25f});
  Tensor dst = Tensor::zeros({2, 3}, DType::f32);
  dst.copy_(Tensor::from_floats({0, 1, 2, 3, 4, 5}, {3, 2}).transpose_view(0, 1));
  CHECK(dst.to_floats() == std::vector<float>{0, 2, 4, 1, 3, 5});
  CHECK(Tensor::full({2}, 2.5, DType::f32).to_floats() == std::vector<float>{2.5f, 2.5f});
  CHECK_THROWS_AS(Device::parse("tpu"), Error);
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
}

TEST_CASE("gradients accumulate across backward calls until cleared") {
  Tensor x = testing::leaf({3}, 1);
  ops::sum(ops::scale(x, 2.0)).backward();
  ops::sum(ops::scale(x, 2.0)).backward();
  for (double g : x.grad().to_doubles()) CHECK(g == 4.0);
  x.grad().zero_();
  ops::sum(ops::scale(x, 3.0)).backward();
  for (double g : x.grad().to_doubles()) CHECK(g == 3.0);
}

TEST_CASE("grad-ready hooks fire once per pass with the complete gradient, in reverse order of use") {
  Tensor w1 = testing::leaf({4}, 2), w2 = testing::leaf({4}, 3);
  std::vector<std::string> order;
  std::vector<double> w1_grad_at_hook;
  w1.set_name("w1").register_grad_ready_hook([&](Tensor& t) {
    order.push_back(t.name());
    w1_grad_at_hook = t.grad().to_doubles();
  });
  w2.set_name("w2").register_grad_ready_hook([&](Tensor& t) { order.push_back(t.name()); });
  // w1 is used twice (early and late); its gradient is complete only after both uses are processed.
  const Tensor h = ops::add(ops::scale(w1, 2.0), w2);
  const Tensor loss = ops::sum(ops::add(ops::scale(h, 1.0), ops::scale(w1, 3.0)));
  loss.backward();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == "w2");
  CHECK(order[1] == "w1");
  for (double g : w1_grad_at_hook) CHECK(g == 5.0);
}

TEST_CASE("NoGradGuard stops recording") {
  Tensor x = testing::leaf({2}, 4);
  {
    NoGradGuard guard;
    const Tensor y = ops::scale(x, 2.0);
    CHECK(!y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(ops::scale(x, 2.0).requires_grad());
}

TEST_CASE("saved tensors are freed during backward") {
  Tensor x = testing::leaf({1 << 16}, 5);
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  Tensor loss;
  {
    const Tensor a = ops::scale(x, 2.0), b = ops::scale(x, 3.0);
    loss = ops::sum(ops::mul(a, b));  // Mul saves a and b (2 x 512 KiB)
  }
  const int64_t after_forward = memory_stats(Device::cpu()).current_bytes;
  CHECK(after_forward - before >= 2 * (1 << 16) * 8);
  loss.backward();
  const int64_t after_backward = memory_stats(Device::cpu()).current_bytes;
  // Only x.grad (512 KiB) and the scalar loss remain.
  CHECK(after_backward - before <= (1 << 16) * 8 + 1024);
}

TEST_CASE("allocator reports current and peak bytes") {
  const Device cpu = Device::cpu();
  reset_peak_memory(cpu);
  const int64_t base = memory_stats(cpu).current_bytes;
  {
    const Tensor big = Tensor::empty({1 << 20}, DType::f32);
    CHECK(memory_stats(cpu).current_bytes - base == (1 << 22));
  }
  CHECK(memory_stats(cpu).current_bytes == base);
  CHECK(memory_stats(cpu).peak_bytes - base >= (1 << 22));
}

// Linux grants more than it can back (overcommit), and writing the tensor then gets the process killed with
// no message: a request above what the host has free is refused as OutOfMemory instead, before it is granted.
TEST_CASE("a host tensor larger than the free memory is refused, not granted") {
  std::FILE* meminfo = std::fopen("/proc/meminfo", "r");
  if (!meminfo) return;  // not Linux: nothing to compare with
  long long available_kib = -1, swap_kib = -1, kib = 0;
  char line[256];
  while (std::fgets(line, sizeof(line), meminfo)) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) available_kib = kib;
    if (std::sscanf(line, "SwapFree: %lld kB", &kib) == 1) swap_kib = kib;
  }
  std::fclose(meminfo);
  if (available_kib <= 0 || swap_kib < 0) return;  // no MemAvailable (old kernels): the check is off too
  const size_t request = static_cast<size_t>(available_kib + swap_kib) * 1024 + (size_t{512} << 20);
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  void* granted = nullptr;
  CHECK_THROWS_WITH_AS(granted = allocate_bytes(Device::cpu(), request),
                       doctest::Contains("out of host memory allocating"), OutOfMemory);
  if (granted) free_bytes(Device::cpu(), granted, request);  // never written: costs nothing
  CHECK(memory_stats(Device::cpu()).current_bytes == before);
}

TEST_CASE("Philox-4x32-10 known answer and counter independence") {
  // Known-answer vector of the Philox paper's reference implementation (counter 0, key 0).
  const Philox4 r = philox4x32(0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  CounterRng a{9, 0}, b{9, 5};
  for (int i = 0; i < 5; ++i) a.next_u32();
  CHECK(a.next_u32() == b.next_u32());
  CHECK(truncated_normal(1, 10, 3.0) == truncated_normal(1, 10, 3.0));
  CHECK(uniform_from_bits(0xffffffffu) < 1.0f);
}

TEST_CASE("a graph cannot be run backward twice, and forward without backward frees everything") {
  Tensor x = testing::leaf({4, 3}, 6), w = testing::leaf({3, 2}, 7);
  const Tensor loss = ops::sum(ops::softmax(ops::reshape(ops::matmul(x, w), {2, 2, 2}), 1.0, false));
  loss.backward();
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("already used"), Error);
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  {
    const Tensor q = testing::leaf({1, 2, 5, 4}, 8), k = testing::leaf({1, 2, 5, 4}, 9);
    const Tensor v = testing::leaf({1, 2, 5, 4}, 10);
    const Tensor o = ops::flash_attention(q, k, v, true);
    const Tensor p = ops::softmax(testing::leaf({2, 3, 3}, 11), 1.0, true);
  }
  // Nodes that save their own output must not keep themselves alive.
  CHECK(memory_stats(Device::cpu()).current_bytes == before);
}

TEST_CASE("DeviceClock on the CPU measures host time between its points") {
  DeviceClock clock(Device::cpu());
  const size_t a = clock.mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const size_t b = clock.mark();
  const double ms = clock.ms_between(a, b);
  CHECK(ms >= 19.0);
  CHECK(ms < 5000.0);
  CHECK(clock.ms_between(b, a) == doctest::Approx(-ms));
  CHECK_THROWS_AS(clock.ms_between(a, b + 1), Error);
  clock.clear();
  CHECK_THROWS_AS(clock.ms_between(a, b), Error);
}
