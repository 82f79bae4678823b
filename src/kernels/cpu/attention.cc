#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/rng.h"
#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {
namespace {

constexpr int64_t BQ = kAttnTileQ, BK = kAttnTileK;

template <typename A> inline A load(float v) { return static_cast<A>(v); }
template <typename A> inline A load(double v) { return static_cast<A>(v); }
template <typename A> inline A load(bf16 v) { return static_cast<A>(bf16_to_float(v)); }

// Dropout keep decision and the element's global index.
inline bool keep(const AttentionOptions& o, int64_t b, int64_t head, int64_t T, int64_t i, int64_t j) {
  uint64_t idx = ((static_cast<uint64_t>(b) << 20 | static_cast<uint64_t>(o.head_offset + head)) *
                      static_cast<uint64_t>(T) + static_cast<uint64_t>(i)) * static_cast<uint64_t>(T) +
                 static_cast<uint64_t>(j);
  return philox_uniform(o.seed, o.stream, idx) >= static_cast<float>(o.dropout);
}

template <typename Tin, typename A>
void load_tile(const Tin* qkv, int64_t row, int64_t B, int64_t b, int64_t col, int64_t t0, int64_t n, int64_t D,
               A* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const Tin* src = qkv + ((t0 + r) * B + b) * row + col;
    for (int64_t c = 0; c < D; ++c) dst[r * D + c] = load<A>(src[c]);
  }
}

template <typename Tin, typename A>
void fwd(const Tin* qkv, const QkvLayout& L, const AttentionOptions& o, A* out, A* lse) {
  const int64_t T = L.seq, B = L.batch, H = L.heads, D = L.head_dim, row = L.row(), qpg = L.heads_per_group();
  const int64_t nq = (T + BQ - 1) / BQ;
  const A scale = static_cast<A>(o.scale);
  const bool drop = o.dropout > 0;
  const A inv_keep = drop ? static_cast<A>(1.0 / (1.0 - o.dropout)) : A(1);
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t qt = 0; qt < nq; ++qt) {
        alignas(64) A q[BQ * kAttnMaxHeadDim], acc[BQ * kAttnMaxHeadDim], k[BK * kAttnMaxHeadDim],
            v[BK * kAttnMaxHeadDim], s[BQ * BK], m[BQ], l[BQ];
        const int64_t g = h / qpg, i0 = qt * BQ, nqr = std::min(BQ, T - i0);
        load_tile(qkv, row, B, b, L.q_col(h), i0, nqr, D, q);
        for (int64_t x = 0; x < nqr * D; ++x) q[x] *= scale;
        std::fill(acc, acc + nqr * D, A(0));
        std::fill(m, m + nqr, -std::numeric_limits<A>::infinity());
        std::fill(l, l + nqr, A(0));
        const int64_t last = i0 + nqr - 1;
        for (int64_t j0 = 0; j0 <= last; j0 += BK) {
          const int64_t nk = std::min(BK, last + 1 - j0);
          load_tile(qkv, row, B, b, L.k_col(g), j0, nk, D, k);
          load_tile(qkv, row, B, b, L.v_col(g), j0, nk, D, v);
          for (int64_t i = 0; i < nqr; ++i) {
            const int64_t ti = i0 + i, jn = std::min(nk, ti - j0 + 1);  // causal: j <= i
            if (jn <= 0) continue;
            A* si = s + i * BK;
            A mx = m[i];
            for (int64_t j = 0; j < jn; ++j) {
              A dot = 0;
#pragma omp simd reduction(+ : dot)
              for (int64_t c = 0; c < D; ++c) dot += q[i * D + c] * k[j * D + c];
              si[j] = dot;
              mx = std::max(mx, dot);
            }
            A corr = std::exp(m[i] - mx), sum = 0;
            A* ai = acc + i * D;
            for (int64_t c = 0; c < D; ++c) ai[c] *= corr;
            for (int64_t j = 0; j < jn; ++j) {
              A p = std::exp(si[j] - mx);
              sum += p;
              if (drop) p = keep(o, b, h, T, ti, j0 + j) ? p * inv_keep : A(0);
              const A* vj = v + j * D;
#pragma omp simd
              for (int64_t c = 0; c < D; ++c) ai[c] += p * vj[c];
            }
            l[i] = l[i] * corr + sum;
            m[i] = mx;
          }
        }
        for (int64_t i = 0; i < nqr; ++i) {
          A* dst = out + ((i0 + i) * B + b) * (H * D) + h * D;
          A inv = A(1) / l[i];
          for (int64_t c = 0; c < D; ++c) dst[c] = acc[i * D + c] * inv;
          lse[(b * H + h) * T + i0 + i] = m[i] + std::log(l[i]);
        }
      }
}

