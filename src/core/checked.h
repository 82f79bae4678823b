#pragma once
// Saturating integer arithmetic for sizes a user typed: a product that would
// overflow int64 becomes INT64_MAX, which every range check then rejects,
// instead of wrapping into a small, plausible-looking number.

#include <cstdint>
#include <limits>

namespace mt {

inline int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::numeric_limits<int64_t>::max();
  return r;
}

template <typename... T>
int64_t mul_sat(int64_t a, int64_t b, T... rest) {
  return mul_sat(mul_sat(a, b), rest...);
}

inline int64_t add_sat(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::numeric_limits<int64_t>::max();
  return r;
}

}  // namespace mt
