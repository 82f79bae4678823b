// CUDA twins of kernels/cpu/activation.cc: GELU (exact and tanh) and SwiGLU,
// forward and backward, stored in fp32, fp64 or bf16 (bf16 computes in fp32;
// kernels/activation.h has the contract; backward WRITES dx).
//
// Launch: elementwise grid-stride loops (kThreads per block, int64 indices),
// no reductions. Each thread evaluates the CPU twin's formula for its
// element in T, in the same operation order; erf/exp/tanh are CUDA's libm
// (fp32: within 2 ulp; the CPU twin's fp32 erf/exp are 1-ulp polynomials),
// so fp32 results agree with the CPU to a few ulp, not bitwise.
// SwiGLU element e of y [N, F] is row i = e / F, column j = e % F, reading
// gate x[i, j] and up x[i, F + j]. SwiGLU moves 16-byte Packs (8 bf16, 4
// fp32) per thread when F and the pointers allow (pointwise_common.cuh),
// with the same per-element formula: the packed and element-wise launches
// give the same bits.
#include <algorithm>

#include "core/cuda/check.cuh"
#include "kernels/activation.h"
#include "kernels/cuda/pointwise_common.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

__device__ __forceinline__ float erf_t(float x) { return erff(x); }
__device__ __forceinline__ double erf_t(double x) { return erf(x); }
__device__ __forceinline__ float tanh_t(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_t(double x) { return tanh(x); }

// S: the stored type of x (and of dy, dx in backward); T = compute_t<S>.
template <typename S, typename Y>
__global__ void gelu_fwd(GeluKind kind, int64_t n, const S* x, Y* y) {
  using T = compute_t<S>;
  for (int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const T xi = ld<T>(x[i]);
    if (kind == GeluKind::kExact) {
      y[i] = to_out<Y>(T(0.5) * xi * (T(1) + erf_t(xi * T(kInvSqrt2))));
    } else if (kind == GeluKind::kSquaredRelu) {
      const T r = xi > T(0) ? xi : T(0);
      y[i] = to_out<Y>(r * r);
    } else {
      const T u = T(kSqrt2OverPi) * (xi + T(0.044715) * xi * xi * xi);
      y[i] = to_out<Y>(T(0.5) * xi * (T(1) + tanh_t(u)));
    }
  }
}

template <typename S>
__global__ void gelu_bwd(GeluKind kind, int64_t n, const S* x, const S* dy, S* dx) {
  using T = compute_t<S>;
  for (int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const T xi = ld<T>(x[i]), d = ld<T>(dy[i]);
    if (kind == GeluKind::kSquaredRelu) {
      const T r = xi > T(0) ? xi : T(0);
      dx[i] = to_out<S>(d * (T(2) * r));
    } else if (kind == GeluKind::kExact) {
      const T cdf = T(0.5) * (T(1) + erf_t(xi * T(kInvSqrt2)));
      const T pdf = T(kInvSqrt2Pi) * exp_t(T(-0.5) * xi * xi);
      dx[i] = to_out<S>(d * (cdf + xi * pdf));
    } else {
      const T x2 = xi * xi;
      const T u = T(kSqrt2OverPi) * (xi + T(0.044715) * x2 * xi);
      const T th = tanh_t(u);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x2);
      dx[i] = to_out<S>(d * (T(0.5) * (T(1) + th) + T(0.5) * xi * (T(1) - th * th) * du));
    }
  }
}

// The SwiGLU formulas of one element (the CPU twin's operation order).
template <typename T>
__device__ __forceinline__ T swiglu_value(T g, T u) {
  return g / (T(1) + exp_t(-g)) * u;
}
// d gate and d up of one element from gate g, up u and dy d.
template <typename T>
__device__ __forceinline__ void swiglu_grads(T g, T u, T d, T& dg, T& du) {
  const T s = T(1) / (T(1) + exp_t(-g));
  const T silu = g * s;
  du = d * silu;
  dg = d * u * (s + silu * (T(1) - s));
}

// y [N, F] = silu(gate) * up, x [N, 2F] = [gate | up]. Item e of the
// grid-stride loop is W consecutive outputs: row i = e / (F / W), columns
// j .. j + W - 1 (W = 1: one element; W > 1: Packs, F % W == 0).
template <int W, typename S, typename Y>
__global__ void swiglu_fwd(int64_t items, int64_t F, const S* x, Y* y) {
  using T = compute_t<S>;
  const int64_t Fw = F / W;
  for (int64_t e = gs_begin(); e < items; e += gs_stride()) {
    int64_t i, jw;
    divmod(e, Fw, i, jw);
    const int64_t j = jw * W;
    const Pack<S, W> g = ld_pack<W>(x + i * 2 * F + j), u = ld_pack<W>(x + i * 2 * F + F + j);
    Pack<Y, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = to_out<Y>(swiglu_value(ld<T>(g.v[k]), ld<T>(u.v[k])));
    st_pack<W>(y + e * W, o);
  }
}

