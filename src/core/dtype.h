#pragma once
// Element types and devices a Tensor can describe, and bf16/fp16 <-> fp32
// conversion. bf16 is stored as the upper 16 bits of an IEEE fp32; fp16 is
// IEEE binary16 (5 exponent bits, 10 mantissa bits, subnormals, max 65504).
// Rounding from fp32 is round-to-nearest-even for both (what PyTorch, oneDNN
// and the F16C instructions do); fp32 beyond fp16's range becomes inf.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mt {

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64, kF16 };
enum class Device : uint8_t { kCpu, kCuda };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
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
    case DType::kF16: return "fp16";
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

// fp16 (IEEE binary16) as a plain 16-bit payload, like bf16.
struct f16 {
  uint16_t bits;
};

inline f16 float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // quiet NaN
  if (a >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520 (and inf): inf
  if (a >= 0x38800000u) {  // fp16 normal: rebias the exponent, round the low 13 bits to nearest even
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return f16{static_cast<uint16_t>(sign | (r >> 13))};
  }
  // Subnormal or zero: adding 0.5f (whose ulp is 2^-24, fp16's subnormal
  // step) lets the fp32 adder round |f| to a multiple of 2^-24, nearest even;
  // the multiple is the payload (0x400 is the smallest normal, 2^-14).
  float af;
  std::memcpy(&af, &a, 4);
  const float t = af + 0.5f;
  uint32_t u;
  std::memcpy(&u, &t, 4);
  return f16{static_cast<uint16_t>(sign | (u - 0x3f000000u))};
}

inline float f16_to_float(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1fu, m = h.bits & 0x3ffu;
  uint32_t u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);  // inf, NaN
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m x 2^-24, exact
    return sign ? -v : v;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <> constexpr DType dtype_of<f16>() { return DType::kF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }

}  // namespace mt
