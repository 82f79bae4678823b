#pragma once
// exp, erf and tanh for the fp32 kernels, written so that `omp simd` loops
// vectorise them (the libm calls do not, without -ffast-math): plain
// arithmetic, min/max selects and bit casts, no branches, no tables.
//   exp_simd: Cephes' expf (x = n ln2 + r, degree-6 polynomial in r, 2^n
//             through the exponent bits); within 1 ulp of exp on
//             [-87.3, 88.7] (checked on a 1e-3 grid); clamped outside it, so
//             exp_simd(-inf) is ~1e-38, not 0: callers that need exact zeros
//             (masks) select them. NaN propagates.
//   erf_simd: two minimax pieces split at |x| = 0.927734375 (odd polynomial
//             below, 1 - exp(poly) above; N. Juffa's erff), within 1 ulp of
//             erf (checked on a 1e-4 grid over [-12, 12]).
// vexp<T>/verf<T>/vtanh<T>: these for float; std::exp/erf/tanh for double, so the fp64
// reference path of the tests keeps libm's results.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace mt::kernels::cpu {

inline float exp_simd(float x) {
  x = std::min(std::max(x, -87.3365f), 88.7228f);
  const float shift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
  const float t = x * 1.44269504088896341f + shift;
  const float n = t - shift;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(shift) + 127) << 23;  // 2^n
  return p * std::bit_cast<float>(e);
}

inline float erf_simd(float a) {
  const float t = std::fabs(a), s = a * a;
  // |a| > 0.927734375: erf = sign(a) (1 - exp(poly(t)))
  float r = std::fma(-1.72853470e-5f, t, 3.83197126e-4f);
  const float u = std::fma(-3.88396438e-3f, t, 2.42546219e-2f);
  r = std::fma(r, s, u);
  r = std::fma(r, t, -1.06777877e-1f);
  r = std::fma(r, t, -6.34846687e-1f);
  r = std::fma(r, t, -1.28717512e-1f);
  r = std::fma(r, t, -t);
  const float big = std::copysign(1.0f - exp_simd(r), a);
  // |a| <= 0.927734375: erf = a + a poly(a^2)
  float q = -5.96761703e-4f;
  q = std::fma(q, s, 4.99119423e-3f);
  q = std::fma(q, s, -2.67681349e-2f);
  q = std::fma(q, s, 1.12819925e-1f);
  q = std::fma(q, s, -3.76125336e-1f);
  q = std::fma(q, s, 1.28379166e-1f);
  q = std::fma(q, a, a);
  return t > 0.927734375f ? big : q;
}

// tanh: Cephes' tanhf, an odd polynomial below |x| = 0.625 and
// 1 - 2 / (exp(2|x|) + 1) above it (with the sign), both computed and one
// selected so that `omp simd` loops vectorise it; within a few ulp of tanh
// (tests/kernels: GELU's tanh form against fp64).
inline float tanh_simd(float x) {
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float e = exp_simd(2.0f * std::fabs(x));
  const float big = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return std::fabs(x) < 0.625f ? small : big;
}

template <typename T>
inline T vexp(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_simd(x);
  else return std::exp(x);
}

template <typename T>
inline T verf(T x) {
  if constexpr (std::is_same_v<T, float>) return erf_simd(x);
  else return std::erf(x);
}

template <typename T>
inline T vtanh(T x) {
  if constexpr (std::is_same_v<T, float>) return tanh_simd(x);
  else return std::tanh(x);
}

}  // namespace mt::kernels::cpu
