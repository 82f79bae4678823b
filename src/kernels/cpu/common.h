#pragma once
// Helpers shared by the CPU kernels: dtype dispatch to a template over the
// compute type (float for fp32, double for the fp64 reference path).

#include <fmt/format.h>

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/out_types.h"

#define MT_FLOAT_TYPES(dtype, T, ...)                                                     \
  switch (dtype) {                                                                        \
    case ::mt::DType::kF32: {                                                             \
      using T = float;                                                                    \
      __VA_ARGS__;                                                                        \
      break;                                                                              \
    }                                                                                     \
    case ::mt::DType::kF64: {                                                             \
      using T = double;                                                                   \
      __VA_ARGS__;                                                                        \
      break;                                                                              \
    }                                                                                     \
    default:                                                                              \
      MT_CHECK(false, fmt::format("unsupported dtype {}", ::mt::dtype_name(dtype)));      \
  }

namespace mt::kernels::cpu {

// fp16 <-> fp32 in the kernels: the F16C instructions where the build
// targets them (-march=native; conversions the compiler can vectorise,
// bit for bit core/dtype.h's, which tests/kernels checks), else dtype.h's.
inline float f16_widen(f16 h) {
#if defined(__F16C__)
  return static_cast<float>(std::bit_cast<_Float16>(h.bits));
#else
  return f16_to_float(h);
#endif
}
inline f16 f16_round(float f) {
#if defined(__F16C__)
  return f16{std::bit_cast<uint16_t>(static_cast<_Float16>(f))};
#else
  return float_to_f16(f);
#endif
}

// n floats rounded to fp16 (f16_round each), 8 at a time with F16C and in
// parallel; and n fp16 values widened (f16_widen each). The bulk passes:
// casts, the optimizer's fp16 weight copies, widened GEMM operands.
inline void f16_round_n(const float* src, f16* dst, int64_t n) {
#if defined(__F16C__) && defined(__AVX__)
  const int64_t n8 = n / 8 * 8;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n8; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (int64_t i = n8; i < n; ++i) dst[i] = f16_round(src[i]);
#else
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_round(src[i]);
#endif
}
inline void f16_widen_n(const f16* src, float* dst, int64_t n) {
#if defined(__F16C__) && defined(__AVX__)
  const int64_t n8 = n / 8 * 8;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n8; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (int64_t i = n8; i < n; ++i) dst[i] = f16_widen(src[i]);
#else
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_widen(src[i]);
#endif
}

// ld<T>(v): a stored value (storage_types, kernels/out_types.h) widened to
// the compute type T, exactly.
template <typename T, typename S>
inline T ld(S v) {
  if constexpr (std::is_same_v<S, bf16>) return static_cast<T>(bf16_to_float(v));
  else if constexpr (std::is_same_v<S, f16>) return static_cast<T>(f16_widen(v));
  else return static_cast<T>(v);
}

// v rounded to the output type Y (float_to_bf16 for bf16, float_to_f16 for fp16).
template <typename Y, typename T>
inline Y to_out(T v) {
  if constexpr (std::is_same_v<Y, bf16>) return float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<Y, f16>) return f16_round(static_cast<float>(v));
  else return static_cast<Y>(v);
}

// The stored-type dispatches of kernels/out_types.h with fp16 beside bf16:
// the CPU twins take fp16 wherever they take bf16 (--fp16), the CUDA twins
// not yet. Unqualified calls in this namespace find these first.
template <typename F>
void storage_types(DType dt, F&& f) { kernels::storage_types<true>(dt, std::forward<F>(f)); }
template <typename T, typename F>
void out_types(DType y, const char* op, F&& f) { kernels::out_types<T, true>(y, op, std::forward<F>(f)); }
template <typename F>
void f32_bf16_types(DType dt, const char* op, const char* what, F&& f) {
  kernels::f32_bf16_types<true>(dt, op, what, std::forward<F>(f));
}
template <typename T, typename F>
void x_types(DType x, const char* op, const char* what, F&& f) { kernels::x_types<T, true>(x, op, what, std::forward<F>(f)); }
template <typename F>
void norm_fwd_types(DType x, DType w, DType y, const char* op, F&& f) {
  kernels::norm_fwd_types<true>(x, w, y, op, std::forward<F>(f));
}
template <typename F>
void norm_bwd_types(DType dy, DType x, DType w, DType dx, const char* op, F&& f) {
  kernels::norm_bwd_types<true>(dy, x, w, dx, op, std::forward<F>(f));
}

// Pointer of type T, or nullptr for an undefined (optional) tensor.
template <typename T>
T* opt_ptr(const Tensor& t) {
  return t.defined() ? t.ptr<T>() : nullptr;
}

}  // namespace mt::kernels::cpu
