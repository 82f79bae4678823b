// CUDA twins of kernels/cpu/rope.cc: rotary position embedding on the fused
// QKV buffer (kernels/rope.h, kernels/qkv_layout.h), fp32, fp64 or bf16.
//
// rope_table: computed on the HOST by the CPU twin's own fill_rope_table
// (double std::pow, std::cos, std::sin of the same glibc), then copied to
// the device: the tables are bitwise the CPU's, which CUDA's own pow/sin/cos
// (up to 2 ulp) could not promise. It runs once per model, [T, r/2] values.
//
// rope_apply: grid-stride loop, one thread per W rotated pairs: item
// e = (r * (heads + groups) + h) * (half / W) + i / W, for token row r, rotated
// head h (q heads 0..heads-1, then one k head per group), pairs i .. i + W - 1
// < half = rot_dim/2 (the dims from rot_dim to d pass through untouched).
// The thread reads x[i..] and x[i + half..] of its head and writes both, so
// no two threads touch the same element; v is never touched. Token row r has
// position t = r / batch (rows in [s, b] order). W is a 16-byte Pack of
// qkv's type (8 bf16, 4 fp32) when half, d and the pointers allow, else 1;
// the per-element arithmetic is the same either way. Interleaved
// (--rotary-interleaved): one thread per pair (2i, 2i + 1), element by element.
#include <cmath>
#include <vector>

#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/rope.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

// S: qkv's stored type; T = compute_t<S>, the tables' type. Item e is W
// consecutive pairs i .. i + W - 1 (i = (e % (half / W)) * W) of rotated head
// h of token row r (W = 1: one pair; W > 1: Packs, half % W == 0).
// Column of rotated head h (q heads 0..heads-1, then one k head per group)
// within a token row (QkvLayout::q_col / k_col); head counts: 32-bit division.
__device__ __forceinline__ int64_t rotated_head_col(int64_t h, int64_t heads, int64_t hpg, int64_t d) {
  const int hh = static_cast<int>(h), nh = static_cast<int>(heads), hp = static_cast<int>(hpg);
  return (hh < nh ? (hh / hp) * (hp + 2) + hh % hp : (hh - nh) * (hp + 2) + hp) * d;
}

// --rotary-interleaved: item e is pair i = e % half, dims (2i, 2i + 1).
template <typename S, typename T = compute_t<S>>
__global__ void rope_rotate_interleaved(int64_t items, int64_t half, int64_t nrot, int64_t heads, int64_t hpg,
                                        int64_t d, int64_t row, int64_t batch, S* qkv, const T* __restrict__ cos,
                                        const T* __restrict__ sin, T sg) {
  for (int64_t e = gs_begin(); e < items; e += gs_stride()) {
    int64_t rest, i, r, h, t, b;
    divmod(e, half, rest, i);
    divmod(rest, nrot, r, h);
    divmod(r, batch, t, b);
    S* x = qkv + r * row + rotated_head_col(h, heads, hpg, d) + 2 * i;
    const T c = cos[t * half + i], s_k = sg * sin[t * half + i];
    const T x1 = ld<T>(x[0]), x2 = ld<T>(x[1]);
    x[0] = to_out<S>(x1 * c - x2 * s_k);
    x[1] = to_out<S>(x2 * c + x1 * s_k);
  }
}

template <int W, typename S, typename T = compute_t<S>>
__global__ void rope_rotate(int64_t items, int64_t half, int64_t nrot, int64_t heads, int64_t hpg, int64_t d,
                            int64_t row, int64_t batch, S* qkv, const T* __restrict__ cos, const T* __restrict__ sin,
                            T sg) {
  const int64_t hw = half / W;
  for (int64_t e = gs_begin(); e < items; e += gs_stride()) {
    int64_t rest, iw, r, h, t, b;
    divmod(e, hw, rest, iw);
    divmod(rest, nrot, r, h);
    divmod(r, batch, t, b);
    const int64_t i = iw * W;
    S* x = qkv + r * row + rotated_head_col(h, heads, hpg, d);
    const Pack<T, W> c = ld_pack<W>(cos + t * half + i), sn = ld_pack<W>(sin + t * half + i);
    const Pack<S, W> a = ld_pack<W>(x + i), bb = ld_pack<W>(x + i + half);
    Pack<S, W> o1, o2;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const T s_k = sg * sn.v[k];
      const T x1 = ld<T>(a.v[k]), x2 = ld<T>(bb.v[k]);
      o1.v[k] = to_out<S>(x1 * c.v[k] - x2 * s_k);
      o2.v[k] = to_out<S>(x2 * c.v[k] + x1 * s_k);
    }
    st_pack<W>(x + i, o1);
    st_pack<W>(x + i + half, o2);
  }
}

