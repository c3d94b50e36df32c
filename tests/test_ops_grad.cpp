// Finite-difference gradient checks (double precision, CPU) for every differentiable op.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/allocator.h"
#include "gradcheck.h"

using namespace tt;
using tt::testing::gradient_error;
using tt::testing::leaf;

namespace {
constexpr double kTol = 1e-6;
using Inputs = std::vector<Tensor>;
}  // namespace

TEST_CASE("gradient checker detects a broken backward") {
  // y = x^2 with a backward that returns 2.1x instead of 2x must be reported.
  struct BrokenSquare : Node {
    Tensor x;
    const char* name() const override { return "BrokenSquare"; }
    std::vector<Tensor> apply(const Tensor& g) override { return {ops::mul(g, ops::scale(x, 2.1))}; }
  };
  auto f = [](const Inputs& in) {
    Tensor out;
    {
      NoGradGuard guard;
      out = ops::mul(in[0], in[0]);
    }
    if (in[0].requires_grad() && grad_mode_enabled()) {
      auto node = std::make_shared<BrokenSquare>();
      node->x = in[0];
      attach_node(out, node, {&in[0]});
    }
    return out;
  };
  CHECK(gradient_error(f, {leaf({3, 4}, 1)}) > 1e-2);
}

TEST_CASE("add, scale, mul, sum gradients") {
  CHECK(gradient_error([](const Inputs& in) { return ops::add_scaled(in[0], in[1], -0.7); },
                       {leaf({3, 5}, 1), leaf({3, 5}, 2)}) < kTol);
  CHECK(gradient_error([](const Inputs& in) { return ops::scale(in[0], 1.7); }, {leaf({7}, 3)}) < kTol);
  CHECK(gradient_error([](const Inputs& in) { return ops::mul(in[0], in[1]); },
                       {leaf({2, 3}, 4), leaf({2, 3}, 5)}) < kTol);
  CHECK(gradient_error([](const Inputs& in) { return ops::sum(in[0]); }, {leaf({4, 2}, 6)}) < kTol);
}

TEST_CASE("reshape, transpose, contiguous gradients") {
  auto f = [](const Inputs& in) {
    const Tensor t = ops::transpose(ops::reshape(in[0], {2, 3, 4}), 0, 2);  // (4, 3, 2) strided view
    return ops::mul(ops::contiguous(t),
                    ops::contiguous(ops::transpose(ops::reshape(in[1], {2, 3, 4}), 0, 2)));
  };
  CHECK(gradient_error(f, {leaf({6, 4}, 7), leaf({24}, 8)}) < kTol);
}

TEST_CASE("matmul gradients for every transpose combination, batched and not") {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t m = 3, n = 4, k = 5;
      const Shape a_shape = ta ? Shape{2, k, m} : Shape{2, m, k};
      const Shape b_shape = tb ? Shape{2, n, k} : Shape{2, k, n};
      CAPTURE(ta);
      CAPTURE(tb);
      auto f = [&](const Inputs& in) { return ops::matmul(in[0], in[1], ta, tb, 0.5); };
      CHECK(gradient_error(f, {leaf(a_shape, 10 + ta), leaf(b_shape, 20 + tb)}) < kTol);
    }
  }
  CHECK(gradient_error([](const Inputs& in) { return ops::linear(in[0], in[1]); },
                       {leaf({2, 3, 6}, 30), leaf({5, 6}, 31)}) < kTol);
}

TEST_CASE("matmul matches a hand-written product") {
  const Tensor a = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_doubles({7, 8, 9, 10, 11, 12}, {3, 2});
  const std::vector<double> c = ops::matmul(a, b).to_doubles();
  CHECK(c == std::vector<double>{58, 64, 139, 154});
  const std::vector<double> ct = ops::matmul(a, a, false, true).to_doubles();  // A A^T
  CHECK(ct == std::vector<double>{14, 32, 32, 77});
}

TEST_CASE("embedding gradient") {
  const Tensor ids = Tensor::from_ints({1, 3, 1, 0, 4, 3}, {2, 3});
  CHECK(gradient_error([&](const Inputs& in) { return ops::embedding(in[0], ids); }, {leaf({5, 4}, 40)}) <
        kTol);
}

TEST_CASE("rms_norm gradient and value") {
  CHECK(gradient_error([](const Inputs& in) { return ops::rms_norm(in[0], in[1], 1e-5); },
                       {leaf({3, 2, 8}, 50), leaf({8}, 51)}) < kTol);
  const Tensor x = Tensor::from_doubles({3, 4}, {1, 2});
  const Tensor w = Tensor::from_doubles({1, 2}, {2});
  const std::vector<double> y = ops::rms_norm(x, w, 0.0).to_doubles();
  // rms = sqrt((9 + 16) / 2)
  CHECK(y[0] == doctest::Approx(3 / std::sqrt(12.5)).epsilon(1e-12));
  CHECK(y[1] == doctest::Approx(8 / std::sqrt(12.5)).epsilon(1e-12));
}

TEST_CASE("rope gradient and a hand-computed rotation") {
  CHECK(gradient_error([](const Inputs& in) { return ops::rope(in[0], 4, 10000.0); }, {leaf({2, 5, 8}, 60)}) <
        kTol);
  // position 1, d_head 4: pair 0 rotates by 1 rad, pair 1 by 1/100 rad.
  const Tensor x = Tensor::from_doubles({1, 0, 1, 0, 1, 0, 1, 0}, {1, 2, 4});
  const std::vector<double> y = ops::rope(x, 4, 10000.0).to_doubles();
  CHECK(y[0] == doctest::Approx(1.0));  // position 0 is unrotated
  CHECK(y[4] == doctest::Approx(std::cos(1.0)).epsilon(1e-12));
  CHECK(y[5] == doctest::Approx(std::sin(1.0)).epsilon(1e-12));
  CHECK(y[6] == doctest::Approx(std::cos(0.01)).epsilon(1e-12));
  CHECK(y[7] == doctest::Approx(std::sin(0.01)).epsilon(1e-12));
}

TEST_CASE("swiglu gradient") {
  CHECK(gradient_error([](const Inputs& in) { return ops::swiglu(in[0], in[1]); },
                       {leaf({3, 7}, 70), leaf({3, 7}, 71)}) < kTol);
}

TEST_CASE("softmax gradient, causal and not") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    CHECK(gradient_error([&](const Inputs& in) { return ops::softmax(in[0], 0.6, causal); },
                         {leaf({2, 5, 5}, 80)}) < kTol);
  }
  const std::vector<double> p =
      ops::softmax(Tensor::from_doubles({1, 2, 3, 4}, {1, 2, 2}), 1.0, true).to_doubles();
  CHECK(p[0] == doctest::Approx(1.0));
  CHECK(p[1] == 0.0);
  CHECK(p[2] == doctest::Approx(1 / (1 + std::exp(1.0))).epsilon(1e-12));
}

