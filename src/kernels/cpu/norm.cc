#include "kernels/norm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {
namespace {

// sum_c f(c) for c < C in double, in a fixed order that vectorises: lane k
// of kLanes adds the terms c = k mod kLanes in ascending c, and the lanes
// are then added pairwise (k + w into k, w = kLanes / 2 .. 1). One serial
// double sum waits on the add latency for every term; the lanes are
// independent chains the compiler keeps in vector registers. The order
// depends only on C, not on the vector width the build targets.
constexpr int kLanes = 32;
template <typename F>
inline double lane_sum(int64_t C, F f) {
  double acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes) {
#pragma omp simd
    for (int k = 0; k < kLanes; ++k) acc[k] += f(c + k);
  }
  for (int k = 0; c + k < C; ++k) acc[k] += f(c + k);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

template <typename T, typename X, typename Y>
void ln_fwd(int64_t N, int64_t C, const X* x, const T* w, const T* b, T eps, Y* y, T* mean, T* rstd,
            bool rms) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const X* xi = x + i * C;
    Y* yi = y + i * C;
    // Accumulate in double for fp32 too: a cheap guard for wide rows. The
    // row is read from cache by the second sum (and the output loop).
    double m = 0;
    if (!rms) m = lane_sum(C, [&](int64_t c) { return static_cast<double>(ld<T>(xi[c])); }) / static_cast<double>(C);
    const double v = lane_sum(C, [&](int64_t c) {
                       const double d = static_cast<double>(ld<T>(xi[c])) - m;
                       return d * d;
                     }) /
                     static_cast<double>(C);
    T mu = static_cast<T>(m), r = static_cast<T>(1.0 / std::sqrt(v + static_cast<double>(eps)));
    if (b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yi[c] = to_out<Y>((ld<T>(xi[c]) - mu) * r * w[c] + b[c]);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yi[c] = to_out<Y>((ld<T>(xi[c]) - mu) * r * w[c]);
    }
    if (mean) mean[i] = mu;
    rstd[i] = r;
  }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (LayerNorm);
// RMSNorm drops the mean(g) term and uses xhat = x * rstd. x and dx are
// stored as X, dy as D (T, or bf16 for T = float); a bf16 dx is rounded once
// per call (dx + the term, in T).
template <typename T, typename X, typename D>
void ln_bwd(int64_t N, int64_t C, const D* dy, const X* x, const T* w, const T* mean, const T* rstd, X* dx,
            T* dw, T* db, bool rms) {
  int nt = omp_get_max_threads();
  std::vector<T> part(static_cast<size_t>(nt) * 2 * C, T(0));
#pragma omp parallel
  {
    T* pdw = part.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    T* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const D* dyi = dy + i * C;
      const X* xi = x + i * C;
      X* dxi = dx + i * C;
      T mu = rms ? T(0) : mean[i], r = rstd[i];
      T sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int64_t c = 0; c < C; ++c) {
        T xh = (ld<T>(xi[c]) - mu) * r;
        T d = ld<T>(dyi[c]);
        T g = d * w[c];
        sum_g += g;
        sum_gx += g * xh;
        pdw[c] += d * xh;
        pdb[c] += d;
      }
      T mg = rms ? T(0) : sum_g / static_cast<T>(C), mgx = sum_gx / static_cast<T>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        T xh = (ld<T>(xi[c]) - mu) * r;
        dxi[c] = to_out<X>(ld<T>(dxi[c]) + r * (ld<T>(dyi[c]) * w[c] - mg - xh * mgx));
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const T* pdw = part.data() + static_cast<size_t>(t) * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      dw[c] += pdw[c];
      if (db) db[c] += pdw[C + c];
    }
  }
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd) {
  int64_t C = x.dim(-1), N = x.numel() / C;
  MT_CHECK(w.numel() == C && y.numel() == x.numel() && rstd.numel() >= N && mean.numel() >= N,
           "layernorm_forward: shapes");
  norm_fwd_types(x.dtype(), w.dtype(), y.dtype(), "layernorm_forward", [&](auto t_, auto x_, auto y_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using Y = decltype(y_);
    ln_fwd<T, X, Y>(N, C, x.ptr<X>(), w.ptr<T>(), opt_ptr<T>(b), static_cast<T>(eps), y.ptr<Y>(), mean.ptr<T>(),
                    rstd.ptr<T>(), false);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  int64_t C = x.dim(-1), N = x.numel() / C;
  MT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dw.numel() == C, "layernorm_backward: shapes");
  norm_bwd_types(dy.dtype(), x.dtype(), w.dtype(), dx.dtype(), "layernorm_backward", [&](auto t_, auto x_, auto d_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using D = decltype(d_);
    ln_bwd<T, X, D>(N, C, dy.ptr<D>(), x.ptr<X>(), w.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(), dx.ptr<X>(),
                    dw.ptr<T>(), opt_ptr<T>(db), false);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) {
  int64_t C = x.dim(-1), N = x.numel() / C;
  MT_CHECK(w.numel() == C && y.numel() == x.numel() && rstd.numel() >= N, "rmsnorm_forward: shapes");
  norm_fwd_types(x.dtype(), w.dtype(), y.dtype(), "rmsnorm_forward", [&](auto t_, auto x_, auto y_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using Y = decltype(y_);
    ln_fwd<T, X, Y>(N, C, x.ptr<X>(), w.ptr<T>(), nullptr, static_cast<T>(eps), y.ptr<Y>(), nullptr, rstd.ptr<T>(),
                    true);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw) {
  int64_t C = x.dim(-1), N = x.numel() / C;
  MT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dw.numel() == C, "rmsnorm_backward: shapes");
  norm_bwd_types(dy.dtype(), x.dtype(), w.dtype(), dx.dtype(), "rmsnorm_backward", [&](auto t_, auto x_, auto d_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using D = decltype(d_);
    ln_bwd<T, X, D>(N, C, dy.ptr<D>(), x.ptr<X>(), w.ptr<T>(), nullptr, rstd.ptr<T>(), dx.ptr<X>(), dw.ptr<T>(),
                    nullptr, true);
  });
}

}  // namespace mt::kernels::cpu