// qk_heads_copy: item e is one element of `heads` (see kernels/rope.h):
// e < tokens * heads * d is q head (e / d) % heads of token e / (heads d),
// the rest k of group ... of token ...; to_heads copies qkv -> heads.
template <typename S>
__global__ void qk_heads_copy_k(int64_t n_q, int64_t n, int64_t heads, int64_t groups, int64_t hpg, int64_t d,
                                int64_t row, S* qkv, S* out, bool to_heads) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    const bool q = e < n_q;
    const int64_t per = (q ? heads : groups);
    int64_t rest, t, r, h;
    divmod(q ? e : e - n_q, d, rest, t);
    divmod(rest, per, r, h);
    S* x = qkv + r * row + rotated_head_col(q ? h : heads + h, heads, hpg, d) + t;
    if (to_heads) out[e] = *x;
    else *x = out[e];
  }
}

}  // namespace

void qk_heads_copy(const Tensor& qkv, const QkvLayout& L, const Tensor& heads, bool to_heads) {
  check_qk_heads(qkv, L, heads);
  check_on_gpu({&qkv, &heads}, "qk_heads_copy");
  const int64_t n_q = L.tokens() * L.heads * L.head_dim, n = L.tokens() * (L.heads + L.groups) * L.head_dim;
  if (n == 0) return;
  storage_types(qkv.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    qk_heads_copy_k<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
        n_q, n, L.heads, L.groups, L.heads_per_group(), L.head_dim, L.row(), qkv.ptr<S>(), heads.ptr<S>(), to_heads);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void rope_table(const RopeSpec& spec, int64_t seq, const Tensor& cos, const Tensor& sin) {
  MT_CHECK(spec.rot_dim > 0 && spec.rot_dim % 2 == 0, "rope: the rotated dimension must be even and positive");
  const int64_t half = spec.rot_dim / 2;
  MT_CHECK(cos.numel() >= seq * half && sin.numel() >= seq * half, "rope_table: tables too small");
  check_on_gpu({&cos, &sin}, "rope_table");
  float_types(cos.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const int64_t n = seq * half;
    if (n <= 0) return;
    std::vector<T> hc(static_cast<size_t>(n)), hs(static_cast<size_t>(n));
    fill_rope_table<T>(spec, seq, hc.data(), hs.data());  // the CPU twin's table, bit for bit
    ::mt::cuda::copy_h2d(cos.ptr<T>(), hc.data(), sizeof(T) * static_cast<size_t>(n));
    ::mt::cuda::copy_h2d(sin.ptr<T>(), hs.data(), sizeof(T) * static_cast<size_t>(n));
  });
}

void rope_apply(const Tensor& qkv, const QkvLayout& L, int64_t rot_dim, const Tensor& cos, const Tensor& sin,
                bool inverse, bool interleaved) {
  L.check();
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "rope: qkv size does not match the layout");
  MT_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= L.head_dim, "rope: rotated dims must be even, in (0, head_dim]");
  MT_CHECK(cos.numel() >= L.seq * rot_dim / 2 && sin.numel() >= L.seq * rot_dim / 2, "rope: table too small");
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
    const int64_t half = rot_dim / 2, nrot = L.heads + L.groups;
    const int64_t n = L.tokens() * nrot * half;
    if (n == 0) return;
    const T sg = inverse ? T(-1) : T(1);
    constexpr int W = kVec<S>;
    if (interleaved) {
      rope_rotate_interleaved<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
          n, half, nrot, L.heads, L.heads_per_group(), L.head_dim, L.row(), L.batch, x, cp, sp, sg);
    } else if (half % W == 0 && L.head_dim % W == 0 && packs_fit(pack_align<S, W>(), {x}) && packs_fit(pack_align<T, W>(), {cp, sp})) {
      rope_rotate<W, S><<<grid_for(n / W), kThreads, 0, ::mt::cuda::stream()>>>(
          n / W, half, nrot, L.heads, L.heads_per_group(), L.head_dim, L.row(), L.batch, x, cp, sp, sg);
    } else {
      rope_rotate<1, S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
          n, half, nrot, L.heads, L.heads_per_group(), L.head_dim, L.row(), L.batch, x, cp, sp, sg);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
