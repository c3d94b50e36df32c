// The CPU FlashAttention-2 (tiled, online softmax) against a naive attention written here from the
// textbook formulas: S materialised, masked with -1e6 like the course reference, softmax, O = PV, and the
// backward by its explicit matrix formulas, all in double. Also a finite-difference check of the backward.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/flash_attention.h"

namespace {

using tt::AttentionProblem;
using tt::AttentionStrides;

// Where q, k, v (one input buffer) and o (one output buffer) live. The gradients dq/dk/dv use a buffer laid
// out like the inputs and dO one laid out like O.
struct Views {
  AttentionProblem p;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;
  size_t in_elements = 0, out_elements = 0;
};

// contiguous: three separate (batch, heads, seq, d) tensors back to back, O likewise.
// interleaved: q, k, v are slices of one fused (batch, seq, 3, heads, d) projection and O is a
// (batch, seq, heads * d + 3) buffer whose 3 padding columns per row must never be written.
Views make_views(int64_t batch, int64_t heads, int64_t seq, int64_t d, bool causal, bool interleaved) {
  Views w;
  w.p.batch = batch;
  w.p.heads = heads;
  w.p.seq = seq;
  w.p.d_head = d;
  w.p.causal = causal;
  w.p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t one = batch * heads * seq * d;
  if (!interleaved) {
    w.p.q = w.p.k = w.p.v = w.p.o = AttentionProblem::contiguous(heads, seq, d);
    w.k_offset = one;
    w.v_offset = 2 * one;
    w.in_elements = static_cast<size_t>(3 * one);
    w.out_elements = static_cast<size_t>(one);
  } else {
    const int64_t row = 3 * heads * d;
    w.p.q = w.p.k = w.p.v = AttentionStrides{seq * row, d, row};
    w.k_offset = heads * d;
    w.v_offset = 2 * heads * d;
    const int64_t out_row = heads * d + 3;
    w.p.o = AttentionStrides{seq * out_row, d, out_row};
    w.in_elements = static_cast<size_t>(batch * seq * row);
    w.out_elements = static_cast<size_t>(batch * seq * out_row);
  }
  return w;
}

template <class T>
std::vector<T> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> x(n);
  for (auto& value : x) value = static_cast<T>(dist(rng));
  return x;
}

// Copies the (batch, heads, seq, d) view at base + offset into a contiguous double array.
template <class T>
std::vector<double> gather(const std::vector<T>& buffer, int64_t offset, const AttentionStrides& s,
                           const AttentionProblem& p) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(p.batch * p.heads * p.seq * p.d_head));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq; ++i)
        for (int64_t e = 0; e < p.d_head; ++e)
          out.push_back(static_cast<double>(buffer[offset + b * s.batch + h * s.head + i * s.seq + e]));
  return out;
}

struct Attention {
  std::vector<double> o, lse, dq, dk, dv;  // contiguous (batch, heads, seq, d) and (batch*heads, seq)
};

// Naive attention on contiguous double tensors, one (batch, head) at a time.
Attention naive_attention(const AttentionProblem& p, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& d_o) {
  const int64_t n = p.seq, d = p.d_head, bh = p.batch * p.heads;
  const double scale = p.scale;
  Attention r;
  r.o.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(q.size(), 0.0);
  r.dv.assign(q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(bh * n), 0.0);
  std::vector<double> prob(n * n), dprob(n * n), dscore(n * n);
  for (int64_t x = 0; x < bh; ++x) {
    const size_t base = static_cast<size_t>(x * n * d);
    auto at = [&](const std::vector<double>& t, int64_t i, int64_t e) { return t[base + i * d + e]; };
    for (int64_t i = 0; i < n; ++i) {
      double row_max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t e = 0; e < d; ++e) s += at(q, i, e) * at(k, j, e);
        s *= scale;
        if (p.causal && j > i) s = -1e6;
        prob[i * n + j] = s;
        row_max = std::max(row_max, s);
      }
      double total = 0;
      for (int64_t j = 0; j < n; ++j) total += std::exp(prob[i * n + j] - row_max);
      r.lse[x * n + i] = row_max + std::log(total);
      for (int64_t j = 0; j < n; ++j) prob[i * n + j] = std::exp(prob[i * n + j] - row_max) / total;
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < d; ++e) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += prob[i * n + j] * at(v, j, e);
        r.o[base + i * d + e] = sum;
      }
    // dP = dO V^T, dS = P * (dP - rowsum(P * dP)).
    for (int64_t i = 0; i < n; ++i) {
      double row_dot = 0;
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t e = 0; e < d; ++e) s += at(d_o, i, e) * at(v, j, e);
        dprob[i * n + j] = s;
        row_dot += s * prob[i * n + j];
      }
      for (int64_t j = 0; j < n; ++j) dscore[i * n + j] = prob[i * n + j] * (dprob[i * n + j] - row_dot);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < d; ++e) {
        double dq = 0, dk = 0, dv = 0;
        for (int64_t j = 0; j < n; ++j) {
          dq += dscore[i * n + j] * at(k, j, e);
          dk += dscore[j * n + i] * at(q, j, e);
          dv += prob[j * n + i] * at(d_o, j, e);
        }
        r.dq[base + i * d + e] = dq * scale;
        r.dk[base + i * d + e] = dk * scale;
        r.dv[base + i * d + e] = dv;
      }
  }
  return r;
}