TEST_CASE("cross_entropy gradient and value") {
  const Tensor targets = Tensor::from_ints({2, 0, 3}, {3});
  CHECK(gradient_error([&](const Inputs& in) { return ops::cross_entropy(in[0], targets); },
                       {leaf({3, 5}, 90)}) < kTol);
  // Uniform logits: loss = log(V).
  const Tensor logits = Tensor::zeros({2, 7}, DType::f64);
  CHECK(ops::cross_entropy(logits, Tensor::from_ints({1, 6}, {2})).item() == doctest::Approx(std::log(7.0)));
}

TEST_CASE("attention gradients: naive and flash (CPU tiled), causal and not") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    CHECK(gradient_error([&](const Inputs& in) { return ops::naive_attention(in[0], in[1], in[2], causal); },
                         {leaf({1, 2, 5, 4}, 100), leaf({1, 2, 5, 4}, 101), leaf({1, 2, 5, 4}, 102)}) < kTol);
    CHECK(gradient_error([&](const Inputs& in) { return ops::flash_attention(in[0], in[1], in[2], causal); },
                         {leaf({1, 2, 5, 4}, 103), leaf({1, 2, 5, 4}, 104), leaf({1, 2, 5, 4}, 105)}) < kTol);
  }
}

TEST_CASE(
    "flash attention gradients through the model's layout (heads split from, and merged back into, rows)") {
  // Inputs (batch, seq, heads * d) split into heads by a view; the output merged back the model's way.
  const int64_t b = 1, h = 2, t = 5, d = 4;
  auto split = [&](const Tensor& x) { return ops::transpose(ops::reshape(x, {b, t, h, d}), 1, 2); };
  auto merge = [&](const Tensor& o) {
    return ops::reshape(ops::contiguous(ops::transpose(o, 1, 2)), {b, t, h * d});
  };
  CHECK(gradient_error(
            [&](const Inputs& in) {
              return merge(ops::flash_attention(split(in[0]), split(in[1]), split(in[2]), true));
            },
            {leaf({b, t, h * d}, 106), leaf({b, t, h * d}, 107), leaf({b, t, h * d}, 108)}) < kTol);
}

// The unfused front of an attention sublayer: three projections, RoPE on q and k, flash attention, heads
// merged; what ops::attention_qkv computes in one op.
Tensor unfused_attention(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv, int64_t heads,
                         DType compute) {
  const int64_t b = x.size(0), t = x.size(1), n = wq.size(0), d = n / heads;
  const DType out = compute;  // the projections leave their matmuls in the compute dtype
  auto split = [&](const Tensor& y) { return ops::transpose(ops::reshape(y, {b, t, heads, d}), 1, 2); };
  const Tensor q = ops::rope(ops::linear(x, wq, compute, out), d, 10000.0);
  const Tensor k = ops::rope(ops::linear(x, wk, compute, out), d, 10000.0);
  const Tensor v = ops::linear(x, wv, compute, out);
  const Tensor o = ops::flash_attention(split(q), split(k), split(v), true);
  return ops::reshape(ops::contiguous(ops::transpose(o, 1, 2)), {b, t, n});
}

TEST_CASE(
    "attention_qkv: one matmul, RoPE and flash attention; the values and gradients of the unfused ops") {
  // Finite differences through the whole op (two heads of 4, x and the three weights).
  CHECK(gradient_error(
            [](const Inputs& in) {
              return ops::attention_qkv(in[0], in[1], in[2], in[3], 2, 10000.0, DType::f64);
            },
            {leaf({2, 5, 6}, 340), leaf({8, 6}, 341), leaf({8, 6}, 342), leaf({8, 6}, 343)}) < kTol);
  // Against the unfused ops, with the weights apart (a copy is stacked) and adjacent in one buffer (a view).
  const Tensor x = testing::random_tensor({2, 7, 12}, 344);
  const Tensor flat = testing::random_tensor({3 * 16 * 12}, 345);
  for (const bool adjacent : {false, true}) {
    CAPTURE(adjacent);
    std::vector<Tensor> w;
    for (int64_t i = 0; i < 3; ++i) {
      Tensor wi = adjacent ? flat.narrow_view(0, i * 192, 192).view({16, 12})
                           : testing::random_tensor({16, 12}, 346 + static_cast<uint32_t>(i));
      w.push_back(wi);
    }
    std::vector<Tensor> fused_in, plain_in;
    for (const Tensor& t : {x, w[0], w[1], w[2]}) {
      fused_in.push_back(t.clone().set_requires_grad(true));
      plain_in.push_back(t.clone().set_requires_grad(true));
    }
    if (adjacent) {  // the fused op's inputs share one buffer, as FlatParameters lays them out
      Tensor buffer = flat.clone();
      for (int64_t i = 0; i < 3; ++i) {
        fused_in[static_cast<size_t>(i) + 1] =
            buffer.narrow_view(0, i * 192, 192).view({16, 12}).set_requires_grad(true);
      }
    }
    const Tensor fused =
        ops::attention_qkv(fused_in[0], fused_in[1], fused_in[2], fused_in[3], 4, 10000.0, DType::f64);
    const Tensor plain = unfused_attention(plain_in[0], plain_in[1], plain_in[2], plain_in[3], 4, DType::f64);
    const std::vector<double> a = fused.to_doubles(), b = plain.to_doubles();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
    const Tensor weights = testing::random_tensor(fused.shape(), 349);
    fused.backward(weights);
    plain.backward(weights);
    for (size_t i = 0; i < 4; ++i) {
      CAPTURE(i);
      const std::vector<double> ga = fused_in[i].grad().to_doubles(), gb = plain_in[i].grad().to_doubles();
      for (size_t j = 0; j < ga.size(); ++j) CHECK(ga[j] == doctest::Approx(gb[j]).epsilon(1e-10));
    }
  }
  // bf16: the projections rounded to bf16, q and k rotated and rounded again, as the unfused ops do.
  const Tensor xb = testing::random_tensor({2, 7, 12}, 350, DType::f32);
  const Tensor wq = testing::random_tensor({16, 12}, 351, DType::f32),
               wk = testing::random_tensor({16, 12}, 352, DType::f32),
               wv = testing::random_tensor({16, 12}, 353, DType::f32);
  const std::vector<double> fb = ops::attention_qkv(xb, wq, wk, wv, 4, 10000.0, DType::bf16).to_doubles();
  const std::vector<double> pb = unfused_attention(xb, wq, wk, wv, 4, DType::bf16).to_doubles();
  for (size_t i = 0; i < fb.size(); ++i) CHECK(fb[i] == doctest::Approx(pb[i]).epsilon(1e-2).scale(1.0));
  // Refused: weights of different shapes, heads that do not divide the features evenly.
  CHECK_THROWS_WITH_AS(
      ops::attention_qkv(x, testing::random_tensor({16, 12}, 354), testing::random_tensor({8, 12}, 355),
                         testing::random_tensor({16, 12}, 354), 4, 10000.0, DType::f64),
      doctest::Contains("do not fit"), Error);
  CHECK_THROWS_WITH_AS(
      ops::attention_qkv(x, testing::random_tensor({16, 12}, 354), testing::random_tensor({16, 12}, 354),
                         testing::random_tensor({16, 12}, 354), 3, 10000.0, DType::f64),
      doctest::Contains("heads"), Error);
}

