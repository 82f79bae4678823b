// CUDA twins of kernels/cpu/elementwise.cc: bias add and gradient, adds,
// casts, scaling, seeded dropout, sum of squares (kernels/elementwise.h has
// the contract).
//
// Elementwise ops (bias_add, add, cast, scale_inplace, dropout): grid-stride
// loops, int64 indices; each element is read and written by one thread, so
// y may alias an input. add and cast move 16-byte Packs per step when the
// pointers are aligned (pointwise_common.cuh), then the last n % W elements
// one by one; the others take one element per step.
// add with mixed fp32/bf16 operands (the bf16 residual stream): each
//   operand widened exactly, the fp32 sum rounded once to y's type, as the
//   CPU twin does; Packs of 8 elements when every pointer allows.
// bias_grad (ACCUMULATES): one thread per column c, db[c] += dy[i, c] for
//   i = 0..N-1 in order, exactly the CPU twin's order: bitwise the CPU's.
// cast: every pair of fp32/fp64/bf16; into bf16 through float with
//   round-to-nearest-even exactly like mt::float_to_bf16 (double -> float ->
//   bf16, as the CPU twin does). bf16 -> bf16 copies the bits.
// dropout: the CPU twin's Philox call, philox_uniform(seed, stream,
//   i + index_offset) >= float(p) keeps x * T(1/(1-p)): the same mask bits.
// sum_squares: double throughout. Pass 1: min(ceil(n / kThreads), kMaxPartials)
//   blocks grid-stride over x, each thread summing x^2 in double, block_sum
//   (fixed tree) to partial[block]. Pass 2: one block adds the partials in a
//   fixed order. The block count depends only on n, so the result does not
//   change from run to run. The partials live in a __device__ array of this
//   file (per device); a mutex keeps two host threads from sharing it.
// sum_squares_each: the same two passes per tensor, each total into its slot
//   of an op-scratch array, then one copy of all totals to the host (one wait
//   for the stream instead of one per tensor).
// count_zeros_each: sum_squares_each's passes adding 1 per element with
//   x * scale == 0 in T (exact in double below 2^53 elements).
#include <algorithm>
#include <mutex>
#include <type_traits>

#include "core/cuda/check.cuh"
#include "core/rng.h"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/elementwise.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

constexpr int kMaxPartials = 1024;
// partial[0..blocks) from pass 1; partial[kMaxPartials] holds the total.
__device__ double g_sumsq_partials[kMaxPartials + 1];
std::mutex g_sumsq_mu;

// y (dy) stored as S, the bias (gradient) in T = compute_t<S>.
template <typename S, typename T = compute_t<S>>
__global__ void bias_add_k(int64_t n, int64_t C, S* y, const T* __restrict__ b) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t r, c;
    divmod(e, C, r, c);
    y[e] = to_out<S>(ld<T>(y[e]) + b[c]);
  }
}

// One thread per column; rows in order.
template <typename S, typename T = compute_t<S>>
__global__ void bias_grad_k(int64_t N, int64_t C, const S* __restrict__ dy, T* __restrict__ db) {
  const int64_t c = gs_begin();
  if (c >= C) return;
  T acc = db[c];
  for (int64_t i = 0; i < N; ++i) acc += ld<T>(dy[i * C + c]);
  db[c] = acc;
}

// y's stored type S (fp32, fp64 or bf16) with the bias in compute_t<S>.
template <typename S>
void check_bias_dtype(const Tensor& y, const Tensor& b, const char* op) {
  MT_CHECK(b.dtype() == dtype_of<compute_t<S>>(),
           fmt::format("{}: the bias must be {} for {} activations (got {})", op, dtype_name(dtype_of<compute_t<S>>()),
                       dtype_name(y.dtype()), dtype_name(b.dtype())));
}

template <typename T>
__global__ void add_k(int64_t n, const T* a, const T* b, T* y) {
  constexpr int W = kVec<T>;
  const int64_t packs = n / W;
  for (int64_t e = gs_begin(); e < packs; e += gs_stride()) {
    const Pack<T, W> pa = ld_pack<W>(a + e * W), pb = ld_pack<W>(b + e * W);
    Pack<T, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = pa.v[k] + pb.v[k];
    st_pack<W>(y + e * W, o);
  }
  for (int64_t e = packs * W + gs_begin(); e < n; e += gs_stride()) y[e] = a[e] + b[e];
}
// The same sum one element per step (pointers not 16-byte aligned).
template <typename T>
__global__ void add_k1(int64_t n, const T* a, const T* b, T* y) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) y[e] = a[e] + b[e];
}

