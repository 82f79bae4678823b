#include "kernels/elementwise.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {

// y's stored type S (fp32, fp64 or bf16) with the bias in compute_t<S>.
template <typename S>
void check_bias_dtype(const Tensor& y, const Tensor& b, const char* op) {
  MT_CHECK(b.dtype() == dtype_of<compute_t<S>>(),
           fmt::format("{}: the bias must be {} for {} activations (got {})", op, dtype_name(dtype_of<compute_t<S>>()),
                       dtype_name(y.dtype()), dtype_name(b.dtype())));
}

void bias_add(const Tensor& y, const Tensor& b) {
  const int64_t C = b.numel(), N = y.numel() / C;
  MT_CHECK(y.numel() == N * C, "bias_add: shapes");
  storage_types(y.dtype(), [&](auto tag_) { using S = decltype(tag_); using T = compute_t<S>;
    check_bias_dtype<S>(y, b, "bias_add");
    S* yp = y.ptr<S>();
    const T* bp = b.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i)
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yp[i * C + c] = to_out<S>(ld<T>(yp[i * C + c]) + bp[c]);
  });
}

void bias_grad(const Tensor& dy, const Tensor& db) {
  const int64_t C = db.numel(), N = dy.numel() / C;
  MT_CHECK(dy.numel() == N * C, "bias_grad: shapes");
  storage_types(dy.dtype(), [&](auto tag_) { using S = decltype(tag_); using T = compute_t<S>;
    check_bias_dtype<S>(dy, db, "bias_grad");
    const S* d = dy.ptr<S>();
    T* o = db.ptr<T>();
    constexpr int64_t kChunk = 256;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t c1 = std::min(C, c0 + kChunk);
      for (int64_t i = 0; i < N; ++i)
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) o[c] += ld<T>(d[i * C + c]);
    }
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& y) {
  check_same_numel(a, y, "add");
  check_same_numel(b, y, "add");
  if (a.dtype() == y.dtype() && b.dtype() == y.dtype() && y.dtype() != DType::kBF16 && y.dtype() != DType::kF16) {
    float_types(y.dtype(), [&](auto tag_) { using T = decltype(tag_);
      const T *ap = a.ptr<T>(), *bp = b.ptr<T>();
      T* yp = y.ptr<T>();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < y.numel(); ++i) yp[i] = ap[i] + bp[i];
    });
    return;
  }
  // Mixed fp32/bf16/fp16 (the 16-bit residual stream): the fp32 sum, rounded once.
  f32_bf16_types(a.dtype(), "add", "a", [&](auto at_) { using SA = decltype(at_);
    f32_bf16_types(b.dtype(), "add", "b", [&](auto bt_) { using SB = decltype(bt_);
      f32_bf16_types(y.dtype(), "add", "y", [&](auto yt_) { using SY = decltype(yt_);
        const SA* ap = a.ptr<SA>();
        const SB* bp = b.ptr<SB>();
        SY* yp = y.ptr<SY>();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < y.numel(); ++i) yp[i] = to_out<SY>(ld<float>(ap[i]) + ld<float>(bp[i]));
      });
    });
  });
}

void add_inplace(const Tensor& y, const Tensor& x) { add(y, x, y); }

namespace {
template <typename S, typename D>
void cast_loop(const S* s, D* d, int64_t n) {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, f16>) return f16_round_n(s, d, n);
  if constexpr (std::is_same_v<S, f16> && std::is_same_v<D, float>) return f16_widen_n(s, d, n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<S, D>) {
      d[i] = s[i];  // bit copy (16-bit -> 16-bit must not go through the float value)
    } else if constexpr (is_half_v<S> || is_half_v<D>) {
      d[i] = to_out<D>(ld<float>(s[i]));  // widened exactly, rounded once
    } else {
      d[i] = static_cast<D>(s[i]);
    }
  }
}
template <typename S>
void cast_from(const S* s, const Tensor& dst, int64_t n) {
  switch (dst.dtype()) {
    case DType::kF32: cast_loop(s, dst.ptr<float>(), n); break;
    case DType::kF64: cast_loop(s, dst.ptr<double>(), n); break;
    case DType::kBF16: cast_loop(s, dst.ptr<bf16>(), n); break;
    case DType::kF16: cast_loop(s, dst.ptr<f16>(), n); break;
    default: MT_CHECK(false, "cast: unsupported destination dtype");
  }
}
}  // namespace

