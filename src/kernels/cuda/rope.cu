// CUDA twins of kernels/cpu/rope.cc: rotary position embedding on the fused
// QKV buffer (kernels/rope.h, kernels/qkv_layout.h), fp32, fp64 or bf16.
//
// rope_table: computed on the HOST with the CPU twin's exact double
// arithmetic (std::pow, std::cos, std::sin of the same glibc), then copied to
// the device: the tables are bitwise the CPU's, which CUDA's own pow/sin/cos
// (up to 2 ulp) could not promise. It runs once per model, [T, d/2] values.
//
// rope_apply: grid-stride loop, one thread per rotated pair: item
// e = (r * (heads + groups) + h) * half + i, for token row r, rotated head h
// (q heads 0..heads-1, then one k head per group), pair index i < d/2. The
// thread reads x[i] and x[i + half] of its head and writes both, so no two
// threads touch the same element; v is never touched. Token row r has
// position t = r / batch (rows in [s, b] order).
#include <cmath>
#include <vector>

#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/rope.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

// S: qkv's stored type; T = compute_t<S>, the tables' type.
template <typename S, typename T = compute_t<S>>
__global__ void rope_rotate(int64_t n, int64_t half, int64_t nrot, int64_t heads, int64_t hpg, int64_t d,
                            int64_t row, int64_t batch, S* qkv, const T* __restrict__ cos, const T* __restrict__ sin,
                            T sg) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    const int64_t i = e % half, rest = e / half;
    const int64_t h = rest % nrot, r = rest / nrot;
    // Column of the head within the row (QkvLayout::q_col / k_col).
    const int64_t col = h < heads ? ((h / hpg) * (hpg + 2) + h % hpg) * d : ((h - heads) * (hpg + 2) + hpg) * d;
    const int64_t t = r / batch;
    S* x = qkv + r * row + col;
    const T c = cos[t * half + i], sn = sg * sin[t * half + i];
    const T x1 = ld<T>(x[i]), x2 = ld<T>(x[i + half]);
    x[i] = to_out<S>(x1 * c - x2 * sn);
    x[i + half] = to_out<S>(x2 * c + x1 * sn);
  }
}

}  // namespace

void rope_table(double base, int64_t seq, int64_t head_dim, const Tensor& cos, const Tensor& sin) {
  MT_CHECK(head_dim % 2 == 0, "rope: head_dim must be even");
  const int64_t half = head_dim / 2;
  MT_CHECK(cos.numel() >= seq * half && sin.numel() >= seq * half, "rope_table: tables too small");
  check_on_gpu({&cos, &sin}, "rope_table");
  float_types(cos.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    T* cp = cos.ptr<T>();
    T* sp = sin.ptr<T>();
    const int64_t n = seq * half;
    if (n <= 0) return;
    std::vector<T> hc(static_cast<size_t>(n)), hs(static_cast<size_t>(n));
    // The CPU twin's loop, expression for expression.
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t i = 0; i < half; ++i) {
        double inv = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
        double a = static_cast<double>(t) * inv;
        hc[static_cast<size_t>(t * half + i)] = static_cast<T>(std::cos(a));
        hs[static_cast<size_t>(t * half + i)] = static_cast<T>(std::sin(a));
      }
    ::mt::cuda::copy_h2d(cp, hc.data(), sizeof(T) * static_cast<size_t>(n));
    ::mt::cuda::copy_h2d(sp, hs.data(), sizeof(T) * static_cast<size_t>(n));
  });
}

void rope_apply(const Tensor& qkv, const QkvLayout& L, const Tensor& cos, const Tensor& sin, bool inverse) {
  L.check();
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "rope: qkv size does not match the layout");
  MT_CHECK(L.head_dim % 2 == 0 && cos.numel() >= L.seq * L.head_dim / 2, "rope: table too small");
  check_on_gpu({&qkv, &cos, &sin}, "rope_apply");
  storage_types(qkv.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    using T = compute_t<S>;
    MT_CHECK(cos.dtype() == dtype_of<T>() && sin.dtype() == dtype_of<T>(),
             fmt::format("rope: cos/sin tables must be {} for {} qkv (got {}, {})", dtype_name(dtype_of<T>()),
                         dtype_name(qkv.dtype()), dtype_name(cos.dtype()), dtype_name(sin.dtype())));
    S* x = qkv.ptr<S>();
    const T* cp = cos.ptr<T>();
    const T* sp = sin.ptr<T>();
    const int64_t half = L.head_dim / 2, nrot = L.heads + L.groups;
    const int64_t n = L.tokens() * nrot * half;
    if (n == 0) return;
    rope_rotate<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
        n, half, nrot, L.heads, L.heads_per_group(), L.head_dim, L.row(), L.batch, x, cp, sp,
        inverse ? T(-1) : T(1));
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
