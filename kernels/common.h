// Types and error checking shared by every layer: the bf16 storage type and the exception thrown by
// failed CUDA, cuBLASLt, NCCL, MPI and HDF5 calls (naming the call, file:line and rank).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tt {

// Element types. f64 exists on CPU only, for finite-difference gradient checks in double precision.
enum class DType : uint8_t { f32, f64, bf16, i32 };

inline size_t dtype_size(DType t) {
  return t == DType::f64 ? 8 : t == DType::bf16 ? 2 : 4;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

// Rank of this process, set by the distributed runtime; errors mention it.
int process_rank();
void set_process_rank(int rank);

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised when a device allocation cannot be satisfied even after emptying the cache; benchmarks turn it
// into an "OOM" row instead of crashing.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_call_error(const char* what, const char* call, const std::string& detail,
                                   const char* file, int line);

// Checks a plain condition about user input or API use; the message should say what is wrong.
#define TT_CHECK(cond, msg)                           \
  do {                                                \
    if (!(cond)) throw ::tt::Error(std::string(msg)); \
  } while (0)

// bfloat16 as stored in memory: the upper 16 bits of an IEEE float. Conversion rounds to nearest even,
// which is what CUDA's __float2bfloat16 does, so CPU and GPU casts agree bit for bit.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) { bits = from_float(f); }
  explicit operator float() const { return to_float(bits); }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
  static float to_float(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

}  // namespace tt
