#include "kernels/activation.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_math.h"

namespace mt::kernels::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

// S: the stored type of x (and of dy, dx in backward); T = compute_t<S>.
template <typename S, typename Y>
void gelu_fwd(GeluKind k, int64_t n, const S* xs, Y* y) {
  using T = compute_t<S>;
  if (k == GeluKind::kExact) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T x = ld<T>(xs[i]);
      y[i] = to_out<Y>(T(0.5) * x * (T(1) + verf(x * T(kInvSqrt2))));
    }
  } else if (k == GeluKind::kSquaredRelu) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T r = std::max(ld<T>(xs[i]), T(0));
      y[i] = to_out<Y>(r * r);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T x = ld<T>(xs[i]);
      T u = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
      y[i] = to_out<Y>(T(0.5) * x * (T(1) + vtanh(u)));
    }
  }
}

template <typename S>
void gelu_bwd(GeluKind k, int64_t n, const S* xs, const S* dys, S* dx) {
  using T = compute_t<S>;
  if (k == GeluKind::kExact) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T x = ld<T>(xs[i]);
      T cdf = T(0.5) * (T(1) + verf(x * T(kInvSqrt2)));
      T pdf = T(kInvSqrt2Pi) * vexp(T(-0.5) * x * x);
      dx[i] = to_out<S>(ld<T>(dys[i]) * (cdf + x * pdf));
    }
  } else if (k == GeluKind::kSquaredRelu) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T r = std::max(ld<T>(xs[i]), T(0));
      dx[i] = to_out<S>(ld<T>(dys[i]) * (T(2) * r));
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T x = ld<T>(xs[i]);
      T x2 = x * x;
      T u = T(kSqrt2OverPi) * (x + T(0.044715) * x2 * x);
      T th = vtanh(u);
      T du = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x2);
      dx[i] = to_out<S>(ld<T>(dys[i]) * (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du));
    }
  }
}

template <typename S, typename Y>
void swiglu_fwd(int64_t N, int64_t F, const S* x, Y* y) {
  using T = compute_t<S>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const S* g = x + i * 2 * F;
    const S* u = g + F;
    Y* yi = y + i * F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const T gj = ld<T>(g[j]);
      yi[j] = to_out<Y>(gj / (T(1) + std::exp(-gj)) * ld<T>(u[j]));
    }
  }
}

template <typename S>
void swiglu_bwd(int64_t N, int64_t F, const S* x, const S* dy, S* dx) {
  using T = compute_t<S>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const S* g = x + i * 2 * F;
    const S* u = g + F;
    const S* dyi = dy + i * F;
    S* dg = dx + i * 2 * F;
    S* du = dg + F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const T gj = ld<T>(g[j]), uj = ld<T>(u[j]), d = ld<T>(dyi[j]);
      T s = T(1) / (T(1) + std::exp(-gj));
      T silu = gj * s;
      du[j] = to_out<S>(d * silu);
      dg[j] = to_out<S>(d * uj * (s + silu * (T(1) - s)));
    }
  }
}

}  // namespace

void gelu_forward(GeluKind k, const Tensor& x, const Tensor& y) {
  MT_CHECK(x.numel() == y.numel(), "gelu_forward: sizes");
  storage_types(x.dtype(), [&](auto s_) {
    using S = decltype(s_);
    out_types<compute_t<S>>(y.dtype(), "gelu_forward", [&](auto y_) {
      using Y = decltype(y_);
      gelu_fwd<S, Y>(k, x.numel(), x.ptr<S>(), y.ptr<Y>());
    });
  });
}
void gelu_backward(GeluKind k, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  MT_CHECK(x.numel() == dy.numel() && x.numel() == dx.numel(), "gelu_backward: sizes");
  check_bwd_dtypes(x.dtype(), dy.dtype(), dx.dtype(), "gelu_backward");
  storage_types(x.dtype(), [&](auto s_) {
    using S = decltype(s_);
    gelu_bwd<S>(k, x.numel(), x.ptr<S>(), dy.ptr<S>(), dx.ptr<S>());
  });
}
void swiglu_forward(const Tensor& x, const Tensor& y) {
  int64_t F = y.dim(-1), N = y.numel() / F;
  MT_CHECK(x.numel() == 2 * y.numel() && x.dim(-1) == 2 * F, "swiglu_forward: x must be [N, 2F], y [N, F]");
  storage_types(x.dtype(), [&](auto s_) {
    using S = decltype(s_);
    out_types<compute_t<S>>(y.dtype(), "swiglu_forward", [&](auto y_) {
      using Y = decltype(y_);
      swiglu_fwd<S, Y>(N, F, x.ptr<S>(), y.ptr<Y>());
    });
  });
}
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  int64_t F = dy.dim(-1), N = dy.numel() / F;
  MT_CHECK(x.numel() == 2 * dy.numel() && dx.numel() == x.numel(), "swiglu_backward: sizes");
  check_bwd_dtypes(x.dtype(), dy.dtype(), dx.dtype(), "swiglu_backward");
  storage_types(x.dtype(), [&](auto s_) {
    using S = decltype(s_);
    swiglu_bwd<S>(N, F, x.ptr<S>(), dy.ptr<S>(), dx.ptr<S>());
  });
}

}  // namespace mt::kernels::cpu
