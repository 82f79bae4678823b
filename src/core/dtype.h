#pragma once
// Element types and devices a Tensor can describe, and bf16 <-> fp32
// conversion. bf16 is stored as the upper 16 bits of an IEEE fp32; rounding
// from fp32 is round-to-nearest-even (what PyTorch and oneDNN do).

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mt {

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64 };
enum class Device : uint8_t { kCpu, kCuda };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF64: return "fp64";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
  }
  return "?";
}

// bf16 as a plain 16-bit payload; arithmetic always goes through float.
struct bf16 {
  uint16_t bits;
};

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float bf16_to_float(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }

}  // namespace mt