TEST_CASE("swiglu_projection: one matmul over w1 and w3, the values and gradients of the unfused ops") {
  // Finite differences through the whole op (x and both weights).
  CHECK(
      gradient_error([](const Inputs& in) { return ops::swiglu_projection(in[0], in[1], in[2], DType::f64); },
                     {leaf({2, 3, 6}, 360), leaf({5, 6}, 361), leaf({5, 6}, 362)}) < kTol);
  // Against linear + linear + swiglu, with the weights apart (a copy is stacked) and adjacent (a view).
  const Tensor x = testing::random_tensor({2, 7, 12}, 363);
  const Tensor flat = testing::random_tensor({2 * 20 * 12}, 364);
  for (const bool adjacent : {false, true}) {
    CAPTURE(adjacent);
    std::vector<Tensor> fused_in, plain_in;
    const Tensor w1 = testing::random_tensor({20, 12}, 365), w3 = testing::random_tensor({20, 12}, 366);
    for (const Tensor& t : {x, w1, w3}) {
      fused_in.push_back(t.clone().set_requires_grad(true));
      plain_in.push_back(t.clone().set_requires_grad(true));
    }
    if (adjacent) {  // one buffer, as FlatParameters lays a module's parameters out
      Tensor buffer = flat.clone();
      for (int64_t i = 0; i < 2; ++i) {
        fused_in[static_cast<size_t>(i) + 1] =
            buffer.narrow_view(0, i * 240, 240).view({20, 12}).set_requires_grad(true);
        plain_in[static_cast<size_t>(i) + 1] =
            flat.narrow_view(0, i * 240, 240).view({20, 12}).clone().set_requires_grad(true);
      }
    }
    const Tensor fused = ops::swiglu_projection(fused_in[0], fused_in[1], fused_in[2], DType::f64);
    const Tensor plain =
        ops::swiglu(ops::linear(plain_in[0], plain_in[1]), ops::linear(plain_in[0], plain_in[2]));
    REQUIRE(fused.shape() == Shape{2, 7, 20});
    const std::vector<double> a = fused.to_doubles(), b = plain.to_doubles();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
    const Tensor weights = testing::random_tensor(fused.shape(), 367);
    fused.backward(weights);
    plain.backward(weights);
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      const std::vector<double> ga = fused_in[i].grad().to_doubles(), gb = plain_in[i].grad().to_doubles();
      REQUIRE(ga.size() == gb.size());
      for (size_t j = 0; j < ga.size(); ++j) CHECK(ga[j] == doctest::Approx(gb[j]).epsilon(1e-10));
    }
  }
  // bf16: the projections rounded to bf16, the gate computed in f32 and rounded once, as the unfused ops do;
  // with narrow_x_grad, x's gradient is one f32 product rounded to bf16 (the unfused ops round the sum of
  // two).
  Tensor xb = ops::cast(testing::random_tensor({2, 7, 12}, 368, DType::f32), DType::bf16);
  const Tensor w1 = testing::random_tensor({20, 12}, 369, DType::f32),
               w3 = testing::random_tensor({20, 12}, 370, DType::f32);
  Tensor xf = xb.clone(), xp = xb.clone();
  xf.set_requires_grad(true);
  xp.set_requires_grad(true);
  const Tensor fb = ops::swiglu_projection(xf, w1, w3, DType::bf16, /*narrow_x_grad=*/true);
  const Tensor pb = ops::swiglu(ops::linear(xp, w1, DType::bf16, DType::bf16),
                                ops::linear(xp, w3, DType::bf16, DType::bf16));
  CHECK(fb.dtype() == DType::bf16);
  CHECK(fb.to_floats() == pb.to_floats());
  const Tensor g = ops::cast(testing::random_tensor({2, 7, 20}, 371, DType::f32), DType::bf16);
  fb.backward(g);
  pb.backward(g);
  CHECK(xf.grad().dtype() == DType::bf16);
  const std::vector<double> gf = xf.grad().to_doubles(), gp = xp.grad().to_doubles();
  for (size_t i = 0; i < gf.size(); ++i)
    CHECK(gf[i] == doctest::Approx(gp[i]).epsilon(1.0 / 256).scale(1e-6));
  // Refused: weights of different shapes.
  CHECK_THROWS_WITH_AS(ops::swiglu_projection(x, testing::random_tensor({20, 12}, 372),
                                              testing::random_tensor({10, 12}, 373), DType::f64),
                       doctest::Contains("do not fit"), Error);
}

TEST_CASE("flash attention equals naive attention on head-interleaved views") {
  // q/k/v as (batch, heads, seq, d) views of (batch, seq, heads*d) buffers, the model's layout.
  const int64_t b = 2, h = 3, t = 70, d = 8;
  auto view = [&](uint32_t seed) {
    return ops::transpose(ops::reshape(testing::random_tensor({b, t, h * d}, seed), {b, t, h, d}), 1, 2);
  };
  const Tensor q = view(1), k = view(2), v = view(3);
  // O comes back in q's layout, so merging the heads is a view.
  CHECK(ops::flash_attention(q, k, v, true).transpose_view(1, 2).is_contiguous());
  for (bool causal : {false, true}) {
    const std::vector<double> flash = ops::flash_attention(q, k, v, causal).to_doubles();
    const std::vector<double> naive = ops::naive_attention(q, k, v, causal).to_doubles();
    // The kernels take the softmax scale as f32, so agreement is at f32-rounding level.
    CHECK(testing::relative_error(flash, naive) < 1e-6);
  }
}

TEST_CASE("cast rounds to bf16 like the hardware and its gradient flows back") {
  const Tensor x = Tensor::from_floats({1.0f, 1.00390625f, 1.01171875f, -3.14159f}, {4});
  const std::vector<float> y = ops::cast(x, DType::bf16).to_floats();
  CHECK(y[0] == 1.0f);
  CHECK(y[1] == 1.0f);       // halfway, rounds to even
  CHECK(y[2] == 1.015625f);  // halfway, rounds to even (up)
  CHECK(y[3] == -3.140625f);
  Tensor a = testing::random_tensor({3, 4}, 5, DType::f32);
  a.set_requires_grad(true);
  ops::sum(ops::cast(ops::cast(a, DType::bf16), DType::f32)).backward();
  for (float g : a.grad().to_floats()) CHECK(g == 1.0f);
}

