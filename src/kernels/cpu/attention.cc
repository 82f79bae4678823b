#include "kernels/attention.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>
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

// exp for the fp32 path, written so that `omp simd` loops vectorise it (the
// libm call does not): Cephes' expf (degree-6 polynomial on x - n ln2, then
// 2^n through the exponent bits), within 2 ulp of expf on [-87.3, 88.7];
// below that range it returns ~1e-38 instead of 0 (callers zero masked
// entries themselves). fp64 (the reference path of the tests) uses std::exp.
inline float exp_simd(float x) {
  x = std::min(std::max(x, -87.3365f), 88.7228f);
  const float shift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  const float t = x * 1.44269504088896341f + shift;
  const float n = t - shift;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(shift) + 127) << 23;
  return p * std::bit_cast<float>(e);
}
template <typename A> inline A vexp(A x) {
  if constexpr (std::is_same_v<A, float>) return exp_simd(x);
  else return std::exp(x);
}

// Dropout keep decision and the element's global index.
inline bool keep(const AttentionOptions& o, int64_t b, int64_t head, int64_t T, int64_t i, int64_t j) {
  uint64_t idx = ((static_cast<uint64_t>(b) << 20 | static_cast<uint64_t>(o.head_offset + head)) *
                      static_cast<uint64_t>(T) + static_cast<uint64_t>(i)) * static_cast<uint64_t>(T) +
                 static_cast<uint64_t>(j);
  return philox_uniform(o.seed, o.stream, idx) >= static_cast<float>(o.dropout);
}

// dst[r][c] = src(t0 + r)[col + c] for r < n (rows of D).
template <typename Tin, typename A>
void load_tile(const Tin* qkv, int64_t row, int64_t B, int64_t b, int64_t col, int64_t t0, int64_t n, int64_t D,
               A* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const Tin* src = qkv + ((t0 + r) * B + b) * row + col;
    for (int64_t c = 0; c < D; ++c) dst[r * D + c] = load<A>(src[c]);
  }
}

// Transposed: dst[c][r] (rows of BK) for r < n, zeros for n <= r < BK, so that
// score rows can be computed BK wide (vectorised over keys).
template <typename Tin, typename A>
void load_tile_t(const Tin* qkv, int64_t row, int64_t B, int64_t b, int64_t col, int64_t t0, int64_t n, int64_t D,
                 A* dst) {
  if (n < BK) std::fill(dst, dst + D * BK, A(0));
  for (int64_t r = 0; r < n; ++r) {
    const Tin* src = qkv + ((t0 + r) * B + b) * row + col;
    for (int64_t c = 0; c < D; ++c) dst[c * BK + r] = load<A>(src[c]);
  }
}