void cast(const Tensor& src, const Tensor& dst) {
  check_same_numel(src, dst, "cast");
  switch (src.dtype()) {
    case DType::kF32: cast_from(src.ptr<float>(), dst, src.numel()); break;
    case DType::kF64: cast_from(src.ptr<double>(), dst, src.numel()); break;
    case DType::kBF16: cast_from(src.ptr<bf16>(), dst, src.numel()); break;
    case DType::kF16: cast_from(src.ptr<f16>(), dst, src.numel()); break;
    default: MT_CHECK(false, "cast: unsupported source dtype");
  }
}

void scale_inplace(const Tensor& y, double s) {
  float_types(y.dtype(), [&](auto tag_) { using T = decltype(tag_);
    T* p = y.ptr<T>();
    const T f = static_cast<T>(s);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < y.numel(); ++i) p[i] *= f;
  });
}

void dropout(const Tensor& x, const Tensor& y, double p, uint64_t seed, uint64_t stream, uint64_t off) {
  check_same_numel(x, y, "dropout");
  MT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1)");
  MT_CHECK(x.dtype() == y.dtype(), fmt::format("dropout: x and y must share one dtype (got {}, {})",
                                               dtype_name(x.dtype()), dtype_name(y.dtype())));
  storage_types(y.dtype(), [&](auto tag_) { using S = decltype(tag_); using T = compute_t<S>;
    const S* xp = x.ptr<S>();
    S* yp = y.ptr<S>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const float pf = static_cast<float>(p);
    const int64_t n = y.numel();
    if (p == 0) {
      if (xp != yp)
        for (int64_t i = 0; i < n; ++i) yp[i] = xp[i];
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i)
        yp[i] = to_out<S>(philox_uniform(seed, stream, static_cast<uint64_t>(i) + off) >= pf ? ld<T>(xp[i]) * scale
                                                                                             : T(0));
    }
  });
}

void jitter(const Tensor& x, const Tensor& y, double eps, uint64_t seed, uint64_t stream, uint64_t off) {
  check_same_numel(x, y, "jitter");
  MT_CHECK(eps >= 0 && eps < 1, "jitter: eps must be in [0, 1)");
  MT_CHECK(x.dtype() == y.dtype(), fmt::format("jitter: x and y must share one dtype (got {}, {})",
                                               dtype_name(x.dtype()), dtype_name(y.dtype())));
  storage_types(y.dtype(), [&](auto tag_) { using S = decltype(tag_); using T = compute_t<S>;
    const S* xp = x.ptr<S>();
    S* yp = y.ptr<S>();
    const T lo = static_cast<T>(1.0 - eps), width = static_cast<T>(2.0 * eps);
    const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      yp[i] = to_out<S>(ld<T>(xp[i]) * philox_jitter(lo, width, seed, stream, static_cast<uint64_t>(i) + off));
  });
}

double sum_squares(const Tensor& x) {
  // Fixed-size chunks summed in index order: the result does not depend on
  // the thread count or on the order threads finish (an OpenMP reduction
  // would), which bitwise-exact resume and parallel-invariance need.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  float_types(x.dtype(), [&](auto tag_) { using T = decltype(tag_);
    const T* p = x.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      for (int64_t i = c * kChunk, e = std::min(n, (c + 1) * kChunk); i < e; ++i)
        s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
      partial[c] = s;
    }
  });
  double total = 0;
  for (double v : partial) total += v;
  return total;
}

std::vector<double> sum_squares_each(const std::vector<Tensor>& xs) {
  std::vector<double> out;
  out.reserve(xs.size());
  for (const Tensor& x : xs) out.push_back(sum_squares(x));
  return out;
}

std::vector<int64_t> count_zeros_each(const std::vector<Tensor>& xs, double scale) {
  std::vector<int64_t> out;
  out.reserve(xs.size());
  for (const Tensor& x : xs) {
    int64_t zeros = 0;
    float_types(x.dtype(), [&](auto tag_) {
      using T = decltype(tag_);
      const T* p = x.ptr<T>();
      const T s = static_cast<T>(scale);
      const int64_t n = x.numel();
#pragma omp parallel for reduction(+ : zeros) schedule(static)
      for (int64_t i = 0; i < n; ++i) zeros += p[i] * s == T(0);
    });
    out.push_back(zeros);
  }
  return out;
}

}  // namespace mt::kernels::cpu