TEST_CASE("linear gradients, and the weight gradient added straight into a pre-assigned .grad") {
  CHECK(gradient_error([](const Inputs& in) { return ops::linear(in[0], in[1]); },
                       {leaf({2, 3, 5}, 90), leaf({4, 5}, 91)}) < kTol);
  // With a .grad buffer already in place (what FlatParameters arranges) the product g^T x is added into it
  // in place; the result must be the old contents plus the hand-computed gradient, and the grad-ready hook
  // must still fire exactly once per backward.
  const int64_t rows = 6, in = 5, out = 4;
  Tensor x = leaf({2, 3, in}, 92), w = leaf({out, in}, 93);
  const Tensor initial = testing::random_tensor({out, in}, 94);
  w.set_grad(initial.clone());
  int hook_calls = 0;
  const uint64_t hook = w.register_grad_ready_hook([&](Tensor&) { ++hook_calls; });
  const Tensor r = testing::random_tensor({2, 3, out}, 95);
  ops::sum(ops::mul(ops::linear(x, w), r)).backward();
  CHECK(hook_calls == 1);
  const std::vector<double> xv = x.to_doubles(), wv = w.to_doubles(), rv = r.to_doubles(),
                            g0 = initial.to_doubles(), gw = w.grad().to_doubles(), gx = x.grad().to_doubles();
  double worst_w = 0, worst_x = 0;
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double expect = g0[o * in + i];
      for (int64_t row = 0; row < rows; ++row) expect += rv[row * out + o] * xv[row * in + i];
      worst_w = std::max(worst_w, std::abs(gw[o * in + i] - expect));
    }
  }
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < in; ++i) {
      double expect = 0;
      for (int64_t o = 0; o < out; ++o) expect += rv[row * out + o] * wv[o * in + i];
      worst_x = std::max(worst_x, std::abs(gx[row * in + i] - expect));
    }
  }
  CHECK(worst_w < 1e-12);
  CHECK(worst_x < 1e-12);
  // A second backward through a fresh graph accumulates again.
  ops::sum(ops::mul(ops::linear(x, w), r)).backward();
  CHECK(hook_calls == 2);
  const std::vector<double> gw2 = w.grad().to_doubles();
  for (size_t i = 0; i < gw2.size(); ++i) CHECK(gw2[i] - g0[i] == doctest::Approx(2 * (gw[i] - g0[i])));
  // A removed hook is not called again.
  w.remove_grad_ready_hook(hook);
  ops::sum(ops::mul(ops::linear(x, w), r)).backward();
  CHECK(hook_calls == 2);
}

namespace {
// A transformer block's gradient pattern: x feeds a norm and the residual; the norm feeds three linears (q,
// k, v); h feeds a norm and the residual; that norm feeds two linears (w1, w3).
Tensor block_like(const Inputs& in) {
  const Tensor& x = in[0];
  const Tensor n1 = ops::rms_norm(x, in[1], 1e-5);
  const Tensor branch =
      ops::add(ops::linear(n1, in[2]), ops::mul(ops::linear(n1, in[3]), ops::linear(n1, in[4])));
  const Tensor h = ops::add(x, branch);
  const Tensor n2 = ops::rms_norm(h, in[5], 1e-5);
  return ops::add(h, ops::mul(ops::linear(n2, in[6]), ops::linear(n2, in[7])));
}
Inputs block_like_inputs() {
  return {leaf({2, 3, 8}, 300),   leaf({8}, 301), leaf({8, 8}, 302, 0.5), leaf({8, 8}, 303, 0.5),
          leaf({8, 8}, 304, 0.5), leaf({8}, 305), leaf({8, 8}, 306, 0.5), leaf({8, 8}, 307, 0.5)};
}
}  // namespace

TEST_CASE("gradients added in place by their producers (a linear's GEMM with beta = 1, RMSNorm's backward)") {
  // Finite differences through the whole pattern: every summed gradient is right.
  CHECK(gradient_error(block_like, block_like_inputs()) < kTol);
  // The sums really happen in place: of the three linears reading n1 only the first to run allocates an
  // n1-sized gradient, the others add into it; the same for the two reading n2.
  const int64_t x_bytes = 2 * 3 * 8 * 8;
  int linear_x_allocs = 0;
  set_memory_recorder([&](const MemoryEvent& e) {
    if (e.is_alloc && e.tag == "Linear" && e.bytes == x_bytes) ++linear_x_allocs;
  });
  const Tensor out = block_like(block_like_inputs());
  out.backward(testing::random_tensor(out.shape(), 308));
  set_memory_recorder(nullptr);
  CHECK(linear_x_allocs == 2);
  // A gradient someone else still holds is never written: the caller's own gradient tensor, handed by add's
  // backward to both of its inputs, stays as it was, and x's gradient is g + g W.
  Tensor x = leaf({4, 8}, 310), w = leaf({8, 8}, 311);
  const Tensor g = testing::random_tensor({4, 8}, 312);
  const std::vector<double> g_before = g.to_doubles();
  ops::add(x, ops::linear(x, w)).backward(g);
  CHECK(g.to_doubles() == g_before);
  const std::vector<double> gx = x.grad().to_doubles(), wv = w.to_doubles();
  double worst = 0;
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t i = 0; i < 8; ++i) {
      double expect = g_before[r * 8 + i];
      for (int64_t o = 0; o < 8; ++o) expect += g_before[r * 8 + o] * wv[o * 8 + i];
      worst = std::max(worst, std::abs(gx[r * 8 + i] - expect));
    }
  }
  CHECK(worst < 1e-12);
  // RMSNorm's weight gradient goes straight into a .grad marked as holding zeros (here NaN, so every element
  // must be overwritten) and equals the gradient it returns otherwise; once the mark lapses, it is added.
  Tensor xn = leaf({3, 8}, 313), nw = leaf({8}, 314);
  const Tensor gn = testing::random_tensor({3, 8}, 315);
  ops::rms_norm(xn, nw, 1e-5).backward(gn);
  const std::vector<double> returned = nw.grad().to_doubles();
  nw.set_grad(Tensor::full({8}, NAN, DType::f64, Device::cpu()));
  mark_grad_zeroed(nw);
  ops::rms_norm(xn, nw, 1e-5).backward(gn);
  CHECK(nw.grad().to_doubles() == returned);
  ops::rms_norm(xn, nw, 1e-5).backward(gn);
  const std::vector<double> twice = nw.grad().to_doubles();
  for (size_t i = 0; i < twice.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * returned[i]));
}

TEST_CASE("linear_residual: residual + x W^T in one product, its gradients those of add and linear") {
  CHECK(gradient_error([](const Inputs& in) { return ops::linear_residual(in[2], in[0], in[1], DType::f64); },
                       {leaf({2, 3, 5}, 320), leaf({4, 5}, 321), leaf({2, 3, 4}, 322)}) < kTol);
  // The value: the residual plus the hand-computed product.
  const Tensor x = testing::random_tensor({3, 5}, 323), w = testing::random_tensor({4, 5}, 324),
               r = testing::random_tensor({3, 4}, 325);
  const std::vector<double> y = ops::linear_residual(r, x, w, DType::f64).to_doubles(), xv = x.to_doubles(),
                            wv = w.to_doubles(), rv = r.to_doubles();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t o = 0; o < 4; ++o) {
      double expect = rv[i * 4 + o];
      for (int64_t k = 0; k < 5; ++k) expect += xv[i * 5 + k] * wv[o * 5 + k];
      CHECK(y[i * 4 + o] == doctest::Approx(expect).epsilon(1e-12));
    }
  }
  // A residual of the wrong shape or dtype is refused.
  CHECK_THROWS_WITH_AS(ops::linear_residual(testing::random_tensor({3, 5}, 326), x, w, DType::f64),
                       doctest::Contains("residual must be"), Error);
  CHECK_THROWS_WITH_AS(ops::linear_residual(ops::cast(r, DType::f32), x, w, DType::f64),
                       doctest::Contains("residual must be"), Error);
}