// |actual - expected| <= tol * (1 + |expected|) everywhere (NaN fails), reporting the first mismatch.
void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, double tol,
                  const char* what) {
  REQUIRE(actual.size() == expected.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!(std::abs(actual[i] - expected[i]) <= tol + tol * std::abs(expected[i]))) {
      if (bad++ == 0) first = i;
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << actual.size() << " values differ, first at "
                               << first << ": " << actual[first] << " vs " << expected[first]);
}

// Entries of `buffer` that no (batch, head, seq, d) index of the view reaches must still be NaN.
template <class T>
void expect_untouched_outside(const std::vector<T>& buffer, const AttentionStrides& s,
                              const AttentionProblem& p) {
  std::vector<char> covered(buffer.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq; ++i)
        for (int64_t e = 0; e < p.d_head; ++e) covered[b * s.batch + h * s.head + i * s.seq + e] = 1;
  size_t written = 0;
  for (size_t i = 0; i < buffer.size(); ++i)
    if (!covered[i] && !std::isnan(static_cast<double>(buffer[i]))) ++written;
  CHECK_MESSAGE(written == 0, written << " entries outside the output view were written");
}

template <class T>
void check_against_naive(int64_t batch, int64_t heads, int64_t seq, int64_t d, bool causal, bool interleaved,
                         int64_t tile_q, int64_t tile_k) {
  const double tol = std::is_same_v<T, float> ? 1e-2 : 1e-9;
  CAPTURE(batch);
  CAPTURE(heads);
  CAPTURE(seq);
  CAPTURE(d);
  CAPTURE(causal);
  CAPTURE(interleaved);
  CAPTURE(tile_q);
  CAPTURE(tile_k);
  const Views w = make_views(batch, heads, seq, d, causal, interleaved);
  const AttentionProblem& p = w.p;
  std::mt19937 rng(1234);
  const std::vector<T> in = random_values<T>(w.in_elements, rng);
  const std::vector<T> d_o = random_values<T>(w.out_elements, rng);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> o(w.out_elements, nan), lse(static_cast<size_t>(batch * heads * seq), nan);
  std::vector<T> grad(w.in_elements, nan);

  tt::cpu::flash_attention_forward<T>(p, in.data() + w.q_offset, in.data() + w.k_offset,
                                      in.data() + w.v_offset, o.data(), lse.data(), tile_q, tile_k);
  tt::cpu::flash_attention_backward<T>(p, in.data() + w.q_offset, in.data() + w.k_offset,
                                       in.data() + w.v_offset, o.data(), d_o.data(), lse.data(),
                                       grad.data() + w.q_offset, grad.data() + w.k_offset,
                                       grad.data() + w.v_offset, tile_q, tile_k);

  const Attention ref = naive_attention(p, gather(in, w.q_offset, p.q, p), gather(in, w.k_offset, p.k, p),
                                        gather(in, w.v_offset, p.v, p), gather(d_o, 0, p.o, p));
  expect_close(gather(o, 0, p.o, p), ref.o, tol, "O");
  expect_close(std::vector<double>(lse.begin(), lse.end()), ref.lse, tol, "L");
  expect_close(gather(grad, w.q_offset, p.q, p), ref.dq, tol, "dQ");
  expect_close(gather(grad, w.k_offset, p.k, p), ref.dk, tol, "dK");
  expect_close(gather(grad, w.v_offset, p.v, p), ref.dv, tol, "dV");
  expect_untouched_outside(o, p.o, p);
  if (interleaved) {
    // q, k, v views tile the fused gradient buffer exactly: every entry must have been written.
    size_t unwritten = 0;
    for (const T g : grad) unwritten += std::isnan(static_cast<double>(g)) ? 1 : 0;
    CHECK(unwritten == 0);
  }
}

