#include "kernels/rope.h"

#include <cmath>

#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {
namespace {

template <typename T>
void rotate(T* x, const T* c, const T* s, int64_t half, bool inverse) {
  T sg = inverse ? T(-1) : T(1);
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    T x1 = x[i], x2 = x[i + half], sn = sg * s[i];
    x[i] = x1 * c[i] - x2 * sn;
    x[i + half] = x2 * c[i] + x1 * sn;
  }
}

template <typename T>
void apply(T* qkv, const QkvLayout& L, const T* cos, const T* sin, bool inverse) {
  const int64_t half = L.head_dim / 2, row = L.row();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.tokens(); ++r) {
    int64_t t = r / L.batch;
    const T* c = cos + t * half;
    const T* s = sin + t * half;
    T* x = qkv + r * row;
    for (int64_t h = 0; h < L.heads; ++h) rotate(x + L.q_col(h), c, s, half, inverse);
    for (int64_t g = 0; g < L.groups; ++g) rotate(x + L.k_col(g), c, s, half, inverse);
  }
}

}  // namespace

void rope_table(double base, int64_t seq, int64_t head_dim, const Tensor& cos, const Tensor& sin) {
  MT_CHECK(head_dim % 2 == 0, "rope: head_dim must be even");
  const int64_t half = head_dim / 2;
  MT_CHECK(cos.numel() >= seq * half && sin.numel() >= seq * half, "rope_table: tables too small");
  float_types(cos.dtype(), [&](auto tag_) { using T = decltype(tag_);
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t i = 0; i < half; ++i) {
        double inv = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
        double a = static_cast<double>(t) * inv;
        cos.ptr<T>()[t * half + i] = static_cast<T>(std::cos(a));
        sin.ptr<T>()[t * half + i] = static_cast<T>(std::sin(a));
      }
  });
}

void rope_apply(const Tensor& qkv, const QkvLayout& L, const Tensor& cos, const Tensor& sin, bool inverse) {
  L.check();
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "rope: qkv size does not match the layout");
  MT_CHECK(L.head_dim % 2 == 0 && cos.numel() >= L.seq * L.head_dim / 2, "rope: table too small");
  MT_FLOAT_TYPES(qkv.dtype(), T, apply<T>(qkv.ptr<T>(), L, cos.ptr<T>(), sin.ptr<T>(), inverse));
}

}  // namespace mt::kernels::cpu