TEST_CASE("rms_norm's input copy and linear_residual's sum_into: the same sum and gradients, made in place") {
  // x + rms_norm(x) W^T with the sum made in the copy the norm wrote of x.
  auto in_copy = [](const Inputs& in) {
    Tensor copy;
    const Tensor n = ops::rms_norm(in[0], in[1], 1e-5, in[0].dtype(), &copy);
    return ops::linear_residual(in[0], n, in[2], in[0].dtype(), false, copy);
  };
  CHECK(gradient_error(in_copy, {leaf({2, 3, 5}, 330), leaf({5}, 331), leaf({5, 5}, 332)}) < kTol);
  const Tensor x = testing::random_tensor({3, 5}, 333), w = testing::random_tensor({5}, 334),
               m = testing::random_tensor({5, 5}, 335);
  Tensor copy;
  const Tensor n = ops::rms_norm(x, w, 1e-5, x.dtype(), &copy);
  CHECK(copy.to_doubles() == x.to_doubles());
  CHECK(copy.raw_data() != x.raw_data());
  CHECK(!copy.requires_grad());
  const Tensor y = ops::linear_residual(x, n, m, DType::f64, false, copy);
  CHECK(y.raw_data() == copy.raw_data());  // the sum was made in the copy
  const std::vector<double> expect = ops::linear_residual(x, n, m, DType::f64).to_doubles(),
                            got = y.to_doubles();
  for (size_t i = 0; i < expect.size(); ++i) CHECK(got[i] == doctest::Approx(expect[i]).epsilon(1e-12));
  // Refused: the residual itself, a tensor in autograd, another shape.
  const Tensor r = testing::random_tensor({3, 5}, 336);
  CHECK_THROWS_WITH_AS(ops::linear_residual(r, n, m, DType::f64, false, r),
                       doctest::Contains("sum_into must be"), Error);
  Tensor tracked = r.clone();
  tracked.set_requires_grad(true);
  CHECK_THROWS_WITH_AS(ops::linear_residual(r, n, m, DType::f64, false, tracked),
                       doctest::Contains("sum_into must be"), Error);
  CHECK_THROWS_WITH_AS(ops::linear_residual(r, n, m, DType::f64, false, testing::random_tensor({5, 3}, 337)),
                       doctest::Contains("sum_into must be"), Error);
}

TEST_CASE("a weight .grad marked as zero is overwritten by the first contribution; the mark lapses") {
  const int64_t rows = 6, in = 5, out = 4;
  Tensor x = leaf({2, 3, in}, 96), w = leaf({out, in}, 97);
  const Tensor r = testing::random_tensor({2, 3, out}, 98);
  // The weight gradient sum_rows r x, by hand.
  const std::vector<double> xv = x.to_doubles(), rv = r.to_doubles();
  std::vector<double> expect(static_cast<size_t>(out * in), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t row = 0; row < rows; ++row) expect[o * in + i] += rv[row * out + o] * xv[row * in + i];
  auto worst_against = [&](const std::vector<double>& base) {
    const std::vector<double> g = w.grad().to_doubles();
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - (base[i] + expect[i])));
    return worst;
  };
  const std::vector<double> none(expect.size(), 0.0);
  auto backward = [&] { ops::sum(ops::mul(ops::linear(x, w), r)).backward(); };
  const double poison = std::numeric_limits<double>::quiet_NaN();
  // Marked: the buffer's (deliberately wrong) contents are never read.
  w.set_grad(Tensor::full({out, in}, poison, DType::f64, Device::cpu()));
  CHECK_FALSE(grad_known_zero(w));
  mark_grad_zeroed(w);
  CHECK(grad_known_zero(w));
  backward();
  CHECK_FALSE(grad_known_zero(w));
  CHECK(worst_against(none) < 1e-12);
  // A mark lapses when any backward pass ends: a writer after it (here a plain copy, as an all-reduce would
  // write) is then added to, not overwritten.
  const Tensor initial = testing::random_tensor({out, in}, 99, DType::f64);
  mark_grad_zeroed(w);
  Tensor z = leaf({3}, 100);
  ops::sum(z).backward();
  CHECK_FALSE(grad_known_zero(w));
  w.grad().copy_(initial);
  backward();
  CHECK(worst_against(initial.to_doubles()) < 1e-12);
  // set_grad forgets a mark.
  mark_grad_zeroed(w);
  w.set_grad(initial.clone());
  CHECK_FALSE(grad_known_zero(w));
  // A mark made during a pass (a hook that clears the gradient after using it) holds for the next pass.
  const uint64_t hook = w.register_grad_ready_hook([](Tensor& leaf) {
    leaf.grad().fill_(std::numeric_limits<double>::quiet_NaN());
    mark_grad_zeroed(leaf);
  });
  backward();
  CHECK(grad_known_zero(w));
  w.remove_grad_ready_hook(hook);
  backward();
  CHECK(worst_against(none) < 1e-12);
  // A weight used by two layers in one pass: the first product overwrites, the second adds to it.
  Tensor x2 = leaf({2, 3, in}, 101);
  const Tensor r2 = testing::random_tensor({2, 3, out}, 102);
  const std::vector<double> x2v = x2.to_doubles(), r2v = r2.to_doubles();
  std::vector<double> second(expect.size(), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t row = 0; row < rows; ++row) second[o * in + i] += r2v[row * out + o] * x2v[row * in + i];
  w.grad().fill_(poison);
  mark_grad_zeroed(w);
  ops::sum(ops::add(ops::mul(ops::linear(x, w), r), ops::mul(ops::linear(x2, w), r2))).backward();
  CHECK(worst_against(second) < 1e-12);
}