// dx [N, 2F] = [d gate | d up]; one thread writes both halves of its items
// (W of them, as in swiglu_fwd).
template <int W, typename S>
__global__ void swiglu_bwd(int64_t items, int64_t F, const S* x, const S* dy, S* dx) {
  using T = compute_t<S>;
  const int64_t Fw = F / W;
  for (int64_t e = gs_begin(); e < items; e += gs_stride()) {
    int64_t i, jw;
    divmod(e, Fw, i, jw);
    const int64_t gi = i * 2 * F + jw * W, ui = gi + F;
    const Pack<S, W> g = ld_pack<W>(x + gi), u = ld_pack<W>(x + ui), d = ld_pack<W>(dy + e * W);
    Pack<S, W> dg, du;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      T a, b;
      swiglu_grads(ld<T>(g.v[k]), ld<T>(u.v[k]), ld<T>(d.v[k]), a, b);
      dg.v[k] = to_out<S>(a);
      du.v[k] = to_out<S>(b);
    }
    // Every read above precedes both writes: dx may alias x.
    st_pack<W>(dx + ui, du);
    st_pack<W>(dx + gi, dg);
  }
}

// W for SwiGLU: a 16-byte Pack of S when F and every pointer allow it, else 1.
template <typename S>
int swiglu_width(int64_t F, size_t align, std::initializer_list<const void*> ps) {
  constexpr int W = kVec<S>;
  return F % W == 0 && packs_fit(align, ps) ? W : 1;
}

}  // namespace

void gelu_forward(GeluKind k, const Tensor& x, const Tensor& y) {
  MT_CHECK(x.numel() == y.numel(), "gelu_forward: sizes");
  check_on_gpu({&x, &y}, "gelu_forward");
  storage_types(x.dtype(), [&](auto stag_) {
    using S = decltype(stag_);
    out_types<compute_t<S>>(y.dtype(), "gelu_forward", [&](auto ytag_) {
      using Y = decltype(ytag_);
      const S* xp = x.ptr<S>();
      Y* yp = y.ptr<Y>();
      const int64_t n = x.numel();
      if (n == 0) return;
      gelu_fwd<S, Y><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(k, n, xp, yp);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void gelu_backward(GeluKind k, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  MT_CHECK(x.numel() == dy.numel() && x.numel() == dx.numel(), "gelu_backward: sizes");
  check_on_gpu({&x, &dy, &dx}, "gelu_backward");
  check_bwd_dtypes(x.dtype(), dy.dtype(), dx.dtype(), "gelu_backward");
  storage_types(x.dtype(), [&](auto stag_) {
    using S = decltype(stag_);
    const S *xp = x.ptr<S>(), *dyp = dy.ptr<S>();
    S* dxp = dx.ptr<S>();
    const int64_t n = x.numel();
    if (n == 0) return;
    gelu_bwd<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(k, n, xp, dyp, dxp);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_forward(const Tensor& x, const Tensor& y) {
  int64_t F = y.dim(-1), N = F == 0 ? 0 : y.numel() / F;
  MT_CHECK(x.numel() == 2 * y.numel() && x.dim(-1) == 2 * F, "swiglu_forward: x must be [N, 2F], y [N, F]");
  check_on_gpu({&x, &y}, "swiglu_forward");
  storage_types(x.dtype(), [&](auto stag_) {
    using S = decltype(stag_);
    out_types<compute_t<S>>(y.dtype(), "swiglu_forward", [&](auto ytag_) {
      using Y = decltype(ytag_);
      const S* xp = x.ptr<S>();
      Y* yp = y.ptr<Y>();
      const int64_t n = N * F;
      if (n == 0) return;
      constexpr int W = kVec<S>;
      if (swiglu_width<S>(F, std::max(pack_align<S, W>(), pack_align<Y, W>()), {xp, yp}) == W) {
        swiglu_fwd<W, S, Y><<<grid_for(n / W), kThreads, 0, ::mt::cuda::stream()>>>(n / W, F, xp, yp);
      } else {
        swiglu_fwd<1, S, Y><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, F, xp, yp);
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  int64_t F = dy.dim(-1), N = F == 0 ? 0 : dy.numel() / F;
  MT_CHECK(x.numel() == 2 * dy.numel() && dx.numel() == x.numel(), "swiglu_backward: sizes");
  check_on_gpu({&x, &dy, &dx}, "swiglu_backward");
  check_bwd_dtypes(x.dtype(), dy.dtype(), dx.dtype(), "swiglu_backward");
  storage_types(x.dtype(), [&](auto stag_) {
    using S = decltype(stag_);
    const S *xp = x.ptr<S>(), *dyp = dy.ptr<S>();
    S* dxp = dx.ptr<S>();
    const int64_t n = N * F;
    if (n == 0) return;
    constexpr int W = kVec<S>;
    if (swiglu_width<S>(F, pack_align<S, W>(), {xp, dyp, dxp}) == W) {
      swiglu_bwd<W, S><<<grid_for(n / W), kThreads, 0, ::mt::cuda::stream()>>>(n / W, F, xp, dyp, dxp);
    } else {
      swiglu_bwd<1, S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, F, xp, dyp, dxp);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
