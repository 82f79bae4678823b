#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/attention_types.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_math.h"

namespace mt::kernels::cpu {
namespace {

constexpr int64_t BQ = kAttnTileQ, BK = kAttnTileK;

template <typename A> inline A load(float v) { return static_cast<A>(v); }
template <typename A> inline A load(double v) { return static_cast<A>(v); }
template <typename A> inline A load(bf16 v) { return static_cast<A>(bf16_to_float(v)); }
template <typename A> inline A load(f16 v) { return static_cast<A>(f16_widen(v)); }

// Dropout keep decision and the element's global index.
inline bool keep(const AttentionOptions& o, int64_t b, int64_t head, int64_t T, int64_t i, int64_t j) {
  uint64_t idx = ((static_cast<uint64_t>(b) << 20 | static_cast<uint64_t>(o.head_offset + head)) *
                      static_cast<uint64_t>(T) + static_cast<uint64_t>(i)) * static_cast<uint64_t>(T) +
                 static_cast<uint64_t>(j);
  return philox_uniform(o.seed, o.stream, idx) >= static_cast<float>(o.dropout);
}

// --reset-attention-mask: the first visible key of each of the n query rows
// from position i0 of sequence b (0 without document masking), and the
// smallest of them (where the key tiles start).
inline int64_t doc_starts(const AttentionOptions& o, int64_t T, int64_t b, int64_t i0, int64_t n, int64_t* ds) {
  const int32_t* d = o.doc_start.defined() ? o.doc_start.ptr<int32_t>() + b * T + i0 : nullptr;
  int64_t lo = i0 + n;
  for (int64_t i = 0; i < n; ++i) {
    ds[i] = d ? d[i] : 0;
    lo = std::min(lo, ds[i]);
  }
  return lo;
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

// dst[c] = src[c] for c < D, copied, or rounded once to Y (bf16).
template <typename Y, typename A>
inline void store_row(Y* dst, const A* src, int64_t D) {
  if constexpr (std::is_same_v<Y, A>) std::memcpy(dst, src, static_cast<size_t>(D) * sizeof(A));
  else
    for (int64_t c = 0; c < D; ++c) dst[c] = to_out<Y>(src[c]);
}

// Forward: per (sequence, head, query tile), stream key tiles with an online
// softmax. Per query row and key tile: the score row (BK wide, against K^T),
// its max, exp, then acc += P V. out is stored as Y (A, or bf16 for bf16 qkv).
template <typename Tin, typename A, typename Y>
void fwd(const Tin* qkv, const QkvLayout& L, const AttentionOptions& o, Y* out, A* lse) {
  const int64_t T = L.seq, B = L.batch, H = L.heads, D = L.head_dim, row = L.row(), qpg = L.heads_per_group();
  const QueryChunks qc = query_chunks(L, o);
  const int64_t nq = qc.tiles(BQ), Tq = qc.rows();
  const A scale = static_cast<A>(o.scale);
  const bool drop = o.dropout > 0;
  const A inv_keep = drop ? static_cast<A>(1.0 / (1.0 - o.dropout)) : A(1);
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t qt = 0; qt < nq; ++qt) {
        alignas(64) A q[BQ * kAttnMaxHeadDim], acc[BQ * kAttnMaxHeadDim], kT[kAttnMaxHeadDim * BK],
            v[BK * kAttnMaxHeadDim], s[BK], m[BQ], l[BQ];
        // i0: the tile's first position (masks, dropout, q rows of qkv);
        // r0: its first local row (out, lse).
        const QueryChunks::Tile tile = qc.tile(qt, BQ);
        const int64_t g = h / qpg, i0 = tile.pos, r0 = tile.local, nqr = tile.rows;
        int64_t dstart[BQ];
        const int64_t first = doc_starts(o, T, b, i0, nqr, dstart);
        load_tile(qkv, row, B, b, L.q_col(h), i0, nqr, D, q);
        for (int64_t x = 0; x < nqr * D; ++x) q[x] *= scale;
        std::fill(acc, acc + nqr * D, A(0));
        std::fill(m, m + nqr, -std::numeric_limits<A>::infinity());
        std::fill(l, l + nqr, A(0));
        const int64_t last = i0 + nqr - 1;
        for (int64_t j0 = first / BK * BK; j0 <= last; j0 += BK) {
          const int64_t nk = std::min(BK, last + 1 - j0);
          load_tile_t(qkv, row, B, b, L.k_col(g), j0, nk, D, kT);
          load_tile(qkv, row, B, b, L.v_col(g), j0, nk, D, v);
          for (int64_t i = 0; i < nqr; ++i) {
            // Visible: keys j0 + j for jl <= j < jn (causal: j <= i; document: j >= its start).
            const int64_t ti = i0 + i, jn = std::min(nk, ti - j0 + 1), jl = std::max<int64_t>(0, dstart[i] - j0);
            if (jn <= jl) continue;
            row_times_t(q + i * D, kT, D, s);
            A mx = m[i];
            for (int64_t j = jl; j < jn; ++j) mx = std::max(mx, s[j]);
            const A corr = std::exp(m[i] - mx);
            A sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < BK; ++j) {
              const A p = j >= jl && j < jn ? vexp(s[j] - mx) : A(0);
              s[j] = p;
              sum += p;
            }
            if (drop)
              for (int64_t j = jl; j < jn; ++j) s[j] = keep(o, b, h, T, ti, j0 + j) ? s[j] * inv_keep : A(0);
            A* ai = acc + i * D;
#pragma omp simd
            for (int64_t c = 0; c < D; ++c) ai[c] *= corr;
            for (int64_t j = jl; j < jn; ++j) axpy(D, s[j], v + j * D, ai);
            l[i] = l[i] * corr + sum;
            m[i] = mx;
          }
        }
        for (int64_t i = 0; i < nqr; ++i) {
          Y* dst = out + ((r0 + i) * B + b) * (H * D) + h * D;
          A inv = A(1) / l[i];
          for (int64_t c = 0; c < D; ++c) dst[c] = to_out<Y>(acc[i * D + c] * inv);
          lse[(b * H + h) * Tq + r0 + i] = m[i] + std::log(l[i]);
        }
      }
}

// Backward: per (sequence, group), so dK and dV of the group are owned by one
// unit. For each head of the group and query tile, key tiles in order; per
// key tile the unit keeps dK/dV of the tile locally and adds them to the
// group's dK/dV for the whole sequence (in A, stored to dqkv at the end).
// Per query row: S and dP rows BK wide (against K^T and V^T),
// P = exp(S scale - lse), dS = P (dP - Di) scale, then dq += dS K,
// dK += dS q, dV += P dO. out and dout are read as Yo and Yd, dqkv stored as
// Yg (each A, or bf16 for bf16 qkv).
template <typename Tin, typename A, typename Yo, typename Yd, typename Yg>
void bwd(const Tin* qkv, const Yo* out, const Yd* dout, const A* lse, const QkvLayout& L, const AttentionOptions& o,
         Yg* dqkv) {
  const int64_t T = L.seq, B = L.batch, H = L.heads, G = L.groups, D = L.head_dim, row = L.row(),
                qpg = L.heads_per_group();
  const QueryChunks qc = query_chunks(L, o);
  const int64_t nq = qc.tiles(BQ), Tq = qc.rows();
  const A scale = static_cast<A>(o.scale);
  const bool drop = o.dropout > 0;
  const A inv_keep = drop ? static_cast<A>(1.0 / (1.0 - o.dropout)) : A(1);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      alignas(64) A q[BQ * kAttnMaxHeadDim], dO[BQ * kAttnMaxHeadDim], dq[BQ * kAttnMaxHeadDim],
          k[BK * kAttnMaxHeadDim], kT[kAttnMaxHeadDim * BK], vT[kAttnMaxHeadDim * BK], dk[BK * kAttnMaxHeadDim],
          dv[BK * kAttnMaxHeadDim], orow[kAttnMaxHeadDim], p[BK], pd[BK], ds[BK], Di[BQ];
      // This unit owns dK and dV of group g for sequence b: rows [T][2D]
      // (dK | dV per token), zeroed first.
      thread_local std::vector<A> dkv_buf;
      dkv_buf.assign(static_cast<size_t>(T * 2 * D), A(0));
      A* dkv = dkv_buf.data();
      for (int64_t h = g * qpg; h < (g + 1) * qpg; ++h)
        for (int64_t qt = 0; qt < nq; ++qt) {
          const QueryChunks::Tile tile = qc.tile(qt, BQ);
          const int64_t i0 = tile.pos, r0 = tile.local, nqr = tile.rows;  // first position, first local row
          int64_t dstart[BQ];
          const int64_t first = doc_starts(o, T, b, i0, nqr, dstart);
          load_tile(qkv, row, B, b, L.q_col(h), i0, nqr, D, q);
          load_tile(dout, H * D, B, b, h * D, r0, nqr, D, dO);
          for (int64_t i = 0; i < nqr; ++i) {
            load_tile(out, H * D, B, b, h * D, r0 + i, 1, D, orow);
            A d = 0;
            for (int64_t c = 0; c < D; ++c) d += dO[i * D + c] * orow[c];
            Di[i] = d;
          }
          std::fill(dq, dq + nqr * D, A(0));
          const int64_t last = i0 + nqr - 1;
          for (int64_t j0 = first / BK * BK; j0 <= last; j0 += BK) {
            const int64_t nk = std::min(BK, last + 1 - j0);
            load_tile(qkv, row, B, b, L.k_col(g), j0, nk, D, k);
            load_tile_t(qkv, row, B, b, L.k_col(g), j0, nk, D, kT);
            load_tile_t(qkv, row, B, b, L.v_col(g), j0, nk, D, vT);
            std::fill(dk, dk + nk * D, A(0));
            std::fill(dv, dv + nk * D, A(0));
            for (int64_t i = 0; i < nqr; ++i) {
              const int64_t ti = i0 + i, jn = std::min(nk, ti - j0 + 1), jl = std::max<int64_t>(0, dstart[i] - j0);
              if (jn <= jl) continue;
              const A li = lse[(b * H + h) * Tq + r0 + i], di = Di[i];
              const A* qi = q + i * D;
              const A* doi = dO + i * D;
              row_times_t(qi, kT, D, p);   // scores
              row_times_t(doi, vT, D, ds); // dP
#pragma omp simd
              for (int64_t j = 0; j < BK; ++j) p[j] = j >= jl && j < jn ? vexp(p[j] * scale - li) : A(0);
              if (drop) {
                for (int64_t j = jl; j < jn; ++j) {
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
              for (int64_t j = jl; j < jn; ++j) {
                axpy(D, ds[j], k + j * D, dqi);
                axpy(D, ds[j], qi, dk + j * D);
                axpy(D, pd[j], doi, dv + j * D);
              }
            }
            for (int64_t j = 0; j < nk; ++j) {
              A* dkr = dkv + (j0 + j) * 2 * D;
              axpy(D, A(1), dk + j * D, dkr);
              axpy(D, A(1), dv + j * D, dkr + D);
            }
          }
          for (int64_t i = 0; i < nqr; ++i) store_row(dqkv + ((i0 + i) * B + b) * row + L.q_col(h), dq + i * D, D);
        }
      for (int64_t t = 0; t < T; ++t) store_row(dqkv + (t * B + b) * row + L.k_col(g), dkv + t * 2 * D, 2 * D);
    }
}

// ---------------------------------------------------------------------------
// fp32 fast path (head_dim a multiple of 16): whole tiles as small matrix
// products with register-blocked micro-kernels on 16-float vectors (GCC vector
// extensions: zmm with AVX-512, split into narrower registers otherwise).
// Up to 4 rows x 4 vectors of accumulators stay in registers, so each FMA
// needs one broadcast or vector load instead of a load and a store.
//
// Score tiles are kept transposed, S^T [keys][queries]: S^T = K Q^T takes K
// as rows (no transpose) and needs Q^T only once per query tile (not a K^T
// per tile pair), and the online softmax runs down the key rows with the 64
// queries as vector lanes, so its max and sums need no horizontal reductions.
// The backward unit (sequence, group) keeps its K, V, dK and dV contiguous for
// the whole sequence (see rows_of). Same algorithm and masks as the generic
// path above (which fp64 and other head sizes use); results differ from it
// only by rounding.

#if defined(__AVX512F__) || !defined(__GNUC__)
using v16 = float __attribute__((vector_size(64)));
#else
// Without AVX-512, two 8-float halves: GCC lowers a 64-byte vector type
// through memory there (the kernels ran at 6 GFLOP/s on an AVX2 Zen 3,
// 5x slower than PyTorch's attention), while each half is one ymm register.
using v8 = float __attribute__((vector_size(32)));
struct v16 {
  v8 lo, hi;
};
inline v16& operator+=(v16& a, const v16& b) {
  a.lo += b.lo, a.hi += b.hi;
  return a;
}
inline v16 operator*(float x, const v16& y) { return {x * y.lo, x * y.hi}; }
#endif
constexpr int64_t kW = 16;  // floats per v16
static_assert(BQ == 4 * kW && BK == BQ, "the fast path's score tile is 4 vectors of queries wide");
static_assert(sizeof(v16) == kW * sizeof(float), "a v16 is 16 packed floats");

// Unaligned load / store (by reference: a v16 by value changes the ABI without AVX-512).
inline void vld(v16& v, const float* p) { std::memcpy(&v, p, sizeof v); }
inline void vst(float* p, const v16& v) { std::memcpy(p, &v, sizeof v); }
// Keeps a loaded vector in a register: without it GCC folds the load into
// every FMA that uses it (one load per FMA), and the micro-kernels become
// load-bound (measured 1.5x slower on Zen 4).
#if defined(__GNUC__) && defined(__AVX512F__)  // a v16 fits one zmm register
#define MT_IN_REG(x) asm("" : "+v"(x))
#else
#define MT_IN_REG(x) (void)0
#endif

// S[r][0..BQ) = sum_c X[r][c] YT[c][0..BQ) for r < R; X rows ld ldx, YT [D][BQ], S rows ld BQ.
template <int R>
void mk_rows_yt(const float* X, int64_t ldx, const float* YT, int64_t D, float* S) {
  v16 a[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) a[r][v] = v16{};
  for (int64_t c = 0; c < D; ++c) {
    const float* y = YT + c * BQ;
    v16 y0, y1, y2, y3;
    vld(y0, y), vld(y1, y + kW), vld(y2, y + 2 * kW), vld(y3, y + 3 * kW);
    MT_IN_REG(y0);
    MT_IN_REG(y1);
    MT_IN_REG(y2);
    MT_IN_REG(y3);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float x = X[r * ldx + c];
      a[r][0] += x * y0, a[r][1] += x * y1, a[r][2] += x * y2, a[r][3] += x * y3;
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) vst(S + r * BQ + v * kW, a[r][v]);
}

// S[0..rows)[0..BQ) = X Y^T, X rows ld ldx, YT [D][BQ].
void scores_t(const float* X, int64_t ldx, int64_t rows, int64_t D, const float* YT, float* S) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) mk_rows_yt<4>(X + r * ldx, ldx, YT, D, S + r * BQ);
  switch (rows - r) {
    case 3: mk_rows_yt<3>(X + r * ldx, ldx, YT, D, S + r * BQ); break;
    case 2: mk_rows_yt<2>(X + r * ldx, ldx, YT, D, S + r * BQ); break;
    case 1: mk_rows_yt<1>(X + r * ldx, ldx, YT, D, S + r * BQ); break;
    default: break;
  }
}