TEST_CASE("mixed-precision linear: bf16 operands, f32 or bf16 output, f32 gradients") {
  Tensor x = testing::random_tensor({3, 7, 16}, 100, DType::f32),
         w = testing::random_tensor({9, 16}, 101, DType::f32);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y32 = ops::linear(x, w, DType::bf16, DType::f32);
  const Tensor y16 = ops::linear(x, w, DType::bf16, DType::bf16);
  CHECK(y16.dtype() == DType::bf16);
  // The bf16 output is the f32 product rounded once.
  CHECK(y16.to_floats() == ops::cast(y32, DType::bf16).to_floats());
  // Against an independent double-precision product of the bf16-rounded operands.
  const std::vector<double> xb = ops::cast(ops::cast(x, DType::bf16), DType::f32).to_doubles(),
                            wb = ops::cast(ops::cast(w, DType::bf16), DType::f32).to_doubles(),
                            y = y32.to_doubles();
  double worst = 0;
  for (int64_t row = 0; row < 21; ++row) {
    for (int64_t o = 0; o < 9; ++o) {
      double expect = 0;
      for (int64_t i = 0; i < 16; ++i) expect += xb[row * 16 + i] * wb[o * 16 + i];
      worst = std::max(worst, std::abs(y[row * 9 + o] - expect));
    }
  }
  CHECK(worst < 1e-5);
  // Gradients arrive in f32 for the f32 leaves, pre-assigned .grad or not.
  ops::sum(ops::cast(y16, DType::f32)).backward();
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(w.grad().dtype() == DType::f32);
  Tensor w2 = w.clone();
  w2.set_requires_grad(true);
  w2.set_grad(Tensor::zeros({9, 16}, DType::f32, Device::cpu()));
  ops::sum(ops::cast(ops::linear(x.clone(), w2, DType::bf16, DType::bf16), DType::f32)).backward();
  CHECK(testing::relative_error(w2.grad().to_doubles(), w.grad().to_doubles()) < 1e-6);
}

TEST_CASE("narrow_x_grad: a bf16 input's gradient comes back in bf16, the wide one rounded once") {
  const Tensor w = testing::random_tensor({9, 16}, 102, DType::f32),
               r = testing::random_tensor({3, 7, 9}, 103, DType::f32);
  // x reaches the matmul through a cast to bf16, whose backward widens whatever gradient arrives.
  auto input_grad = [&](bool narrow, DType compute, bool residual) {
    Tensor x = testing::random_tensor({3, 7, 16}, 104, DType::f32);
    x.set_requires_grad(true);
    const Tensor xb = ops::cast(x, DType::bf16);
    const Tensor y = residual ? ops::linear_residual(r, xb, w, compute, narrow)
                              : ops::linear(xb, w, compute, DType::f32, narrow);
    ops::sum(ops::mul(y, testing::random_tensor({3, 7, 9}, 105, DType::f32))).backward();
    return x.grad().to_floats();
  };
  for (bool residual : {false, true}) {
    CAPTURE(residual);
    const std::vector<float> wide = input_grad(false, DType::bf16, residual);
    const std::vector<float> narrow = input_grad(true, DType::bf16, residual);
    const std::vector<float> rounded =
        ops::cast(ops::cast(Tensor::from_floats(wide, {3, 7, 16}), DType::bf16), DType::f32).to_floats();
    CHECK(narrow == rounded);
    CHECK(narrow != wide);  // random values: rounding them to bf16 changes some
    // Computed in f32 (the product is f32, not rounded by the GEMM), the gradient stays wide.
    CHECK(input_grad(true, DType::f32, residual) == input_grad(false, DType::f32, residual));
  }
}

TEST_CASE("a bf16 .grad marked zero is overwritten with the f32 gradient rounded once; unmarked, added to") {
  const int64_t rows = 2, in = 64, out = 48;
  const Tensor x = testing::random_tensor({rows, in}, 110, DType::f32);
  Tensor w = testing::random_tensor({out, in}, 111, DType::f32), w_ref = w.clone();
  w.set_requires_grad(true);
  w_ref.set_requires_grad(true);
  w_ref.set_grad(Tensor::zeros({out, in}, DType::f32, Device::cpu()));
  const Tensor r = testing::random_tensor({rows, out}, 112, DType::f32);
  auto backward = [&](Tensor& weight) {
    ops::sum(ops::mul(ops::linear(x, weight, DType::bf16, DType::f32), r)).backward();
  };
  backward(w_ref);
  const std::vector<float> g = w_ref.grad().to_floats();
  // Poisoned but marked zero: never read.
  w.set_grad(ops::cast(Tensor::full({out, in}, NAN, DType::f32, Device::cpu()), DType::bf16));
  mark_grad_zeroed(w);
  backward(w);
  const std::vector<float> first = w.grad().to_floats();
  // The mark lapsed with the pass: the next pass's f32 gradient is added in f32 and rounded once.
  backward(w);
  const std::vector<float> second = w.grad().to_floats();
  size_t first_wrong = 0, second_wrong = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (first[i] != static_cast<float>(bf16(g[i]))) ++first_wrong;
    if (second[i] != static_cast<float>(bf16(first[i] + g[i]))) ++second_wrong;
  }
  CHECK(first_wrong == 0);
  CHECK(second_wrong == 0);
}

TEST_CASE("rms_norm with a bf16 output: the f32 result rounded once, the same f32 gradients") {
  Tensor x = testing::random_tensor({4, 33}, 110, DType::f32),
         w = testing::random_tensor({33}, 111, DType::f32);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor x2 = x.clone(), w2 = w.clone();
  x2.set_requires_grad(true);
  w2.set_requires_grad(true);
  const Tensor narrow = ops::rms_norm(x, w, 1e-5, DType::bf16);
  const Tensor wide = ops::rms_norm(x2, w2, 1e-5);
  CHECK(narrow.dtype() == DType::bf16);
  CHECK(narrow.to_floats() == ops::cast(wide, DType::bf16).to_floats());
  // The same incoming gradient (bf16-representable) gives the same f32 gradients.
  const Tensor r = ops::cast(testing::random_tensor({4, 33}, 112, DType::f32), DType::bf16);
  narrow.backward(r);
  wide.backward(ops::cast(r, DType::f32));
  CHECK(x.grad().to_floats() == x2.grad().to_floats());
  CHECK(w.grad().to_floats() == w2.grad().to_floats());
}

TEST_CASE("rope with a bf16 output: the f32 rotation rounded once; x's gradient in bf16, rounded once") {
  Tensor x = testing::random_tensor({2, 5, 16}, 113, DType::f32), x2 = x.clone();
  x.set_requires_grad(true);
  x2.set_requires_grad(true);
  const Tensor narrow = ops::rope(x, 8, 10000.0, DType::bf16);
  const Tensor wide = ops::rope(x2, 8, 10000.0);
  CHECK(narrow.dtype() == DType::bf16);
  CHECK(narrow.to_floats() == ops::cast(wide, DType::bf16).to_floats());
  // A bf16 incoming gradient: the inverse rotation of its exact f32 value, rounded once to bf16.
  const Tensor r = ops::cast(testing::random_tensor({2, 5, 16}, 114, DType::f32), DType::bf16);
  narrow.backward(r);
  wide.backward(ops::cast(r, DType::f32));
  CHECK(x.grad().dtype() == DType::f32);  // accumulated into the f32 leaf's own dtype
  CHECK(x.grad().to_floats() == ops::cast(ops::cast(x2.grad(), DType::bf16), DType::f32).to_floats());
  CHECK(x.grad().to_floats() != x2.grad().to_floats());  // the rounding did happen
  CHECK_THROWS_WITH_AS(ops::rope(ops::cast(x, DType::bf16), 8, 10000.0, DType::f32),
                       doctest::Contains("bf16 from f32"), Error);
}

