#include "kernels/kv_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {
namespace {

void check(const Tensor& qkv, const QkvLayout& L, const Tensor& kc, const Tensor& vc, int64_t pos) {
  L.check();
  MT_CHECK(L.batch == 1, "kv_attention: one sequence (batch 1)");
  MT_CHECK(qkv.numel() == L.seq * L.row(), "kv_attention: qkv must be [n, (a+2g)d]");
  MT_CHECK(kc.ndim() == 3 && kc.dim(1) == L.groups && kc.dim(2) == L.head_dim && vc.shape() == kc.shape(),
           "kv_attention: caches must be [T_max, g, d]");
  MT_CHECK(pos >= 0 && pos + L.seq <= kc.dim(0),
           fmt::format("kv_attention: positions [{}, {}) outside the cache's {}", pos, pos + L.seq, kc.dim(0)));
  MT_CHECK(qkv.dtype() == kc.dtype() && kc.dtype() == vc.dtype(), "kv_attention: dtypes differ");
}

template <typename T>
void append(const T* qkv, const QkvLayout& L, int64_t pos, T* kc, T* vc) {
  const int64_t D = L.head_dim, G = L.groups;
  for (int64_t i = 0; i < L.seq; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const T* src = qkv + i * L.row();
      std::copy(src + L.k_col(g), src + L.k_col(g) + D, kc + ((pos + i) * G + g) * D);
      std::copy(src + L.v_col(g), src + L.v_col(g) + D, vc + ((pos + i) * G + g) * D);
    }
}

template <typename T>
void attend(const T* qkv, const QkvLayout& L, const T* kc, const T* vc, int64_t pos, double scale_d, T* out) {
  const int64_t n = L.seq, H = L.heads, G = L.groups, D = L.head_dim, qpg = L.heads_per_group();
  const T scale = static_cast<T>(scale_d);
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(pos + n));
    T q[kAttnMaxHeadDim];
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = h / qpg, last = pos + i;  // keys 0..last
        const T* qs = qkv + i * L.row() + L.q_col(h);
        for (int64_t c = 0; c < D; ++c) q[c] = qs[c] * scale;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= last; ++j) {
          const T* kj = kc + (j * G + g) * D;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < D; ++c) dot += q[c] * kj[c];
          s[static_cast<size_t>(j)] = dot;
          mx = std::max(mx, dot);
        }
        T* o = out + i * H * D + h * D;
        std::fill(o, o + D, T(0));
        T sum = 0;
        for (int64_t j = 0; j <= last; ++j) {
          const T p = std::exp(s[static_cast<size_t>(j)] - mx);
          sum += p;
          const T* vj = vc + (j * G + g) * D;
#pragma omp simd
          for (int64_t c = 0; c < D; ++c) o[c] += p * vj[c];
        }
        const T inv = T(1) / sum;
        for (int64_t c = 0; c < D; ++c) o[c] *= inv;
      }
  }
}

}  // namespace

void kv_cache_append(const Tensor& qkv, const QkvLayout& L, int64_t pos, const Tensor& kc, const Tensor& vc) {
  check(qkv, L, kc, vc, pos);
  MT_FLOAT_TYPES(qkv.dtype(), T, append<T>(qkv.ptr<T>(), L, pos, kc.ptr<T>(), vc.ptr<T>()));
}

void kv_attention(const Tensor& qkv, const QkvLayout& L, const Tensor& kc, const Tensor& vc, int64_t pos,
                  double scale, const Tensor& out) {
  check(qkv, L, kc, vc, pos);
  MT_CHECK(out.numel() == L.seq * L.heads * L.head_dim && out.dtype() == qkv.dtype(),
           "kv_attention: out must be [n, a*d] in qkv's dtype");
  MT_CHECK(L.head_dim <= kAttnMaxHeadDim, "kv_attention: head_dim above the kernel's limit");
  float_types(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    attend<T>(qkv.ptr<T>(), L, kc.ptr<T>(), vc.ptr<T>(), pos, scale, out.ptr<T>());
  });
}

}  // namespace mt::kernels::cpu