// Mixed fp32/bf16 sums (the bf16 residual stream): each operand widened
// to fp32, the sum rounded once to y's type; W elements per step (16-byte
// Packs of the narrowest operand), then the last n % W one by one.
template <int W, typename SA, typename SB, typename SY>
__global__ void add_mixed_k(int64_t n, const SA* a, const SB* b, SY* y) {
  const int64_t packs = W > 1 ? n / W : 0;
  for (int64_t e = gs_begin(); e < packs; e += gs_stride()) {
    const Pack<SA, W> pa = ld_pack<W>(a + e * W);
    const Pack<SB, W> pb = ld_pack<W>(b + e * W);
    Pack<SY, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = to_out<SY>(ld<float>(pa.v[k]) + ld<float>(pb.v[k]));
    st_pack<W>(y + e * W, o);
  }
  for (int64_t e = packs * W + gs_begin(); e < n; e += gs_stride())
    y[e] = to_out<SY>(ld<float>(a[e]) + ld<float>(b[e]));
}

template <typename S, typename D>
__device__ __forceinline__ D cast_one(S v) {
  if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, bf16>) {
    return v;
  } else if constexpr (std::is_same_v<S, bf16>) {
    return static_cast<D>(float_from_bf16_bits(v.bits));
  } else if constexpr (std::is_same_v<D, bf16>) {
    return bf16{bf16_bits_from_float(static_cast<float>(v))};
  } else {
    return static_cast<D>(v);
  }
}

// Elements of a cast Pack: 16 bytes of the narrower type.
template <typename S, typename D>
inline constexpr int kCastW = kVec<S> > kVec<D> ? kVec<S> : kVec<D>;

// W elements per step (Packs, then the last n % W one by one); W = 1 when the
// pointers are not aligned for Packs.
template <int W, typename S, typename D>
__global__ void cast_k(int64_t n, const S* __restrict__ s, D* __restrict__ d) {
  const int64_t packs = W > 1 ? n / W : 0;
  for (int64_t e = gs_begin(); e < packs; e += gs_stride()) {
    const Pack<S, W> in = ld_pack<W>(s + e * W);
    Pack<D, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = cast_one<S, D>(in.v[k]);
    st_pack<W>(d + e * W, o);
  }
  for (int64_t e = packs * W + gs_begin(); e < n; e += gs_stride()) d[e] = cast_one<S, D>(s[e]);
}

template <typename T>
__global__ void scale_k(int64_t n, T* y, T f) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) y[e] *= f;
}

// x, y stored as S, computed in T = compute_t<S> (bf16 rounded once).
template <typename S, typename T = compute_t<S>>
__global__ void dropout_k(int64_t n, const S* x, S* y, float pf, T scale, uint64_t seed, uint64_t stream,
                          uint64_t off) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride())
    y[e] = to_out<S>(philox_uniform(seed, stream, static_cast<uint64_t>(e) + off) >= pf ? ld<T>(x[e]) * scale : T(0));
}

// jitter: the CPU twin's multiplier (philox_jitter: lo + width u fused), in T.
template <typename S, typename T = compute_t<S>>
__global__ void jitter_k(int64_t n, const S* x, S* y, T lo, T width, uint64_t seed, uint64_t stream, uint64_t off) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride())
    y[e] = to_out<S>(ld<T>(x[e]) * philox_jitter(lo, width, seed, stream, static_cast<uint64_t>(e) + off));
}

template <typename T>
__global__ void sumsq_pass1(int64_t n, const T* __restrict__ x, double* partial, bool zeros, T scale) {
  double s = 0;
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    if (zeros) {
      s += x[e] * scale == T(0) ? 1.0 : 0.0;
    } else {
      const double v = static_cast<double>(x[e]);
      s += v * v;
    }
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: out = sum of partial[0..count) in a fixed order.
__global__ void sumsq_pass2(int count, const double* partial, double* out) {
  double s = 0;
  for (int j = threadIdx.x; j < count; j += blockDim.x) s += partial[j];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

template <typename S, typename D>
void launch_cast(const S* s, D* d, int64_t n) {
  if (n == 0) return;
  constexpr int W = kCastW<S, D>;
  if (packs_fit(std::max(pack_align<S, W>(), pack_align<D, W>()), {s, d})) {
    cast_k<W, S, D><<<grid_for(std::max<int64_t>(n / W, 1)), kThreads, 0, ::mt::cuda::stream()>>>(n, s, d);
  } else {
    cast_k<1, S, D><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, s, d);
  }
  MT_CUDA_CHECK_LAUNCH();
}

template <typename S>
void cast_from(const S* s, const Tensor& dst, int64_t n) {
  switch (dst.dtype()) {
    case DType::kF32: launch_cast(s, dst.ptr<float>(), n); break;
    case DType::kF64: launch_cast(s, dst.ptr<double>(), n); break;
    case DType::kBF16: launch_cast(s, dst.ptr<bf16>(), n); break;
    default: MT_CHECK(false, "cast: unsupported destination dtype");
  }
}

}  // namespace

