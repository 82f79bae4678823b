#pragma once
// out_types<T>(y_dtype, op, [&](auto tag) { using Y = decltype(tag); ... }):
// the element type of a forward op's output y for compute type T, shared by
// the CPU twins and the CUDA twins' host code: T itself, or bf16 for fp32 (an
// activation that only feeds bf16 GEMMs under --bf16, rounded once as it is
// stored, bit for bit as a later cast would round it).

#include <fmt/format.h>

#include <type_traits>

#include "core/dtype.h"
#include "core/status.h"

namespace mt::kernels {

template <typename T, typename F>
void out_types(DType y, const char* op, F&& f) {
  if (y == dtype_of<T>()) return f(T{});
  if constexpr (std::is_same_v<T, float>)
    if (y == DType::kBF16) return f(bf16{});
  MT_CHECK(false, fmt::format("{}: output dtype {} for {} input (expected the input's dtype, or bf16 for fp32)", op,
                              dtype_name(y), dtype_name(dtype_of<T>())));
}

}  // namespace mt::kernels
