#pragma once
// Rotary position embedding, Megatron's default (non-interleaved, "rotate
// half"): for each q and k head vector x, the leading r = rot_dim of its d
// dims rotate (r = d unless --rotary-percent < 1; the rest pass through),
// positions t:
//   inv_freq_i = base^(-2i/r'), i < r/2;  angle = (t / interp) * inv_freq_i
//   (r' = Megatron's int(d * rotary_percent), r = r' rounded up to even)
//   y[i]       = x[i] cos - x[i+r/2] sin
//   y[i+r/2]   = x[i+r/2] cos + x[i] sin
// (megatron/core/models/common/embeddings/rotary_pos_embedding.py:
//  emb = cat(freqs, freqs); x*cos + rotate_half(x)*sin, rotate_half = cat(-x2, x1),
//  on t[..., :rot_dim] with t[..., rot_dim:] passed through).
// --rotary-interleaved pairs dims 2i and 2i+1 instead (emb = freqs each
// repeated twice, rotate_half = stack(-x[1::2], x[::2])).
// --use-rope-scaling rescales inv_freq as Llama 3.1 does (factor
// --rope-scaling-factor, low/high frequency factors 1 and 4, original
// context 8192): wavelengths above 8192 are divided by the factor, below
// 2048 kept, and in between interpolated smoothly.
// Applied in place on the fused QKV buffer (kernels/qkv_layout.h); v is left
// alone. Backward is the inverse rotation applied in place to dQKV.
// qkv fp32, fp64 or bf16 (bf16 rotates in fp32 and rounds once as stored).
// cos/sin tables: [T, r/2] in the compute dtype (fp32 for fp32 and bf16 qkv,
// fp64 for fp64), made by rope_table on the host in double arithmetic (so
// the CPU and CUDA tables are the same bits).
// Context parallel later passes the table rows of its own positions.

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "kernels/dispatch.h"
#include "kernels/qkv_layout.h"

namespace mt::kernels {

// How Megatron's RotaryEmbedding is configured.
struct RopeSpec {
  double base = 10000;          // --rotary-base
  int64_t rot_dim = 0;          // int(d * --rotary-percent): leading dims rotated (even)
  bool llama3_scaling = false;  // --use-rope-scaling
  double scaling_factor = 8;    // --rope-scaling-factor
  double interpolation = 1;     // --rotary-seq-len-interpolation-factor: positions are divided by it
  // Megatron's dim = int(d * --rotary-percent), the frequencies' denominator;
  // 0: rot_dim. An odd dim gives ceil(dim/2) frequencies, so dim + 1 dims rotate.
  int64_t freq_dim = 0;
  // YaRN (Megatron's YarnRotaryEmbedding, multi-latent attention's default):
  // inv_freq_i = inter_i (1 - m_i) + extra_i m_i with extra_i = base^(-2i/dim),
  // inter_i = extra_i / yarn_factor, m_i = 1 - clamp((i - lo) / (hi - lo), 0, 1),
  // lo = floor(c(beta_fast)), hi = ceil(c(beta_slow)) clamped to [0, dim - 1],
  // c(r) = dim ln(yarn_original / (2 pi r)) / (2 ln base).
  bool yarn = false;
  double yarn_factor = 1, yarn_original = 4096, beta_fast = 32, beta_slow = 1;
  // cos and sin are multiplied by this (YaRN's concentration factor, as
  // Megatron's apply_rotary_pos_emb(mscale=...)); 1 otherwise.
  double mscale = 1;
};

// inv_freq_i for i < rot_dim/2, in double (Megatron computes the same in fp32).
inline std::vector<double> rope_inv_freq(const RopeSpec& s) {
  const int64_t half = s.rot_dim / 2;
  const double denom = static_cast<double>(s.freq_dim ? s.freq_dim : s.rot_dim);
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(s.base, static_cast<double>(2 * i) / denom);
    if (s.llama3_scaling) {
      constexpr double kOld = 8192, kLow = 1, kHigh = 4;  // original context, low/high frequency factors
      const double wavelen = 2 * M_PI / inv;
      if (wavelen > kOld / kLow) {
        inv /= s.scaling_factor;
      } else if (!(wavelen < kOld / kHigh)) {
        const double smooth = (kOld / wavelen - kLow) / (kHigh - kLow);
        inv = (1 - smooth) * inv / s.scaling_factor + smooth * inv;
      }
    }
    f[static_cast<size_t>(i)] = inv;
  }
  if (s.yarn && s.yarn_factor != 1) {  // (factor 1: the blend of equal frequencies, exactly these)
    const double dim = denom;
    auto corr = [&](double rot) { return dim * std::log(s.yarn_original / (rot * 2 * M_PI)) / (2 * std::log(s.base)); };
    const double lo = std::max(std::floor(corr(s.beta_fast)), 0.0);
    double hi = std::min(std::ceil(corr(s.beta_slow)), dim - 1);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0), m = 1 - ramp;
      double& x = f[static_cast<size_t>(i)];
      x = x / s.yarn_factor * (1 - m) + x * m;
    }
  }
  return f;
}