TEST_CASE("swiglu on bf16 inputs: f32 arithmetic, bf16 result and gradients") {
  Tensor a = ops::cast(testing::random_tensor({5, 40}, 120, DType::f32, 2.0), DType::bf16),
         b = ops::cast(testing::random_tensor({5, 40}, 121, DType::f32), DType::bf16);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor y = ops::swiglu(a, b);
  CHECK(y.dtype() == DType::bf16);
  const Tensor g = testing::random_tensor({5, 40}, 122, DType::f32);
  y.backward(g);
  CHECK(a.grad().dtype() == DType::bf16);
  const std::vector<double> av = a.to_doubles(), bv = b.to_doubles(), yv = y.to_doubles(),
                            gv = g.to_doubles(), da = a.grad().to_doubles(), db = b.grad().to_doubles();
  // Independent double-precision formulas; bf16 keeps 8 significant bits (relative error <= 2^-8).
  auto close = [](double got, double want) { return std::abs(got - want) <= std::abs(want) / 256 + 1e-30; };
  for (size_t i = 0; i < av.size(); ++i) {
    const double sig = 1 / (1 + std::exp(-av[i]));
    CHECK(close(yv[i], av[i] * sig * bv[i]));
    CHECK(close(db[i], gv[i] * av[i] * sig));
    CHECK(close(da[i], gv[i] * bv[i] * sig * (1 + av[i] * (1 - sig))));
  }
}

TEST_CASE(
    "linear with mixed input dtypes: x's gradient comes back in x's dtype; bf16 weights keep bf16 grads") {
  // An f64 input against f32 weights: computed in f32, dx returned in f64.
  Tensor x = testing::random_tensor({3, 8}, 130, DType::f64),
         w = testing::random_tensor({5, 8}, 131, DType::f32);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y = ops::linear(x, w);
  CHECK(y.dtype() == DType::f32);
  ops::sum(y).backward();
  REQUIRE(x.grad().dtype() == DType::f64);
  const std::vector<double> gx = x.grad().to_doubles(), wv = w.to_doubles();
  for (int64_t row = 0; row < 3; ++row) {
    for (int64_t i = 0; i < 8; ++i) {
      double expect = 0;
      for (int64_t o = 0; o < 5; ++o) expect += wv[o * 8 + i];
      CHECK(gx[row * 8 + i] == doctest::Approx(expect).epsilon(1e-6));
    }
  }
  // bf16 operands and weight: an f32 product (as matmul gives), a bf16 weight gradient, and a pre-assigned
  // bf16 .grad is added to the ordinary way, not in place (in-place accumulation is for f32/f64 buffers).
  Tensor xb = ops::cast(testing::random_tensor({4, 8}, 132, DType::f32), DType::bf16),
         wb = ops::cast(testing::random_tensor({6, 8}, 133, DType::f32), DType::bf16);
  wb.set_requires_grad(true);
  const Tensor yb = ops::linear(xb, wb);
  CHECK(yb.dtype() == DType::f32);
  ops::sum(yb).backward();
  REQUIRE(wb.grad().dtype() == DType::bf16);
  const std::vector<double> gw = wb.grad().to_doubles(), xv = xb.to_doubles();
  for (int64_t o = 0; o < 6; ++o) {
    for (int64_t i = 0; i < 8; ++i) {
      double expect = 0;
      for (int64_t row = 0; row < 4; ++row) expect += xv[row * 8 + i];
      CHECK(gw[o * 8 + i] == doctest::Approx(expect).epsilon(1.0 / 128));
    }
  }
}

namespace {
// Loss, x's and the weight's gradients of the classifier + cross-entropy, fused (ops::linear_cross_entropy
// with `chunk` rows per chunk) or with the unfused ops as autocast computes it (cross_entropy over the
// linear's logits, made in the compute dtype and upcast: bf16 logits in bf16), the loss's gradient `grad`.
struct HeadResult {
  std::vector<double> loss, dx, dw;
};
HeadResult head_loss(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& targets, DType compute,
                     int64_t chunk, double grad) {
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  const DType wide = compute == DType::bf16 ? DType::f32 : compute;
  Tensor loss;
  if (fused) {
    loss = ops::linear_cross_entropy(x, w, targets, compute, chunk);
  } else {
    const Tensor logits = ops::cast(ops::linear(x, w, compute, compute), wide);
    loss = ops::cross_entropy(ops::reshape(logits, {targets.numel(), w.size(0)}), targets);
  }
  CHECK(loss.dtype() == wide);
  loss.backward(Tensor::full({1}, grad, loss.dtype()));
  CHECK(x.grad().shape() == x.shape());
  return {loss.to_doubles(), x.grad().to_doubles(), w.grad().to_doubles()};
}
}  // namespace

TEST_CASE("linear_cross_entropy: finite differences (f64), chunks that do not divide the rows") {
  const Tensor targets = Tensor::from_ints({3, 10, 0, 7, 7, 1, 9, 4, 2, 5}, {10});
  for (const int64_t chunk : {int64_t{0}, int64_t{3}, int64_t{4}}) {
    CAPTURE(chunk);
    CHECK(gradient_error(
              [&](const Inputs& in) {
                return ops::linear_cross_entropy(in[0], in[1], targets, DType::f64, chunk);
              },
              {leaf({2, 5, 6}, 360), leaf({11, 6}, 361)}) < kTol);
  }
}

TEST_CASE("linear_cross_entropy equals cross_entropy(linear(x, W)): loss and gradients, any chunking") {
  // Vocabularies that are not multiples of 8 (rows padded to 64 inside), 39 rows in chunks of 7 and 16 (the
  // last one short), one chunk, and a chunk larger than the batch; the loss's gradient 1 (no scaling) or not.
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const int64_t vocab : {int64_t{5}, int64_t{257}, int64_t{1001}}) {
      const std::string dtype_text = dtype_name(dtype);
      CAPTURE(dtype_text);
      CAPTURE(vocab);
      const Tensor x = testing::random_tensor({3, 13, 24}, 370, dtype);
      const Tensor w = testing::random_tensor({vocab, 24}, 371, dtype, 0.3);
      std::vector<int32_t> ids(39);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
      ids.back() = static_cast<int32_t>(vocab - 1);
      const Tensor targets = Tensor::from_ints(ids, {39});
      const double tol = dtype == DType::f32 ? 1e-6 : 1e-12;
      for (const double grad : {1.0, -0.37}) {
        const HeadResult plain = head_loss(false, x, w, targets, dtype, 0, grad);
        for (const int64_t chunk : {int64_t{0}, int64_t{7}, int64_t{16}, int64_t{1000}}) {
          CAPTURE(grad);
          CAPTURE(chunk);
          const HeadResult fused = head_loss(true, x, w, targets, dtype, chunk, grad);
          CHECK(testing::relative_error(fused.loss, plain.loss) < tol);
          CHECK(testing::relative_error(fused.dx, plain.dx) < tol);
          CHECK(testing::relative_error(fused.dw, plain.dw) < tol);
        }
      }
    }
  }
  // bf16 operands (x cast, the weight cast as ops::linear casts it), the logits rounded to bf16 and the loss
  // computed in f32 from them, the logits' gradient rounded to bf16 as the unfused cast's backward rounds it:
  // the same numbers.
  const Tensor x = testing::random_tensor({2, 20, 32}, 372, DType::f32);
  const Tensor w = testing::random_tensor({257, 32}, 373, DType::f32, 0.3);
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 31 + 5) % 257);
  const Tensor targets = Tensor::from_ints(ids, {40});
  const HeadResult plain = head_loss(false, x, w, targets, DType::bf16, 0, 1.0);
  for (const int64_t chunk : {int64_t{0}, int64_t{9}}) {
    CAPTURE(chunk);
    const HeadResult fused = head_loss(true, x, w, targets, DType::bf16, chunk, 1.0);
    CHECK(testing::relative_error(fused.loss, plain.loss) < 1e-6);
    CHECK(testing::relative_error(fused.dx, plain.dx) < 1e-6);
    CHECK(testing::relative_error(fused.dw, plain.dw) < 1e-6);
  }
}

