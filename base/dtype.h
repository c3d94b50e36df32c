// Element types and the bf16 storage type, shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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