// O[r][0..NV*16) += sum_{j<n} P(r, j) X[j][0..NV*16) for r < R, where
// P(r, j) = P[r * prs + j * pjs]; X rows ld ldx, O rows ld ldo.
template <int R, int NV>
void mk_px(const float* P, int64_t prs, int64_t pjs, const float* X, int64_t ldx, int64_t n, float* O, int64_t ldo) {
  v16 a[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vld(a[r][v], O + r * ldo + v * kW);
  for (int64_t j = 0; j < n; ++j) {
    v16 x[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      vld(x[v], X + j * ldx + v * kW);
      MT_IN_REG(x[v]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float p = P[r * prs + j * pjs];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) a[r][v] += p * x[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vst(O + r * ldo + v * kW, a[r][v]);
}

template <int R>
void px_cols(const float* P, int64_t prs, int64_t pjs, const float* X, int64_t ldx, int64_t D, int64_t n, float* O,
             int64_t ldo) {
  int64_t d = 0;
  for (; d + 4 * kW <= D; d += 4 * kW) mk_px<R, 4>(P, prs, pjs, X + d, ldx, n, O + d, ldo);
  switch ((D - d) / kW) {
    case 3: mk_px<R, 3>(P, prs, pjs, X + d, ldx, n, O + d, ldo); break;
    case 2: mk_px<R, 2>(P, prs, pjs, X + d, ldx, n, O + d, ldo); break;
    case 1: mk_px<R, 1>(P, prs, pjs, X + d, ldx, n, O + d, ldo); break;
    default: break;
  }
}

// O[r][0..D) += sum_{j<n} P(r, j) X[j][0..D) for r < rows, P(r, j) = P[r * prs + j * pjs].
void accumulate_px(const float* P, int64_t prs, int64_t pjs, int64_t rows, const float* X, int64_t ldx, int64_t D,
                   int64_t n, float* O, int64_t ldo) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) px_cols<4>(P + r * prs, prs, pjs, X, ldx, D, n, O + r * ldo, ldo);
  switch (rows - r) {
    case 3: px_cols<3>(P + r * prs, prs, pjs, X, ldx, D, n, O + r * ldo, ldo); break;
    case 2: px_cols<2>(P + r * prs, prs, pjs, X, ldx, D, n, O + r * ldo, ldo); break;
    case 1: px_cols<1>(P + r * prs, prs, pjs, X, ldx, D, n, O + r * ldo, ldo); break;
    default: break;
  }
}

// Rows t0 .. t0+n of one head's column block as fp32 rows: fp32 qkv is read
// in place (rows ld B * row), bf16 and fp16 are widened into `buf` (ld D). In place is
// right for the forward's tiles, each read once per use; the backward copies
// its group's K and V (and accumulates dK, dV) contiguous for the whole
// sequence instead: rows of one sequence are B * row floats apart (36 KB for
// GPT-2 124M at B=4), a multiple of 4 KB, so a tile's rows share L1 sets, and
// accumulating dK/dV in place made the backward slower, not faster.
struct Rows {
  const float* p;
  int64_t ld;
};
inline Rows rows_of(const float* qkv, int64_t row, int64_t B, int64_t b, int64_t col, int64_t t0, int64_t, int64_t,
                    float*) {
  return {qkv + (t0 * B + b) * row + col, B * row};
}
template <typename H, typename = std::enable_if_t<is_half_v<H>>>
inline Rows rows_of(const H* qkv, int64_t row, int64_t B, int64_t b, int64_t col, int64_t t0, int64_t n, int64_t D,
                    float* buf) {
  load_tile(qkv, row, B, b, col, t0, n, D, buf);
  return {buf, D};
}

// dst[c][r] = alpha src[r][c] for r < n (rows ld lds), zero lanes n <= r < BQ.
void transpose_rows(const float* src, int64_t lds, int64_t n, int64_t D, float alpha, float* dst) {
  if (n < BQ)
    for (int64_t c = 0; c < D; ++c) std::fill(dst + c * BQ + n, dst + (c + 1) * BQ, 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) dst[c * BQ + r] = alpha * src[r * lds + c];
}

// Per-thread scratch for the fast path (sized by head_dim and, in backward,
// the sequence; never T x T), handed out in consecutive blocks.
class Scratch {
 public:
  explicit Scratch(size_t n) : end_(n) {
    thread_local std::vector<float> buf;
    if (buf.size() < n) buf.resize(n);
    base_ = buf.data();
  }
  float* take(int64_t n) {
    float* p = base_ + used_;
    used_ += static_cast<size_t>(n);
    MT_CHECK(used_ <= end_, "attention: scratch layout larger than its size");
    return p;
  }

 private:
  float* base_ = nullptr;
  size_t used_ = 0, end_;
};

// First query lane of key row jk that may see the key (causal: key j0+jk <= query i0+i).
inline int64_t first_lane(int64_t i0, int64_t j0, int64_t jk) { return std::max<int64_t>(0, j0 + jk - i0); }

template <typename Tin, typename Y>
void fwd_f32(const Tin* qkv, const QkvLayout& L, const AttentionOptions& o, Y* out, float* lse) {
  const int64_t T = L.seq, B = L.batch, H = L.heads, D = L.head_dim, row = L.row(), qpg = L.heads_per_group();
  const QueryChunks qc = query_chunks(L, o);
  const int64_t nq = qc.tiles(BQ), Tq = qc.rows();
  const float scale = static_cast<float>(o.scale);
  const bool drop = o.dropout > 0;
  const float inv_keep = drop ? static_cast<float>(1.0 / (1.0 - o.dropout)) : 1.0f;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t qt = 0; qt < nq; ++qt) {
        Scratch sc(static_cast<size_t>(4 * BQ * D + BK * BQ + 5 * BQ));
        float *qT = sc.take(D * BQ), *acc = sc.take(BQ * D), *kbuf = sc.take(BK * D), *vbuf = sc.take(BK * D),
              *st = sc.take(BK * BQ), *m = sc.take(BQ), *l = sc.take(BQ), *mx = sc.take(BQ), *corr = sc.take(BQ),
              *sum = sc.take(BQ);
        const QueryChunks::Tile tile = qc.tile(qt, BQ);  // i0: first position, r0: first local row
        const int64_t g = h / qpg, i0 = tile.pos, r0 = tile.local, nqr = tile.rows;
        int64_t dstart[BQ] = {};  // --reset-attention-mask: each row's first visible key
        const bool doc = o.doc_start.defined();
        const int64_t first = doc_starts(o, T, b, i0, nqr, dstart);
        {
          const Rows q = rows_of(qkv, row, B, b, L.q_col(h), i0, nqr, D, kbuf);
          transpose_rows(q.p, q.ld, nqr, D, scale, qT);
        }
        std::fill(acc, acc + BQ * D, 0.0f);
        std::fill(m, m + BQ, kNegInf);
        std::fill(l, l + BQ, 0.0f);
        const int64_t last = i0 + nqr - 1;
        for (int64_t j0 = first / BK * BK; j0 <= last; j0 += BK) {
          const int64_t nk = std::min(BK, last + 1 - j0);
          const bool masked = j0 + nk - 1 > i0;  // some key comes after some query of the tile
          const bool dmask = doc && j0 < dstart[nqr - 1];  // some key comes before some query's document
          const Rows k = rows_of(qkv, row, B, b, L.k_col(g), j0, nk, D, kbuf);
          const Rows v = rows_of(qkv, row, B, b, L.v_col(g), j0, nk, D, vbuf);
          scores_t(k.p, k.ld, nk, D, qT, st);
          std::copy(m, m + BQ, mx);
          if (dmask)  // keys before a row's document: out of its softmax (lanes past nqr keep start 0)
            for (int64_t jk = 0; jk < nk; ++jk)
              for (int64_t i = 0; i < nqr; ++i)
                if (j0 + jk < dstart[i]) st[jk * BQ + i] = kNegInf;
          for (int64_t jk = 0; jk < nk; ++jk) {
            const float* s = st + jk * BQ;
            const int64_t f = masked ? first_lane(i0, j0, jk) : 0;
#pragma omp simd
            for (int64_t i = 0; i < BQ; ++i) mx[i] = i >= f ? std::max(mx[i], s[i]) : mx[i];
          }
#pragma omp simd
          for (int64_t i = 0; i < BQ; ++i) {
            // A row none of whose keys so far is visible (documents) keeps m = -inf.
            corr[i] = mx[i] == kNegInf ? 1.0f : exp_simd(m[i] - mx[i]);
            sum[i] = 0.0f;
          }
          for (int64_t jk = 0; jk < nk; ++jk) {
            float* s = st + jk * BQ;
            const int64_t f = masked ? first_lane(i0, j0, jk) : 0;
#pragma omp simd
            for (int64_t i = 0; i < BQ; ++i) {
              const float p = i >= f && (!dmask || s[i] != kNegInf) ? exp_simd(s[i] - mx[i]) : 0.0f;
              s[i] = p;
              sum[i] += p;
            }
            if (drop)
              for (int64_t i = f; i < nqr; ++i) s[i] = keep(o, b, h, T, i0 + i, j0 + jk) ? s[i] * inv_keep : 0.0f;
          }
          for (int64_t i = 0; i < nqr; ++i) {
            float* ai = acc + i * D;
            const float c = corr[i];
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ai[d] *= c;
          }
#pragma omp simd
          for (int64_t i = 0; i < BQ; ++i) {
            l[i] = l[i] * corr[i] + sum[i];
            m[i] = mx[i];
          }
          accumulate_px(st, 1, BQ, nqr, v.p, v.ld, D, nk, acc, D);  // acc += P V
        }
        for (int64_t i = 0; i < nqr; ++i) {
          Y* dst = out + ((r0 + i) * B + b) * (H * D) + h * D;
          const float inv = 1.0f / l[i];
          for (int64_t c = 0; c < D; ++c) dst[c] = to_out<Y>(acc[i * D + c] * inv);
          lse[(b * H + h) * Tq + r0 + i] = m[i] + std::log(l[i]);
        }
      }
}

template <typename Tin, typename Yo, typename Yd, typename Yg>
void bwd_f32(const Tin* qkv, const Yo* out, const Yd* dout, const float* lse, const QkvLayout& L,
             const AttentionOptions& o, Yg* dqkv) {
  const int64_t T = L.seq, B = L.batch, H = L.heads, G = L.groups, D = L.head_dim, row = L.row(),
                qpg = L.heads_per_group();
  const QueryChunks qc = query_chunks(L, o);
  const int64_t nq = qc.tiles(BQ), Tq = qc.rows();
  const float scale = static_cast<float>(o.scale);
  const bool drop = o.dropout > 0;
  const float inv_keep = drop ? static_cast<float>(1.0 / (1.0 - o.dropout)) : 1.0f;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      // The unit's K, V (read by every query tile of the group's heads) and
      // its dK, dV (owned by this unit), contiguous for the whole sequence.
      const int64_t td = T * D;
      Scratch sc(static_cast<size_t>(4 * td + 6 * BQ * D + 3 * BK * BQ + 2 * BQ));
      float *K = sc.take(td), *V = sc.take(td), *dK = sc.take(td), *dV = sc.take(td), *qT = sc.take(D * BQ),
            *doT = sc.take(D * BQ), *dq = sc.take(BQ * D), *q = sc.take(BQ * D), *dO = sc.take(BQ * D),
            *obuf = sc.take(BQ * D), *st = sc.take(BK * BQ), *dpt = sc.take(BK * BQ), *pdt = sc.take(BK * BQ),
            *Di = sc.take(BQ), *li = sc.take(BQ);
      load_tile(qkv, row, B, b, L.k_col(g), 0, T, D, K);
      load_tile(qkv, row, B, b, L.v_col(g), 0, T, D, V);
      std::fill(dK, dK + td, 0.0f);
      std::fill(dV, dV + td, 0.0f);
      for (int64_t h = g * qpg; h < (g + 1) * qpg; ++h)
        for (int64_t qt = 0; qt < nq; ++qt) {
          const QueryChunks::Tile tile = qc.tile(qt, BQ);
          const int64_t i0 = tile.pos, r0 = tile.local, nqr = tile.rows;  // first position, first local row
          int64_t dstart[BQ] = {};  // --reset-attention-mask: each row's first visible key
          const int64_t first = doc_starts(o, T, b, i0, nqr, dstart);
          load_tile(qkv, row, B, b, L.q_col(h), i0, nqr, D, q);
          load_tile(dout, H * D, B, b, h * D, r0, nqr, D, dO);
          transpose_rows(q, D, nqr, D, 1.0f, qT);
          transpose_rows(dO, D, nqr, D, 1.0f, doT);
          const Rows O = rows_of(out, H * D, B, b, h * D, r0, nqr, D, obuf);  // fp32 in place, bf16 widened
          for (int64_t i = 0; i < BQ; ++i) {
            float d = 0;
            if (i < nqr) {
#pragma omp simd reduction(+ : d)
              for (int64_t c = 0; c < D; ++c) d += dO[i * D + c] * O.p[i * O.ld + c];
            }
            Di[i] = d;
            li[i] = i < nqr ? lse[(b * H + h) * Tq + r0 + i] : 0.0f;
          }
          std::fill(dq, dq + nqr * D, 0.0f);
          const int64_t last = i0 + nqr - 1;
          for (int64_t j0 = first / BK * BK; j0 <= last; j0 += BK) {
            const int64_t nk = std::min(BK, last + 1 - j0);
            const bool masked = j0 + nk - 1 > i0 || nqr < BQ;
            const bool dmask = o.doc_start.defined() && j0 < dstart[nqr - 1];  // keys before some row's document
            const float *k = K + j0 * D, *v = V + j0 * D;
            scores_t(k, D, nk, D, qT, st);    // S^T
            scores_t(v, D, nk, D, doT, dpt);  // dP^T
            for (int64_t jk = 0; jk < nk; ++jk) {
              float *s = st + jk * BQ, *dp = dpt + jk * BQ, *pd = pdt + jk * BQ;
              const int64_t f = masked ? first_lane(i0, j0, jk) : 0, e = masked ? nqr : BQ;
              const int64_t j = j0 + jk;
#pragma omp simd
              for (int64_t i = 0; i < BQ; ++i)
                s[i] = i >= f && i < e && (!dmask || j >= dstart[i]) ? exp_simd(s[i] * scale - li[i]) : 0.0f;
              if (drop) {
                for (int64_t i = 0; i < BQ; ++i) {
                  const bool kp = i >= f && i < e && (!dmask || j >= dstart[i]) && keep(o, b, h, T, i0 + i, j0 + jk);
                  pd[i] = kp ? s[i] * inv_keep : 0.0f;
                  dp[i] = kp ? dp[i] * inv_keep : 0.0f;
                }
              }
#pragma omp simd
              for (int64_t i = 0; i < BQ; ++i) dp[i] = s[i] * (dp[i] - Di[i]) * scale;  // dS^T
            }
            const float* pv = drop ? pdt : st;  // probabilities as applied to V
            accumulate_px(dpt, 1, BQ, nqr, k, D, D, nk, dq, D);          // dQ += dS K
            accumulate_px(dpt, BQ, 1, nk, q, D, D, nqr, dK + j0 * D, D);  // dK += dS^T Q
            accumulate_px(pv, BQ, 1, nk, dO, D, D, nqr, dV + j0 * D, D);  // dV += P^T dO
          }
          for (int64_t i = 0; i < nqr; ++i) store_row(dqkv + ((i0 + i) * B + b) * row + L.q_col(h), dq + i * D, D);
        }
      for (int64_t t = 0; t < T; ++t) {
        Yg* r = dqkv + (t * B + b) * row + L.k_col(g);
        store_row(r, dK + t * D, D);
        store_row(r + D, dV + t * D, D);
      }
    }
}