TEST_CASE(
    "linear_cross_entropy in bf16: the logits rounded to bf16 once, the loss in f32, as autocast does") {
  // An independent computation: x and W on a grid of 1/16 (|x| <= 2, |W| <= 1, exact in bf16), so that each
  // logit's sum of 32 products is exact in f32 in any order and its rounding to bf16 is the only one; the
  // softmax and loss from those logits in double; the logits' gradient rounded to bf16; dX and dW summed in
  // double. The fused op's f32 softmax may round a gradient element the other way now and then.
  const int64_t rows = 37, in = 32;
  for (const int64_t vocab : {int64_t{257}, int64_t{1001}}) {
    CAPTURE(vocab);
    std::mt19937 gen(static_cast<uint32_t>(vocab));
    std::uniform_int_distribution<int> x_steps(-32, 32), w_steps(-16, 16);
    std::vector<float> xv(static_cast<size_t>(rows * in)), wv(static_cast<size_t>(vocab * in));
    for (float& v : xv) v = static_cast<float>(x_steps(gen)) / 16;
    for (float& v : wv) v = static_cast<float>(w_steps(gen)) / 16;
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 5) % vocab);
    ids.back() = static_cast<int32_t>(vocab - 1);
    auto to_bf16 = [](double v) {
      return static_cast<double>(static_cast<float>(bf16(static_cast<float>(v))));
    };
    double loss = 0;
    std::vector<double> dx(xv.size(), 0.0), dw(wv.size(), 0.0), logits(static_cast<size_t>(vocab));
    bool rounded = false;  // some logit that bf16 does not hold exactly: the rounding is tested
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < vocab; ++j) {
        double product = 0;
        for (int64_t k = 0; k < in; ++k) product += double{xv[i * in + k]} * double{wv[j * in + k]};
        logits[j] = to_bf16(product);
        rounded = rounded || logits[j] != product;
      }
      const double top = *std::max_element(logits.begin(), logits.end());
      double total = 0;
      for (const double z : logits) total += std::exp(z - top);
      const double lse = top + std::log(total);
      loss += (lse - logits[ids[i]]) / rows;
      for (int64_t j = 0; j < vocab; ++j) {
        const double g = to_bf16((std::exp(logits[j] - lse) - (j == ids[i] ? 1.0 : 0.0)) / rows);
        for (int64_t k = 0; k < in; ++k) {
          dx[i * in + k] += g * wv[j * in + k];
          dw[j * in + k] += g * xv[i * in + k];
        }
      }
    }
    CHECK(rounded);
    const Tensor x = Tensor::from_floats(xv, {rows, in}), w = Tensor::from_floats(wv, {vocab, in});
    const Tensor targets = Tensor::from_ints(ids, {rows});
    for (const int64_t chunk : {int64_t{0}, int64_t{9}}) {
      CAPTURE(chunk);
      const HeadResult fused = head_loss(true, x, w, targets, DType::bf16, chunk, 1.0);
      CHECK(testing::relative_error(fused.loss, {loss}) < 1e-6);
      CHECK(testing::relative_error(fused.dx, dx) < 1e-5);
      CHECK(testing::relative_error(fused.dw, dw) < 1e-5);
    }
  }
}

TEST_CASE("linear_cross_entropy: only what is needed, the weight's .grad accumulated, targets checked") {
  const Tensor x0 = testing::random_tensor({6, 4}, 380), w0 = testing::random_tensor({9, 4}, 381);
  const Tensor targets = Tensor::from_ints({0, 8, 3, 3, 5, 1}, {6});
  const double value = head_loss(false, x0, w0, targets, DType::f64, 0, 1.0).loss[0];
  // Without grad mode: the loss alone, no graph.
  {
    NoGradGuard guard;
    Tensor w = w0.clone().set_requires_grad(true);
    const Tensor loss = ops::linear_cross_entropy(x0, w, targets, DType::f64, 4);
    CHECK(loss.grad_fn() == nullptr);
    CHECK(loss.item() == doctest::Approx(value).epsilon(1e-12));
  }
  // x without requires_grad: the weight's gradient only, added into a .grad already in place (as a
  // FlatParameters buffer), its grad-ready hook fired once per pass.
  Tensor w = w0.clone().set_requires_grad(true);
  const Tensor initial = testing::random_tensor({9, 4}, 382);
  w.set_grad(initial.clone());
  int hook_calls = 0;
  w.register_grad_ready_hook([&](Tensor&) { ++hook_calls; });
  ops::linear_cross_entropy(x0, w, targets, DType::f64, 4).backward();
  CHECK(hook_calls == 1);
  const std::vector<double> expected = head_loss(false, x0, w0, targets, DType::f64, 0, 1.0).dw;
  const std::vector<double> got = w.grad().to_doubles(), before = initial.to_doubles();
  for (size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] - before[i] == doctest::Approx(expected[i]).epsilon(1e-10));
  // Out-of-range targets: the same error as cross_entropy's.
  for (const int32_t bad : {9, -1}) {
    CAPTURE(bad);
    const std::string message = "target id " + std::to_string(bad) + " out of range for vocab 9";
    const Tensor wrong = Tensor::from_ints({0, 1, bad, 2, 3, 4}, {6});
    CHECK_THROWS_WITH_AS(ops::linear_cross_entropy(x0, w0, wrong, DType::f64),
                         doctest::Contains(message.c_str()), Error);
    CHECK_THROWS_WITH_AS(ops::cross_entropy(ops::linear(x0, w0), wrong), doctest::Contains(message.c_str()),
                         Error);
  }
  // Targets that do not match the rows, and inputs that do not match the weight, are refused.
  CHECK_THROWS_WITH_AS(ops::linear_cross_entropy(x0, w0, Tensor::from_ints({0, 1}, {2}), DType::f64),
                       doctest::Contains("one entry per row"), Error);
  CHECK_THROWS_WITH_AS(
      ops::linear_cross_entropy(testing::random_tensor({6, 5}, 383), w0, targets, DType::f64),
      doctest::Contains("do not match weight"), Error);
}