void bias_add(const Tensor& y, const Tensor& b) {
  const int64_t C = b.numel(), N = C == 0 ? 0 : y.numel() / C;
  MT_CHECK(y.numel() == N * C, "bias_add: shapes");
  check_on_gpu({&y, &b}, "bias_add");
  storage_types(y.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    using T = compute_t<S>;
    check_bias_dtype<S>(y, b, "bias_add");
    S* yp = y.ptr<S>();
    const T* bp = b.ptr<T>();
    const int64_t n = N * C;
    if (n == 0) return;
    bias_add_k<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, yp, bp);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void bias_grad(const Tensor& dy, const Tensor& db) {
  const int64_t C = db.numel(), N = C == 0 ? 0 : dy.numel() / C;
  MT_CHECK(dy.numel() == N * C, "bias_grad: shapes");
  check_on_gpu({&dy, &db}, "bias_grad");
  storage_types(dy.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    using T = compute_t<S>;
    check_bias_dtype<S>(dy, db, "bias_grad");
    const S* d = dy.ptr<S>();
    T* o = db.ptr<T>();
    if (N == 0 || C == 0) return;
    bias_grad_k<S><<<::mt::cuda::blocks_for(C, kThreads), kThreads, 0, ::mt::cuda::stream()>>>(N, C, d, o);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& y) {
  check_same_numel(a, y, "add");
  check_same_numel(b, y, "add");
  check_on_gpu({&a, &b, &y}, "add");
  if (a.dtype() != y.dtype() || b.dtype() != y.dtype() || y.dtype() == DType::kBF16) {
    // Mixed fp32/bf16 (the CPU twin's dtype rules and messages).
    f32_bf16_types(a.dtype(), "add", "a", [&](auto at_) {
      using SA = decltype(at_);
      f32_bf16_types(b.dtype(), "add", "b", [&](auto bt_) {
        using SB = decltype(bt_);
        f32_bf16_types(y.dtype(), "add", "y", [&](auto yt_) {
          using SY = decltype(yt_);
          const SA* ap = a.ptr<SA>();
          const SB* bp = b.ptr<SB>();
          SY* yp = y.ptr<SY>();
          const int64_t n = y.numel();
          if (n == 0) return;
          constexpr int W = 8;  // 16 bytes of bf16, 32 of fp32
          const size_t al = std::max({pack_align<SA, W>(), pack_align<SB, W>(), pack_align<SY, W>()});
          if (packs_fit(al, {ap, bp, yp}))
            add_mixed_k<W, SA, SB, SY><<<grid_for(std::max<int64_t>(n / W, 1)), kThreads, 0, ::mt::cuda::stream()>>>(n, ap, bp, yp);
          else
            add_mixed_k<1, SA, SB, SY><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, ap, bp, yp);
          MT_CUDA_CHECK_LAUNCH();
        });
      });
    });
    return;
  }
  float_types(y.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T *ap = a.ptr<T>(), *bp = b.ptr<T>();
    T* yp = y.ptr<T>();
    const int64_t n = y.numel();
    if (n == 0) return;
    constexpr int W = kVec<T>;
    if (packs_fit(pack_align<T, W>(), {ap, bp, yp})) {
      add_k<T><<<grid_for(std::max<int64_t>(n / W, 1)), kThreads, 0, ::mt::cuda::stream()>>>(n, ap, bp, yp);
    } else {
      add_k1<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, ap, bp, yp);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

void add_inplace(const Tensor& y, const Tensor& x) { add(y, x, y); }

void cast(const Tensor& src, const Tensor& dst) {
  check_same_numel(src, dst, "cast");
  check_on_gpu({&src, &dst}, "cast");
  switch (src.dtype()) {
    case DType::kF32: cast_from(src.ptr<float>(), dst, src.numel()); break;
    case DType::kF64: cast_from(src.ptr<double>(), dst, src.numel()); break;
    case DType::kBF16: cast_from(src.ptr<bf16>(), dst, src.numel()); break;
    default: MT_CHECK(false, "cast: unsupported source dtype");
  }
}

void scale_inplace(const Tensor& y, double s) {
  check_on_gpu({&y}, "scale_inplace");
  float_types(y.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    T* p = y.ptr<T>();
    const T f = static_cast<T>(s);
    const int64_t n = y.numel();
    if (n == 0) return;
    scale_k<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, p, f);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void jitter(const Tensor& x, const Tensor& y, double eps, uint64_t seed, uint64_t stream, uint64_t off) {
  check_same_numel(x, y, "jitter");
  MT_CHECK(eps >= 0 && eps < 1, "jitter: eps must be in [0, 1)");
  check_on_gpu({&x, &y}, "jitter");
  MT_CHECK(x.dtype() == y.dtype(), fmt::format("jitter: x and y must share one dtype (got {}, {})",
                                               dtype_name(x.dtype()), dtype_name(y.dtype())));
  storage_types(y.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    using T = compute_t<S>;
    const int64_t n = y.numel();
    if (n == 0) return;
    jitter_k<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, x.ptr<S>(), y.ptr<S>(), static_cast<T>(1.0 - eps),
                                                                   static_cast<T>(2.0 * eps), seed, stream, off);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void dropout(const Tensor& x, const Tensor& y, double p, uint64_t seed, uint64_t stream, uint64_t off) {
  check_same_numel(x, y, "dropout");
  MT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1)");
  check_on_gpu({&x, &y}, "dropout");
  MT_CHECK(x.dtype() == y.dtype(), fmt::format("dropout: x and y must share one dtype (got {}, {})",
                                               dtype_name(x.dtype()), dtype_name(y.dtype())));
  storage_types(y.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    using T = compute_t<S>;
    const S* xp = x.ptr<S>();
    S* yp = y.ptr<S>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const float pf = static_cast<float>(p);
    const int64_t n = y.numel();
    if (n == 0) return;
    if (p == 0) {
      if (xp != yp) ::mt::cuda::copy_d2d(yp, xp, sizeof(S) * static_cast<size_t>(n));
    } else {
      dropout_k<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, xp, yp, pf, scale, seed, stream, off);
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

namespace {
// Queues the two passes of x's sum of squares (zeros: of its count of zero
// elements, exact in double), the total into *out (device); the caller holds
// g_sumsq_mu (pass 1's partials are one buffer).
void queue_sum_squares(const Tensor& x, double* out, bool zeros = false, double scale = 1.0) {
  double* partial = nullptr;
  MT_CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&partial), g_sumsq_partials));
  float_types(x.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T* p = x.ptr<T>();
    const int64_t n = x.numel();
    const unsigned blocks = std::min<unsigned>(::mt::cuda::blocks_for(n, kThreads), kMaxPartials);
    sumsq_pass1<T><<<blocks, kThreads, 0, ::mt::cuda::stream()>>>(n, p, partial, zeros, static_cast<T>(scale));
    MT_CUDA_CHECK_LAUNCH();
    sumsq_pass2<<<1, kThreads, 0, ::mt::cuda::stream()>>>(static_cast<int>(blocks), partial, out);
    MT_CUDA_CHECK_LAUNCH();
  });
}
}  // namespace

double sum_squares(const Tensor& x) {
  check_on_gpu({&x}, "sum_squares");
  double total = 0;
  if (x.numel() == 0) return total;
  std::lock_guard<std::mutex> lock(g_sumsq_mu);
  double* partial = nullptr;
  MT_CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&partial), g_sumsq_partials));
  queue_sum_squares(x, partial + kMaxPartials);
  ::mt::cuda::copy_d2h(&total, partial + kMaxPartials, sizeof(double));  // waits for the stream
  return total;
}