template <class T>
void check_all_masks(int64_t batch, int64_t heads, int64_t seq, int64_t d, bool interleaved, int64_t tile_q,
                     int64_t tile_k) {
  for (const bool causal : {false, true}) {
    check_against_naive<T>(batch, heads, seq, d, causal, interleaved, tile_q, tile_k);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("cpu flash attention matches naive attention on the course shape (4, 128, 64)", T, float,
                   double) {
  check_all_masks<T>(4, 1, 128, 64, false, 64, 64);
  check_all_masks<T>(4, 1, 128, 64, false, 32, 64);  // several query tiles per key tile
}

TEST_CASE_TEMPLATE("cpu flash attention with head dim 80 and several heads", T, float, double) {
  check_all_masks<T>(2, 3, 96, 80, false, 32, 16);
}

TEST_CASE_TEMPLATE("cpu flash attention on odd sequence lengths and tiles that do not divide them", T, float,
                   double) {
  for (const int64_t seq : {77, 129}) {
    check_all_masks<T>(2, 2, seq, 32, false, 64, 64);
    check_all_masks<T>(1, 2, seq, 16, false, 16, 48);
    check_all_masks<T>(1, 1, seq, 16, false, 7, 5);
  }
  check_all_masks<T>(1, 2, 5, 16, false, 64, 64);  // one partial tile
  check_all_masks<T>(1, 1, 1, 8, false, 64, 64);   // a single token
}

TEST_CASE_TEMPLATE("cpu flash attention on head-interleaved strided layouts", T, float, double) {
  check_all_masks<T>(2, 3, 77, 16, true, 32, 16);
  check_all_masks<T>(2, 2, 64, 64, true, 64, 64);
  check_all_masks<T>(1, 2, 129, 80, true, 64, 32);
}

TEST_CASE("cpu flash attention backward agrees with central finite differences (double)") {
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    const Views w = make_views(1, 2, 5, 16, causal, false);
    const AttentionProblem& p = w.p;
    std::mt19937 rng(99);
    std::vector<double> in = random_values<double>(w.in_elements, rng);
    const std::vector<double> weights = random_values<double>(w.out_elements, rng);  // R in sum(O * R)
    std::vector<double> o(w.out_elements), lse(static_cast<size_t>(p.batch * p.heads * p.seq));
    auto objective = [&]() {
      tt::cpu::flash_attention_forward<double>(p, in.data() + w.q_offset, in.data() + w.k_offset,
                                               in.data() + w.v_offset, o.data(), lse.data(), 2, 3);
      double sum = 0;
      for (size_t i = 0; i < o.size(); ++i) sum += o[i] * weights[i];
      return sum;
    };
    objective();
    std::vector<double> grad(w.in_elements);
    // d sum(O * R) / dO = R.
    tt::cpu::flash_attention_backward<double>(
        p, in.data() + w.q_offset, in.data() + w.k_offset, in.data() + w.v_offset, o.data(), weights.data(),
        lse.data(), grad.data() + w.q_offset, grad.data() + w.k_offset, grad.data() + w.v_offset, 2, 3);
    const double h = 1e-5;
    std::uniform_int_distribution<int64_t> pick(0, static_cast<int64_t>(w.k_offset) - 1);
    for (const int64_t tensor_offset : {w.q_offset, w.k_offset, w.v_offset}) {
      for (int trial = 0; trial < 6; ++trial) {
        const size_t index = static_cast<size_t>(tensor_offset + pick(rng));
        const double saved = in[index];
        in[index] = saved + h;
        const double plus = objective();
        in[index] = saved - h;
        const double minus = objective();
        in[index] = saved;
        const double numeric = (plus - minus) / (2 * h);
        CAPTURE(index);
        CHECK(std::abs(numeric - grad[index]) <= 1e-7 + 1e-6 * std::abs(grad[index]));
      }
    }
  }
}
