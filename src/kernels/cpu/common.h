#pragma once
// Helpers shared by the CPU kernels: dtype dispatch to a template over the
// compute type (float for fp32, double for the fp64 reference path).

#include <fmt/format.h>

#include <type_traits>

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

// ld<T>(v): a stored value (storage_types, kernels/out_types.h) widened to
// the compute type T, exactly.
template <typename T, typename S>
inline T ld(S v) {
  if constexpr (std::is_same_v<S, bf16>) return static_cast<T>(bf16_to_float(v));
  else return static_cast<T>(v);
}

// v rounded to the output type Y (float_to_bf16 for bf16).
template <typename Y, typename T>
inline Y to_out(T v) {
  if constexpr (std::is_same_v<Y, bf16>) return float_to_bf16(static_cast<float>(v));
  else return static_cast<Y>(v);
}

// Pointer of type T, or nullptr for an undefined (optional) tensor.
template <typename T>
T* opt_ptr(const Tensor& t) {
  return t.defined() ? t.ptr<T>() : nullptr;
}

}  // namespace mt::kernels::cpu