// Row t of the [seq, rot_dim/2] tables: cos and sin of (t / interpolation) * inv_freq,
// each rounded once to T. Both twins fill their tables with this.
template <typename T>
void fill_rope_table(const RopeSpec& s, int64_t seq, T* cos, T* sin) {
  const std::vector<double> inv = rope_inv_freq(s);
  const int64_t half = s.rot_dim / 2;
  for (int64_t t = 0; t < seq; ++t) {
    const double pos = static_cast<double>(t) * (1.0 / s.interpolation);
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv[static_cast<size_t>(i)];
      cos[t * half + i] = static_cast<T>(std::cos(a) * s.mscale);
      sin[t * half + i] = static_cast<T>(std::sin(a) * s.mscale);
    }
  }
}

// The shapes and dtypes both qk_heads_copy twins require (kernels/rope.h below).
inline void check_qk_heads(const Tensor& qkv, const QkvLayout& L, const Tensor& heads) {
  L.check();
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "qk_heads_copy: qkv size does not match the layout");
  MT_CHECK(heads.numel() == L.tokens() * (L.heads + L.groups) * L.head_dim,
           fmt::format("qk_heads_copy: heads has {} elements, expected tokens x (heads + groups) x d = {}",
                       heads.numel(), L.tokens() * (L.heads + L.groups) * L.head_dim));
  MT_CHECK(qkv.dtype() == heads.dtype(), "qk_heads_copy: qkv and heads must have one dtype");
}

namespace cpu {
void rope_table(const RopeSpec& spec, int64_t seq, const Tensor& cos, const Tensor& sin);
void rope_apply(const Tensor& qkv, const QkvLayout& layout, int64_t rot_dim, const Tensor& cos, const Tensor& sin,
                bool inverse, bool interleaved);
void qk_heads_copy(const Tensor& qkv, const QkvLayout& layout, const Tensor& heads, bool to_heads);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/rope.cu), on the rank's stream.
namespace cuda {
void rope_table(const RopeSpec& spec, int64_t seq, const Tensor& cos, const Tensor& sin);
void rope_apply(const Tensor& qkv, const QkvLayout& layout, int64_t rot_dim, const Tensor& cos, const Tensor& sin,
                bool inverse, bool interleaved);
void qk_heads_copy(const Tensor& qkv, const QkvLayout& layout, const Tensor& heads, bool to_heads);
}  // namespace cuda
#endif

inline void rope_table(const RopeSpec& spec, int64_t seq, const Tensor& cos, const Tensor& sin) {
  MT_DISPATCH(rope_table, cos.device(), spec, seq, cos, sin);
}
// Megatron's default table: base, the whole head dimension rotated.
inline void rope_table(double base, int64_t seq, int64_t head_dim, const Tensor& cos, const Tensor& sin) {
  rope_table(RopeSpec{base, head_dim}, seq, cos, sin);
}
// rot_dim 0: the whole head dimension. interleaved (--rotary-interleaved):
// pair i is dims (2i, 2i + 1) instead of (i, i + r/2).
inline void rope_forward(const Tensor& qkv, const QkvLayout& l, const Tensor& cos, const Tensor& sin, int64_t rot_dim = 0,
                         bool interleaved = false) {
  MT_DISPATCH(rope_apply, qkv.device(), qkv, l, rot_dim ? rot_dim : l.head_dim, cos, sin, false, interleaved);
}
inline void rope_backward(const Tensor& dqkv, const QkvLayout& l, const Tensor& cos, const Tensor& sin, int64_t rot_dim = 0,
                          bool interleaved = false) {
  MT_DISPATCH(rope_apply, dqkv.device(), dqkv, l, rot_dim ? rot_dim : l.head_dim, cos, sin, true, interleaved);
}

// The query and key heads of the fused QKV buffer as contiguous head rows,
// for --qk-layernorm (a norm over each head's d values, one weight for the q
// heads and one for the k heads): `heads` holds tokens x (heads + groups)
// rows of d, every token's q heads first as one [tokens * heads, d] block,
// then its k heads as a [tokens * groups, d] block:
//   q head j of token r:   heads row r * heads + j
//   k of group j, token r: heads row tokens * heads + r * groups + j
// gather copies qkv's q and k columns into `heads`; scatter writes them back
// (v is never read or written). One dtype on both sides; a plain copy.
inline void qk_heads_gather(const Tensor& qkv, const QkvLayout& l, const Tensor& heads) {
  MT_DISPATCH(qk_heads_copy, qkv.device(), qkv, l, heads, true);
}
inline void qk_heads_scatter(const Tensor& heads, const QkvLayout& l, const Tensor& qkv) {
  MT_DISPATCH(qk_heads_copy, qkv.device(), qkv, l, heads, false);
}

}  // namespace mt::kernels