namespace {
// One total per tensor of xs (sum of squares, or with `zeros` the count of
// x * scale == 0), all queued, then one copy to the host (one wait).
std::vector<double> totals_each(const std::vector<Tensor>& xs, const char* what, bool zeros, double scale) {
  for (const Tensor& x : xs) check_on_gpu({&x}, what);
  std::vector<double> out(xs.size(), 0.0);
  if (xs.empty()) return out;
  const size_t bytes = xs.size() * sizeof(double);
  std::lock_guard<std::mutex> lock(g_sumsq_mu);
  double* totals = static_cast<double*>(::mt::cuda::op_scratch(what, bytes));
  ::mt::cuda::memset_zero(totals, bytes);  // empty tensors total 0
  for (size_t i = 0; i < xs.size(); ++i)
    if (xs[i].numel() > 0) queue_sum_squares(xs[i], totals + i, zeros, scale);
  ::mt::cuda::copy_d2h(out.data(), totals, bytes);  // the one wait
  return out;
}
}  // namespace

std::vector<double> sum_squares_each(const std::vector<Tensor>& xs) {
  return totals_each(xs, "sum_squares_each", /*zeros=*/false, 1.0);
}

std::vector<int64_t> count_zeros_each(const std::vector<Tensor>& xs, double scale) {
  const std::vector<double> totals = totals_each(xs, "count_zeros_each", /*zeros=*/true, scale);
  return std::vector<int64_t>(totals.begin(), totals.end());  // whole numbers, exact in double
}

}  // namespace mt::kernels::cuda
