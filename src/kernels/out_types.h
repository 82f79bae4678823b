#pragma once
// out_types<T>(y_dtype, op, [&](auto tag) { using Y = decltype(tag); ... }):
// the element type of a forward op's output y for compute type T, shared by
// the CPU twins and the CUDA twins' host code: T itself, or bf16 for fp32 (an
// activation that only feeds bf16 GEMMs under --bf16, rounded once as it is
// stored, bit for bit as a later cast would round it). Also the storage-type
// dispatch and dtype checks the bf16-storing twins share.

#include <fmt/format.h>

#include <type_traits>

#include "core/dtype.h"
#include "core/status.h"

namespace mt::kernels {

//
// H16 (every helper here): whether fp16 (mt::f16) is a stored type too, next
// to bf16 with the same rules. The CPU twins pass true (kernels/cpu/common.h);
// the CUDA twins have no fp16 code yet and keep the default.
template <typename T, bool H16 = false, typename F>
void out_types(DType y, const char* op, F&& f) {
  if (y == dtype_of<T>()) return f(T{});
  if constexpr (std::is_same_v<T, float>) {
    if (y == DType::kBF16) return f(bf16{});
    if constexpr (H16)
      if (y == DType::kF16) return f(f16{});
  }
  MT_CHECK(false, fmt::format("{}: output dtype {} for {} input (expected the input's dtype, or {} for fp32)", op,
                              dtype_name(y), dtype_name(dtype_of<T>()), H16 ? "bf16 or fp16" : "bf16"));
}

// storage_types(dtype, [&](auto tag) { using S = decltype(tag); ... }): the
// element type a tensor stores, fp32, fp64, bf16 or (H16) fp16. A kernel computes in
// compute_t<S> (float for bf16) and widens each stored value exactly (ld<T>
// of kernels/cpu/common.h and kernels/cuda/pointwise_common.cuh), so a bf16
// input gives the bits an fp32 input holding the same values gives; bf16
// results are rounded once as they are stored (to_out).
template <bool H16 = false, typename F>
void storage_types(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); break;
    case DType::kF64: f(double{}); break;
    case DType::kBF16: f(bf16{}); break;
    case DType::kF16:
      if constexpr (H16) {
        f(f16{});
        break;
      }
      [[fallthrough]];
    default: MT_CHECK(false, fmt::format("unsupported dtype {}", dtype_name(dt)));
  }
}
// A 16-bit stored type (bf16 or fp16), computed in float.
template <typename S>
inline constexpr bool is_half_v = std::is_same_v<S, bf16> || std::is_same_v<S, f16>;
template <typename S>
using compute_t = std::conditional_t<is_half_v<S>, float, S>;

// f32_bf16_types(dtype, op, what, [&](auto tag) { using S = decltype(tag); ... }):
// the stored types of an operand computed in fp32, fp32 or bf16 (the bf16
// residual stream under --bf16, next to fp32 partial results).
template <bool H16 = false, typename F>
void f32_bf16_types(DType dt, const char* op, const char* what, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); break;
    case DType::kBF16: f(bf16{}); break;
    case DType::kF16:
      if constexpr (H16) {
        f(f16{});
        break;
      }
      [[fallthrough]];
    default:
      MT_CHECK(false, fmt::format("{}: {} must be fp32 or {} when the operands' dtypes differ or any is 16-bit "
                                  "(got {}; fp64 operands must all be fp64)",
                                  op, what, H16 ? "bf16 or fp16" : "bf16", dtype_name(dt)));
  }
}

// x_types(x, compute, op, f): the stored type of a norm's (or embedding
// gradient's) row operand x for compute type T: T itself, or bf16 when T is
// float (the bf16 residual stream).
template <typename T, bool H16 = false, typename F>
void x_types(DType x, const char* op, const char* what, F&& f) {
  if (x == dtype_of<T>()) return f(T{});
  if constexpr (std::is_same_v<T, float>) {
    if (x == DType::kBF16) return f(bf16{});
    if constexpr (H16)
      if (x == DType::kF16) return f(f16{});
  }
  MT_CHECK(false, fmt::format("{}: {} dtype {} with {} parameters (expected {}, or {} with fp32 parameters)", op, what,
                              dtype_name(x), dtype_name(dtype_of<T>()), dtype_name(dtype_of<T>()),
                              H16 ? "bf16 or fp16" : "bf16"));
}

// float_types(dtype, [&](auto tag) { using T = decltype(tag); ... }): the
// fp32/fp64 dispatch of the CPU and CUDA twins (a lambda, not a macro, so
// that its body may hold OpenMP pragmas).
template <typename F>
void float_types(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); break;
    case DType::kF64: f(double{}); break;
    default: MT_CHECK(false, fmt::format("unsupported dtype {}", dtype_name(dt)));
  }
}

// The norms' dtype rules (kernels/norm.h), one dispatch for both twins:
// f(T, X, Y) with T the parameters' type, X the stored type of x (T, or bf16
// with fp32 T) and Y that of y (out_types).
template <bool H16 = false, typename F>
void norm_fwd_types(DType x, DType w, DType y, const char* op, F&& f) {
  float_types(w, [&](auto t_) {
    using T = decltype(t_);
    x_types<T, H16>(x, op, "x", [&](auto x_) {
      out_types<T, H16>(y, op, [&](auto y_) { f(T{}, decltype(x_){}, decltype(y_){}); });
    });
  });
}
// f(T, X, D): x and dx share the stored type X, dy is stored as D (each T,
// or bf16 with fp32 T).
template <bool H16 = false, typename F>
void norm_bwd_types(DType dy, DType x, DType w, DType dx, const char* op, F&& f) {
  MT_CHECK(dx == x, fmt::format("{}: x and dx must share one dtype (got {}, {})", op, dtype_name(x), dtype_name(dx)));
  float_types(w, [&](auto t_) {
    using T = decltype(t_);
    x_types<T, H16>(x, op, "x", [&](auto x_) {
      x_types<T, H16>(dy, op, "dy", [&](auto d_) { f(T{}, decltype(x_){}, decltype(d_){}); });
    });
  });
}

// A backward's x, dy and dx share one stored dtype.
inline void check_bwd_dtypes(const DType x, const DType dy, const DType dx, const char* op) {
  MT_CHECK(dy == x && dx == x, fmt::format("{}: x, dy and dx must share one dtype (fp32, fp64, bf16 or, on the CPU, fp16); got {}, {}, {}",
                                           op, dtype_name(x), dtype_name(dy), dtype_name(dx)));
}

}  // namespace mt::kernels