// s[j] = sum_c x[c] * yT[c][j] for j < BK.
template <typename A>
inline void row_times_t(const A* x, const A* yT, int64_t D, A* s) {
  A acc[BK];
#pragma omp simd
  for (int64_t j = 0; j < BK; ++j) acc[j] = 0;
  for (int64_t c = 0; c < D; ++c) {
    const A xc = x[c];
    const A* yc = yT + c * BK;
#pragma omp simd
    for (int64_t j = 0; j < BK; ++j) acc[j] += xc * yc[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < BK; ++j) s[j] = acc[j];
}

// y[c] += a * x[c] for c < D.
template <typename A>
inline void axpy(int64_t D, A a, const A* x, A* y) {
#pragma omp simd
  for (int64_t c = 0; c < D; ++c) y[c] += a * x[c];
}

// Forward: per (sequence, head, query tile), stream key tiles with an online
// softmax. Per query row and key tile: the score row (BK wide, against K^T),
// its max, exp, then acc += P V.
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
        alignas(64) A q[BQ * kAttnMaxHeadDim], acc[BQ * kAttnMaxHeadDim], kT[kAttnMaxHeadDim * BK],
            v[BK * kAttnMaxHeadDim], s[BK], m[BQ], l[BQ];
        const int64_t g = h / qpg, i0 = qt * BQ, nqr = std::min(BQ, T - i0);
        load_tile(qkv, row, B, b, L.q_col(h), i0, nqr, D, q);
        for (int64_t x = 0; x < nqr * D; ++x) q[x] *= scale;
        std::fill(acc, acc + nqr * D, A(0));
        std::fill(m, m + nqr, -std::numeric_limits<A>::infinity());
        std::fill(l, l + nqr, A(0));
        const int64_t last = i0 + nqr - 1;
        for (int64_t j0 = 0; j0 <= last; j0 += BK) {
          const int64_t nk = std::min(BK, last + 1 - j0);
          load_tile_t(qkv, row, B, b, L.k_col(g), j0, nk, D, kT);
          load_tile(qkv, row, B, b, L.v_col(g), j0, nk, D, v);
          for (int64_t i = 0; i < nqr; ++i) {
            const int64_t ti = i0 + i, jn = std::min(nk, ti - j0 + 1);  // causal: j <= i
            if (jn <= 0) continue;
            row_times_t(q + i * D, kT, D, s);
            A mx = m[i];
            for (int64_t j = 0; j < jn; ++j) mx = std::max(mx, s[j]);
            const A corr = std::exp(m[i] - mx);
            A sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < BK; ++j) {
              const A p = j < jn ? vexp(s[j] - mx) : A(0);
              s[j] = p;
              sum += p;
            }
            if (drop)
              for (int64_t j = 0; j < jn; ++j) s[j] = keep(o, b, h, T, ti, j0 + j) ? s[j] * inv_keep : A(0);
            A* ai = acc + i * D;
#pragma omp simd
            for (int64_t c = 0; c < D; ++c) ai[c] *= corr;
            for (int64_t j = 0; j < jn; ++j) axpy(D, s[j], v + j * D, ai);
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

// Backward: per (sequence, group), so dK and dV of the group are owned by one
// unit. For each head of the group and query tile, key tiles in order; per
// key tile the unit keeps dK/dV of the tile locally and adds them to dqkv
// once. Per query row: S and dP rows BK wide (against K^T and V^T),
// P = exp(S scale - lse), dS = P (dP - Di) scale, then dq += dS K,
// dK += dS q, dV += P dO.
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
          k[BK * kAttnMaxHeadDim], kT[kAttnMaxHeadDim * BK], vT[kAttnMaxHeadDim * BK], dk[BK * kAttnMaxHeadDim],
          dv[BK * kAttnMaxHeadDim], p[BK], pd[BK], ds[BK], Di[BQ];
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
            load_tile_t(qkv, row, B, b, L.k_col(g), j0, nk, D, kT);
            load_tile_t(qkv, row, B, b, L.v_col(g), j0, nk, D, vT);
            std::fill(dk, dk + nk * D, A(0));
            std::fill(dv, dv + nk * D, A(0));
            for (int64_t i = 0; i < nqr; ++i) {
              const int64_t ti = i0 + i, jn = std::min(nk, ti - j0 + 1);
              if (jn <= 0) continue;
              const A li = lse[(b * H + h) * T + ti], di = Di[i];
              const A* qi = q + i * D;
              const A* doi = dO + i * D;
              row_times_t(qi, kT, D, p);   // scores
              row_times_t(doi, vT, D, ds); // dP
#pragma omp simd
              for (int64_t j = 0; j < BK; ++j) p[j] = j < jn ? vexp(p[j] * scale - li) : A(0);
              if (drop) {
                for (int64_t j = 0; j < jn; ++j) {
                  const bool kp = keep(o, b, h, T, ti, j0 + j);
                  pd[j] = kp ? p[j] * inv_keep : A(0);
                  ds[j] = kp ? ds[j] * inv_keep : A(0);
                }
              } else {
#pragma omp simd
                for (int64_t j = 0; j < BK; ++j) pd[j] = p[j];
              }
#pragma omp simd
              for (int64_t j = 0; j < BK; ++j) ds[j] = p[j] * (ds[j] - di) * scale;
              A* dqi = dq + i * D;
              for (int64_t j = 0; j < jn; ++j) {
                axpy(D, ds[j], k + j * D, dqi);
                axpy(D, ds[j], qi, dk + j * D);
                axpy(D, pd[j], doi, dv + j * D);
              }
            }
            for (int64_t j = 0; j < nk; ++j) {
              A* dkr = dqkv + ((j0 + j) * B + b) * row + L.k_col(g);
              axpy(D, A(1), dk + j * D, dkr);
              axpy(D, A(1), dv + j * D, dkr + D);
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
