#pragma once
// The element types attention's tensors may have (kernels/attention.h has the
// contract), shared by the CPU twin and the CUDA twin's host code, with the
// same messages for what they refuse:
//   attention_qkv_types(qkv, op, [&](auto tag) { using Tin = decltype(tag); ... })
//   attention_types<Tin>(y, op, name, [&](auto tag) { using Y = decltype(tag); ... })
// for out, dout and dqkv: the accumulation type AttnAcc<Tin> (fp32, fp64 for
// fp64 qkv), or bf16 when qkv is bf16 (rounded once as it is stored, widened
// exactly as it is loaded); lse is always the accumulation type.

#include <fmt/format.h>

#include <type_traits>

#include "core/dtype.h"
#include "core/status.h"

namespace mt::kernels {

// fp32 for fp32 and bf16 qkv, fp64 for fp64.
template <typename Tin>
using AttnAcc = std::conditional_t<std::is_same_v<Tin, double>, double, float>;

// H16: fp16 qkv too, with the bf16 rules (the CPU twin; the CUDA twin has no
// fp16 kernels yet).
template <bool H16 = false, typename F>
void attention_qkv_types(DType qkv, const char* op, F&& f) {
  switch (qkv) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    case DType::kF64: return f(double{});
    case DType::kF16:
      if constexpr (H16) return f(f16{});
      [[fallthrough]];
    default:
      MT_CHECK(false, fmt::format("{}: qkv is {}, expected fp32, {} or fp64", op, dtype_name(qkv),
                                  H16 ? "bf16, fp16" : "bf16"));
  }
}

template <typename Tin, typename F>
void attention_types(DType y, const char* op, const char* name, F&& f) {
  using A = AttnAcc<Tin>;
  constexpr bool half = std::is_same_v<Tin, bf16> || std::is_same_v<Tin, f16>;
  if (y == dtype_of<A>()) return f(A{});
  if constexpr (half)
    if (y == dtype_of<Tin>()) return f(Tin{});
  MT_CHECK(false, fmt::format("{}: {} is {}, expected {} for {} qkv", op, name, dtype_name(y),
                              half ? fmt::format("fp32 or {}", dtype_name(dtype_of<Tin>())) : dtype_name(dtype_of<A>()),
                              dtype_name(dtype_of<Tin>())));
}

// MT_CHECKs that lse has the accumulation type.
template <typename Tin>
void attention_check_lse(DType lse, const char* op) {
  MT_CHECK(lse == dtype_of<AttnAcc<Tin>>(), fmt::format("{}: lse is {}, expected {} for {} qkv", op, dtype_name(lse),
                                                        dtype_name(dtype_of<AttnAcc<Tin>>()),
                                                        dtype_name(dtype_of<Tin>())));
}

}  // namespace mt::kernels
