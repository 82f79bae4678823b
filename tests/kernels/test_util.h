#pragma once
// Helpers for kernel tests: owned buffers viewed as Tensors, seeded fills, and
// a central-finite-difference gradient check in double precision.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace mt::test {

template <typename T>
struct Buf {
  std::vector<T> v;
  Shape shape;
  Buf() = default;
  explicit Buf(Shape s, T fill = T(0)) : v(static_cast<size_t>(s.numel()), fill), shape(s) {}
  Tensor t() { return Tensor(v.data(), shape, dtype_of<T>()); }
  T& operator[](size_t i) { return v[i]; }
  size_t size() const { return v.size(); }
};

// A float rounded once to the 16-bit type H (bf16 or fp16), and back.
template <typename H>
H to_half(float f) {
  if constexpr (std::is_same_v<H, bf16>) return float_to_bf16(f);
  else return float_to_f16(f);
}
inline float from_half(bf16 h) { return bf16_to_float(h); }
inline float from_half(f16 h) { return f16_to_float(h); }

inline void fill_normal(std::vector<double>& v, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  for (double& x : v) x = d(g);
}
inline void fill_normal(std::vector<float>& v, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  for (float& x : v) x = static_cast<float>(d(g));
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` with central differences of loss() w.r.t. every element
// of `x` (perturbed in place and restored). Error is relative to the largest
// analytic magnitude, so tiny components do not dominate.
inline void expect_fd_grad(std::vector<double>& x, const std::function<double()>& loss,
                           const std::vector<double>& analytic, const char* what, double h = 1e-5,
                           double tol = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double scale = 1e-12;
  for (double a : analytic) scale = std::max(scale, std::abs(a));
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double old = x[i];
    x[i] = old + h;
    double lp = loss();
    x[i] = old - h;
    double lm = loss();
    x[i] = old;
    double num = (lp - lm) / (2 * h);
    double err = std::abs(num - analytic[i]) / scale;
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LT(worst, tol) << what << ": worst relative error at element " << worst_i << " (analytic "
                        << analytic[worst_i] << ")";
}

}  // namespace mt::test
