#include "kernels/activation.h"

#include <cmath>

#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_math.h"

namespace mt::kernels::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <typename T, typename Y>
void gelu_fwd(GeluKind k, int64_t n, const T* x, Y* y) {
  if (k == GeluKind::kExact) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = to_out<Y>(T(0.5) * x[i] * (T(1) + verf(x[i] * T(kInvSqrt2))));
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      T u = T(kSqrt2OverPi) * (x[i] + T(0.044715) * x[i] * x[i] * x[i]);
      y[i] = to_out<Y>(T(0.5) * x[i] * (T(1) + std::tanh(u)));
    }
  }
}

template <typename T>
void gelu_bwd(GeluKind k, int64_t n, const T* x, const T* dy, T* dx) {
  if (k == GeluKind::kExact) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      T cdf = T(0.5) * (T(1) + verf(x[i] * T(kInvSqrt2)));
      T pdf = T(kInvSqrt2Pi) * vexp(T(-0.5) * x[i] * x[i]);
      dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      T x2 = x[i] * x[i];
      T u = T(kSqrt2OverPi) * (x[i] + T(0.044715) * x2 * x[i]);
      T th = std::tanh(u);
      T du = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x2);
      dx[i] = dy[i] * (T(0.5) * (T(1) + th) + T(0.5) * x[i] * (T(1) - th * th) * du);
    }
  }
}

template <typename T, typename Y>
void swiglu_fwd(int64_t N, int64_t F, const T* x, Y* y) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* g = x + i * 2 * F;
    const T* u = g + F;
    Y* yi = y + i * F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) yi[j] = to_out<Y>(g[j] / (T(1) + std::exp(-g[j])) * u[j]);
  }
}

template <typename T>
void swiglu_bwd(int64_t N, int64_t F, const T* x, const T* dy, T* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* g = x + i * 2 * F;
    const T* u = g + F;
    const T* dyi = dy + i * F;
    T* dg = dx + i * 2 * F;
    T* du = dg + F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      T s = T(1) / (T(1) + std::exp(-g[j]));
      T silu = g[j] * s;
      du[j] = dyi[j] * silu;
      dg[j] = dyi[j] * u[j] * (s + silu * (T(1) - s));
    }
  }
}

}  // namespace

void gelu_forward(GeluKind k, const Tensor& x, const Tensor& y) {
  MT_CHECK(x.numel() == y.numel(), "gelu_forward: sizes");
  float_types(x.dtype(), [&](auto t_) {
    using T = decltype(t_);
    out_types<T>(y.dtype(), "gelu_forward", [&](auto y_) {
      using Y = decltype(y_);
      gelu_fwd<T, Y>(k, x.numel(), x.ptr<T>(), y.ptr<Y>());
    });
  });
}
void gelu_backward(GeluKind k, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  MT_CHECK(x.numel() == dy.numel() && x.numel() == dx.numel(), "gelu_backward: sizes");
  MT_FLOAT_TYPES(x.dtype(), T, gelu_bwd<T>(k, x.numel(), x.ptr<T>(), dy.ptr<T>(), dx.ptr<T>()));
}
void swiglu_forward(const Tensor& x, const Tensor& y) {
  int64_t F = y.dim(-1), N = y.numel() / F;
  MT_CHECK(x.numel() == 2 * y.numel() && x.dim(-1) == 2 * F, "swiglu_forward: x must be [N, 2F], y [N, F]");
  float_types(x.dtype(), [&](auto t_) {
    using T = decltype(t_);
    out_types<T>(y.dtype(), "swiglu_forward", [&](auto y_) {
      using Y = decltype(y_);
      swiglu_fwd<T, Y>(N, F, x.ptr<T>(), y.ptr<Y>());
    });
  });
}
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  int64_t F = dy.dim(-1), N = dy.numel() / F;
  MT_CHECK(x.numel() == 2 * dy.numel() && dx.numel() == x.numel(), "swiglu_backward: sizes");
  MT_FLOAT_TYPES(x.dtype(), T, swiglu_bwd<T>(N, F, x.ptr<T>(), dy.ptr<T>(), dx.ptr<T>()));
}

}  // namespace mt::kernels::cpu
