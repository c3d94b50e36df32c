// Counter-based random numbers (Philox-4x32-10): the value at (seed, counter) depends on nothing else, so
// any element can be generated independently, on any device, in any order, with identical bits. Parameter
// initialisation draws element i from counter i, which makes weights identical on CPU, GPU and every rank.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define TT_HOST_DEVICE __host__ __device__
#else
#define TT_HOST_DEVICE
#endif

namespace tt {

struct Philox4 {
  uint32_t v[4];
};

// Philox-4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
TT_HOST_DEVICE inline Philox4 philox4x32(uint64_t counter, uint64_t seed) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits: exact in f32, so CPU and GPU agree bit for bit.
TT_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// A standard normal truncated to [-cut, cut] (cut in standard deviations), for element `index`: Box-Muller
// in double on successive Philox blocks of the element until a value falls inside the cut. Used on the
// host; the GPU receives the initialised weights.
inline double truncated_normal(uint64_t seed, uint64_t index, double cut) {
  for (uint64_t attempt = 0;; ++attempt) {
    const Philox4 r = philox4x32(index * 64 + attempt, seed);
    const double u1 = (static_cast<double>(r.v[0]) + 1.0) / 4294967296.0;  // (0, 1]
    const double u2 = static_cast<double>(r.v[1]) / 4294967296.0;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    if (std::fabs(z) <= cut || attempt == 63) return std::fabs(z) <= cut ? z : 0.0;
  }
}

// A small sequential generator over the same counter space (data sampling, dropout-free sampling of text).
// Its whole state is (seed, counter), which checkpoints save for exact resume.
struct CounterRng {
  uint64_t seed = 0;
  uint64_t counter = 0;
  uint32_t next_u32() { return philox4x32(counter++, seed).v[0]; }
  uint64_t next_u64() {
    const Philox4 r = philox4x32(counter++, seed);
    return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  }
  // Uniform integer in [0, n) (n > 0), without modulo bias worth noting for n << 2^64.
  uint64_t next_below(uint64_t n) { return next_u64() % n; }
  double next_double() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
};

}  // namespace tt
