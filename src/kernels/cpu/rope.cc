#include "kernels/rope.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {
namespace {

// S: qkv's stored type; T = compute_t<S>, the tables' type.
// Pair i is (x[i], x[i + half]), or (x[2i], x[2i + 1]) interleaved.
template <typename S, typename T>
void rotate(S* x, const T* c, const T* s, int64_t half, bool inverse, bool interleaved) {
  T sg = inverse ? T(-1) : T(1);
  const int64_t step = interleaved ? 2 : 1, off = interleaved ? 1 : half;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    S* p1 = x + i * step;
    S* p2 = p1 + off;
    T x1 = ld<T>(*p1), x2 = ld<T>(*p2), sn = sg * s[i];
    *p1 = to_out<S>(x1 * c[i] - x2 * sn);
    *p2 = to_out<S>(x2 * c[i] + x1 * sn);
  }
}

template <typename S, typename T = compute_t<S>>
void apply(S* qkv, const QkvLayout& L, int64_t rot_dim, const T* cos, const T* sin, bool inverse, bool interleaved) {
  const int64_t half = rot_dim / 2, row = L.row();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.tokens(); ++r) {
    int64_t t = r / L.batch;
    const T* c = cos + t * half;
    const T* s = sin + t * half;
    S* x = qkv + r * row;
    for (int64_t h = 0; h < L.heads; ++h) rotate(x + L.q_col(h), c, s, half, inverse, interleaved);
    for (int64_t g = 0; g < L.groups; ++g) rotate(x + L.k_col(g), c, s, half, inverse, interleaved);
  }
}

}  // namespace

void rope_table(const RopeSpec& spec, int64_t seq, const Tensor& cos, const Tensor& sin) {
  MT_CHECK(spec.rot_dim > 0 && spec.rot_dim % 2 == 0, "rope: the rotated dimension must be even and positive");
  const int64_t half = spec.rot_dim / 2;
  MT_CHECK(cos.numel() >= seq * half && sin.numel() >= seq * half, "rope_table: tables too small");
  float_types(cos.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    fill_rope_table<T>(spec, seq, cos.ptr<T>(), sin.ptr<T>());
  });
}

void rope_apply(const Tensor& qkv, const QkvLayout& L, int64_t rot_dim, const Tensor& cos, const Tensor& sin,
                bool inverse, bool interleaved) {
  L.check();
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "rope: qkv size does not match the layout");
  MT_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= L.head_dim, "rope: rotated dims must be even, in (0, head_dim]");
  MT_CHECK(cos.numel() >= L.seq * rot_dim / 2 && sin.numel() >= L.seq * rot_dim / 2, "rope: table too small");
  storage_types(qkv.dtype(), [&](auto s_) {
    using S = decltype(s_);
    using T = compute_t<S>;
    MT_CHECK(cos.dtype() == dtype_of<T>() && sin.dtype() == dtype_of<T>(),
             fmt::format("rope: cos/sin tables must be {} for {} qkv (got {}, {})", dtype_name(dtype_of<T>()),
                         dtype_name(qkv.dtype()), dtype_name(cos.dtype()), dtype_name(sin.dtype())));
    apply<S>(qkv.ptr<S>(), L, rot_dim, cos.ptr<T>(), sin.ptr<T>(), inverse, interleaved);
  });
}

void qk_heads_copy(const Tensor& qkv, const QkvLayout& L, const Tensor& heads, bool to_heads) {
  check_qk_heads(qkv, L, heads);
  const size_t esize = dtype_size(qkv.dtype()), span = static_cast<size_t>(L.head_dim) * esize;
  char* x = static_cast<char*>(qkv.data());
  char* hq = static_cast<char*>(heads.data());
  char* hk = hq + static_cast<size_t>(L.tokens() * L.heads) * span;
  const size_t row = static_cast<size_t>(L.row()) * esize;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.tokens(); ++r) {
    char* xr = x + static_cast<size_t>(r) * row;
    for (int64_t h = 0; h < L.heads + L.groups; ++h) {
      char* col = xr + static_cast<size_t>(h < L.heads ? L.q_col(h) : L.k_col(h - L.heads)) * esize;
      char* hr = h < L.heads ? hq + static_cast<size_t>(r * L.heads + h) * span
                             : hk + static_cast<size_t>(r * L.groups + h - L.heads) * span;
      if (to_heads) std::memcpy(hr, col, span);
      else std::memcpy(col, hr, span);
    }
  }
}

}  // namespace mt::kernels::cpu