template <typename Tin, typename A>
void bwd(const Tin* qkv, const A* out, const A* dout, const A* lse, const QkvLayout& L, const AttentionOptions& o,
         A* dqkv) {
  const int64_t T = L.seq, B = L.batch, H = L.heads, G = L.groups, D = L.head_dim, row = L.row(),
                qpg = L.heads_per_group();
  const A scale = static_cast<A>(o.scale);
  const bool drop = o.dropout > 0;
  const A inv_keep = drop ? static_cast<A>(1.0 / (1.0 - o.dropout)) : A(1);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      alignas(64) A q[BQ * kAttnMaxHeadDim], dO[BQ * kAttnMaxHeadDim], dq[BQ * kAttnMaxHeadDim],
          k[BK * kAttnMaxHeadDim], v[BK * kAttnMaxHeadDim], Di[BQ];
      // This unit owns dK and dV of group g for sequence b: zero them first.
      for (int64_t t = 0; t < T; ++t) {
        A* r = dqkv + (t * B + b) * row;
        std::fill(r + L.k_col(g), r + L.k_col(g) + 2 * D, A(0));
      }
      for (int64_t h = g * qpg; h < (g + 1) * qpg; ++h)
        for (int64_t i0 = 0; i0 < T; i0 += BQ) {
          const int64_t nqr = std::min(BQ, T - i0);
          load_tile(qkv, row, B, b, L.q_col(h), i0, nqr, D, q);
          for (int64_t i = 0; i < nqr; ++i) {
            const A* dorow = dout + ((i0 + i) * B + b) * (H * D) + h * D;
            const A* orow = out + ((i0 + i) * B + b) * (H * D) + h * D;
            A d = 0;
            for (int64_t c = 0; c < D; ++c) {
              dO[i * D + c] = dorow[c];
              d += dorow[c] * orow[c];
            }
            Di[i] = d;
          }
          std::fill(dq, dq + nqr * D, A(0));
          const int64_t last = i0 + nqr - 1;
          for (int64_t j0 = 0; j0 <= last; j0 += BK) {
            const int64_t nk = std::min(BK, last + 1 - j0);
            load_tile(qkv, row, B, b, L.k_col(g), j0, nk, D, k);
            load_tile(qkv, row, B, b, L.v_col(g), j0, nk, D, v);
            for (int64_t i = 0; i < nqr; ++i) {
              const int64_t ti = i0 + i, jn = std::min(nk, ti - j0 + 1);
              if (jn <= 0) continue;
              const A li = lse[(b * H + h) * T + ti];
              const A* qi = q + i * D;
              const A* doi = dO + i * D;
              A* dqi = dq + i * D;
              for (int64_t j = 0; j < jn; ++j) {
                const A* kj = k + j * D;
                const A* vj = v + j * D;
                A sdot = 0, dpd = 0;
#pragma omp simd reduction(+ : sdot, dpd)
                for (int64_t c = 0; c < D; ++c) {
                  sdot += qi[c] * kj[c];
                  dpd += doi[c] * vj[c];
                }
                const A p = std::exp(sdot * scale - li);
                A pd = p, dp = dpd;
                if (drop) {
                  bool kp = keep(o, b, h, T, ti, j0 + j);
                  pd = kp ? p * inv_keep : A(0);
                  dp = kp ? dpd * inv_keep : A(0);
                }
                const A ds = p * (dp - Di[i]) * scale;
                A* dk = dqkv + ((j0 + j) * B + b) * row + L.k_col(g);
                A* dv = dk + D;
#pragma omp simd
                for (int64_t c = 0; c < D; ++c) {
                  dqi[c] += ds * kj[c];
                  dk[c] += ds * qi[c];
                  dv[c] += pd * doi[c];
                }
              }
            }
          }
          for (int64_t i = 0; i < nqr; ++i) {
            A* dst = dqkv + ((i0 + i) * B + b) * row + L.q_col(h);
            for (int64_t c = 0; c < D; ++c) dst[c] = dq[i * D + c];
          }
        }
    }
}

void check(const Tensor& qkv, const QkvLayout& L, const Tensor& out, const Tensor& lse) {
  L.check();
  MT_CHECK(L.head_dim <= kAttnMaxHeadDim, "attention: head_dim above kAttnMaxHeadDim");
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "attention: qkv size does not match the layout");
  MT_CHECK(out.numel() == L.tokens() * L.heads * L.head_dim, "attention: out must be [T*B, a*d]");
  MT_CHECK(lse.numel() == L.batch * L.heads * L.seq, "attention: lse must be [B, a, T]");
}

}  // namespace

void attention_forward(const Tensor& qkv, const QkvLayout& L, const AttentionOptions& o, const Tensor& out,
                       const Tensor& lse) {
  check(qkv, L, out, lse);
  switch (qkv.dtype()) {
    case DType::kF32: fwd<float, float>(qkv.ptr<float>(), L, o, out.ptr<float>(), lse.ptr<float>()); break;
    case DType::kBF16: fwd<bf16, float>(qkv.ptr<bf16>(), L, o, out.ptr<float>(), lse.ptr<float>()); break;
    case DType::kF64: fwd<double, double>(qkv.ptr<double>(), L, o, out.ptr<double>(), lse.ptr<double>()); break;
    default: MT_CHECK(false, "attention_forward: unsupported dtype");
  }
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                        const QkvLayout& L, const AttentionOptions& o, const Tensor& dqkv) {
  check(qkv, L, out, lse);
  MT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention_backward: sizes");
  switch (qkv.dtype()) {
    case DType::kF32:
      bwd<float, float>(qkv.ptr<float>(), out.ptr<float>(), dout.ptr<float>(), lse.ptr<float>(), L, o,
                        dqkv.ptr<float>());
      break;
    case DType::kBF16:
      bwd<bf16, float>(qkv.ptr<bf16>(), out.ptr<float>(), dout.ptr<float>(), lse.ptr<float>(), L, o,
                       dqkv.ptr<float>());
      break;
    case DType::kF64:
      bwd<double, double>(qkv.ptr<double>(), out.ptr<double>(), dout.ptr<double>(), lse.ptr<double>(), L, o,
                          dqkv.ptr<double>());
      break;
    default: MT_CHECK(false, "attention_backward: unsupported dtype");
  }
}

}  // namespace mt::kernels::cpu