void check(const Tensor& qkv, const QkvLayout& L, const AttentionOptions& o, const Tensor& out, const Tensor& lse) {
  L.check();
  check_options(L, o, qkv);
  const int64_t Tq = query_chunks(L, o).rows();
  MT_CHECK(L.head_dim <= kAttnMaxHeadDim, "attention: head_dim above kAttnMaxHeadDim");
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "attention: qkv size does not match the layout");
  MT_CHECK(out.numel() == Tq * L.batch * L.heads * L.head_dim, "attention: out must be [T/cp*B, a*d]");
  MT_CHECK(lse.numel() == L.batch * L.heads * Tq, "attention: lse must be [B, a, T/cp]");
}

}  // namespace

// The fast fp32 path takes fp32, bf16 and fp16 qkv at head_dim a multiple of 16;
// fp64 and other head sizes take the generic one.
void attention_forward(const Tensor& qkv, const QkvLayout& L, const AttentionOptions& o, const Tensor& out,
                       const Tensor& lse) {
  check(qkv, L, o, out, lse);
  constexpr const char* op = "attention_forward";
  attention_qkv_types<true>(qkv.dtype(), op, [&](auto tin) {
    using Tin = decltype(tin);
    using A = AttnAcc<Tin>;
    attention_check_lse<Tin>(lse.dtype(), op);
    attention_types<Tin>(out.dtype(), op, "out", [&](auto yo) {
      using Y = decltype(yo);
      if constexpr (std::is_same_v<A, float>)
        if (L.head_dim % kW == 0) return fwd_f32<Tin, Y>(qkv.ptr<Tin>(), L, o, out.ptr<Y>(), lse.ptr<float>());
      fwd<Tin, A, Y>(qkv.ptr<Tin>(), L, o, out.ptr<Y>(), lse.ptr<A>());
    });
  });
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                        const QkvLayout& L, const AttentionOptions& o, const Tensor& dqkv) {
  check(qkv, L, o, out, lse);
  MT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention_backward: sizes");
  constexpr const char* op = "attention_backward";
  attention_qkv_types<true>(qkv.dtype(), op, [&](auto tin) {
    using Tin = decltype(tin);
    using A = AttnAcc<Tin>;
    attention_check_lse<Tin>(lse.dtype(), op);
    attention_types<Tin>(out.dtype(), op, "out", [&](auto yo) {
      attention_types<Tin>(dout.dtype(), op, "dout", [&](auto yd) {
        attention_types<Tin>(dqkv.dtype(), op, "dqkv", [&](auto yg) {
          using Yo = decltype(yo);
          using Yd = decltype(yd);
          using Yg = decltype(yg);
          const Tin* q = qkv.ptr<Tin>();
          if constexpr (std::is_same_v<A, float>)
            if (L.head_dim % kW == 0)
              return bwd_f32<Tin, Yo, Yd, Yg>(q, out.ptr<Yo>(), dout.ptr<Yd>(), lse.ptr<float>(), L, o, dqkv.ptr<Yg>());
          bwd<Tin, A, Yo, Yd, Yg>(q, out.ptr<Yo>(), dout.ptr<Yd>(), lse.ptr<A>(), L, o, dqkv.ptr<Yg>());
        });
      });
    });
  });
}

}  // namespace mt::kernels::cpu
