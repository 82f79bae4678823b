// CUDA twins of kernels/cpu/attention.cc: causal (grouped-query) attention
// over Megatron's fused QKV rows, flash-attention style (kernels/attention.h
// has the contract; kernels/qkv_layout.h the layout).
//
// THIS IS THE CORRECTNESS-FIRST KERNEL: plain SIMT arithmetic (fp32, or fp64
// for the fp64 reference path) from shared memory, no tensor cores. Every
// inner product over the head dimension goes through dot_rows() and every
// P V / dS K style product through the accumulate loops marked "tile
// product", so an mma (tensor-core) path can later replace exactly those with
// the tile loads, masks, softmax and dropout left as they are.
//
// Tiles: q rows [BQ][d] and k/v rows [BK][d] in static shared memory (rows
// padded to DM + 1 against bank conflicts), DM = 64, 128 or 256 the smallest
// supported size >= d; any d <= kAttnMaxHeadDim works (loops run to d, the
// padding is unused). Tile sizes per (type, DM) are in Cfg below, each
// checked to fit 48 KB. bf16 qkv is widened to fp32 as it is loaded; all
// arithmetic is in the accumulation type A (fp32, fp64 for fp64 qkv).
//
// Forward, grid (query tile, head, batch), one block per tile:
//   Q tile (pre-scaled by `scale`, as the CPU twin does) stays in shared
//   memory; key/value tiles j0 = 0 .. last query row stream through (tiles
//   entirely above the diagonal are never loaded). Per key tile: S = Q K^T
//   (one thread per score), then one thread per query row does the online
//   softmax (running max m, sum l, correction exp(m_old - m_new)) on its row,
//   then (dropout only) every thread masks its scores with the Philox keep
//   decision of the element's global (b, head_offset + head, i, j), then
//   acc = acc * corr + P V (each thread owns fixed (row, column) elements of
//   acc in registers). Epilogue: out = acc / l, lse = m + log(l). The sum l
//   is taken before dropout, like the CPU twin (dropout scales P after the
//   softmax normalisation).
//
// Backward, three kernels on the stream, no atomics, deterministic:
//   1. attn_bwd_di, one warp per (token, head): D_i = sum_c dO_i,c O_i,c with
//      a fixed shuffle tree. D_i is parked in dqkv's q slot of that token and
//      head (its first element): the q slots are not otherwise written until
//      kernel 3, and kernel 3's block for those rows is the only one that
//      reads them back before overwriting them. No scratch memory needed.
//   2. attn_bwd_dkv, grid (key tile, group, batch): one block owns the key
//      and value rows of one key tile of one query group. K, V of the tile
//      stay in shared memory, dK, dV in registers; the block walks the heads
//      of the group and, per head, the query tiles from the one holding the
//      tile's first key to the end (query tiles entirely before the key tile,
//      i.e. above the diagonal, are skipped). Per query tile: S = Q K^T, dP = dO V^T,
//      P = exp(S scale - lse), dropout (P and dP scaled by 1/(1-p) or zeroed),
//      dS = P (dP - D_i) scale; then dV += P_dropped^T dO and dK += dS^T Q,
//      rows in ascending order. Finally dK, dV are written (not added).
//   3. attn_bwd_dq, grid (query tile, head, batch): Q, dO, lse and D_i of the
//      tile in shared memory; key tiles 0 .. the diagonal stream through;
//      recomputes P and dS as kernel 2 does and accumulates dQ += dS K in
//      registers, then writes dQ (over the parked D_i).
// REQUIRES (as for the CPU twin): dqkv aliases none of qkv, out, dout, lse.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/attention.h"

namespace mt::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------
// Scalars every kernel needs, computed once on the host exactly as the CPU
// twin computes them (scale and 1/(1-p) rounded to A from double, the dropout
// threshold rounded to float).
template <typename A>
struct Params {
  int64_t T = 0, B = 0, H = 0, qpg = 0, D = 0, row = 0;  // seq, batch, heads, heads per group, head_dim, (a+2g)d
  A scale = 0, inv_keep = 1;
  float dropout = 0;
  bool drop = false;
  uint64_t seed = 0, stream = 0;
  int64_t head_offset = 0;
};

template <typename A>
Params<A> make_params(const QkvLayout& L, const AttentionOptions& o) {
  Params<A> p;
  p.T = L.seq, p.B = L.batch, p.H = L.heads, p.qpg = L.heads_per_group(), p.D = L.head_dim, p.row = L.row();
  p.scale = static_cast<A>(o.scale);
  p.drop = o.dropout > 0;
  p.inv_keep = p.drop ? static_cast<A>(1.0 / (1.0 - o.dropout)) : A(1);
  p.dropout = static_cast<float>(o.dropout);
  p.seed = o.seed, p.stream = o.stream, p.head_offset = o.head_offset;
  return p;
}

// Column offsets within a qkv row: QkvLayout::q_col / k_col (v_col = k_col + D).
template <typename A>
__device__ __forceinline__ int64_t q_col(const Params<A>& p, int64_t head) {
  return (head / p.qpg) * (p.qpg + 2) * p.D + (head % p.qpg) * p.D;
}
template <typename A>
__device__ __forceinline__ int64_t k_col(const Params<A>& p, int64_t group) {
  return (group * (p.qpg + 2) + p.qpg) * p.D;
}

// Dropout keep decision of element (b, head, i, j): the CPU twin's keep(),
// bit for bit (same global index, same Philox, same float threshold).
template <typename A>
__device__ __forceinline__ bool keep(const Params<A>& p, int64_t b, int64_t head, int64_t i, int64_t j) {
  const uint64_t T = static_cast<uint64_t>(p.T);
  const uint64_t idx =
      ((static_cast<uint64_t>(b) << 20 | static_cast<uint64_t>(p.head_offset + head)) * T + static_cast<uint64_t>(i)) *
          T +
      static_cast<uint64_t>(j);
  return ::mt::philox_uniform(p.seed, p.stream, idx) >= p.dropout;
}

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(bf16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }

__device__ __forceinline__ float exp_a(float x) { return expf(x); }
__device__ __forceinline__ double exp_a(double x) { return exp(x); }
__device__ __forceinline__ float log_a(float x) { return logf(x); }
__device__ __forceinline__ double log_a(double x) { return log(x); }
__device__ __forceinline__ float max_a(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_a(double a, double b) { return fmax(a, b); }

// dst[r][c] = alpha * src[(t0 + r) * ld + c] for r < n, c < D; zero rows for
// n <= r < ROWS (so masked lanes read finite zeros). dst rows are LD apart.
template <int ROWS, int LD, int NT, typename Tin, typename A>
__device__ __forceinline__ void load_tile(const Tin* __restrict__ src, int64_t ld, int64_t t0, int n, int D, A alpha,
                                          A* dst) {
  for (int e = threadIdx.x; e < ROWS * D; e += NT) {
    const int r = e / D, c = e - r * D;
    A v = 0;
    if (r < n) v = static_cast<A>(widen(src[(t0 + r) * ld + c])) * alpha;
    dst[r * LD + c] = v;
  }
}

// sum_c x[c] y[c] for c < D, in order: the inner product a tensor-core path replaces.
template <typename A>
__device__ __forceinline__ A dot_rows(const A* x, const A* y, int D) {
  A s = 0;
#pragma unroll 4
  for (int c = 0; c < D; ++c) s += x[c] * y[c];
  return s;
}

// ---------------------------------------------------------------------------
// Tile sizes per (accumulation type, DM). Shared memory per kernel:
//   fwd:  (BQ + 2 BK) (DM+1) + BQ (BK+1) + BQ           elements of A
//   dkv:  2 (BK + BQ) (DM+1) + 2 BQ (BK+1) + 2 BQ
//   dq:   2 (BQ + BK) (DM+1) + BQ (BK+1) + 2 BQ
template <int BQ_, int BK_, int NT_>
struct Tile {
  static constexpr int BQ = BQ_, BK = BK_, NT = NT_;
};
template <typename A, int DM>
struct Cfg;
template <> struct Cfg<float, 64> { using Fwd = Tile<64, 32, 256>; using Dkv = Tile<32, 32, 256>; using Dq = Tile<32, 32, 128>; };
template <> struct Cfg<float, 128> { using Fwd = Tile<32, 16, 256>; using Dkv = Tile<8, 32, 256>; using Dq = Tile<16, 16, 128>; };
template <> struct Cfg<float, 256> { using Fwd = Tile<16, 8, 256>; using Dkv = Tile<4, 16, 256>; using Dq = Tile<8, 8, 128>; };
template <> struct Cfg<double, 64> { using Fwd = Tile<32, 16, 128>; using Dkv = Tile<16, 16, 128>; using Dq = Tile<16, 16, 128>; };
template <> struct Cfg<double, 128> { using Fwd = Tile<16, 8, 128>; using Dkv = Tile<4, 16, 128>; using Dq = Tile<8, 8, 128>; };
template <> struct Cfg<double, 256> { using Fwd = Tile<8, 4, 128>; using Dkv = Tile<2, 8, 128>; using Dq = Tile<4, 4, 128>; };

constexpr size_t kStaticSmem = 48 * 1024;
template <typename A, int DM, int BQ, int BK>
constexpr size_t fwd_smem() { return sizeof(A) * ((BQ + 2 * BK) * (DM + 1) + BQ * (BK + 1) + BQ); }
template <typename A, int DM, int BQ, int BK>
constexpr size_t dkv_smem() { return sizeof(A) * (2 * (BK + BQ) * (DM + 1) + 2 * BQ * (BK + 1) + 2 * BQ); }
template <typename A, int DM, int BQ, int BK>
constexpr size_t dq_smem() { return sizeof(A) * (2 * (BQ + BK) * (DM + 1) + BQ * (BK + 1) + 2 * BQ); }

// ---------------------------------------------------------------------------
// Forward. Grid (ceil(T / BQ), H, B), NT threads.
template <typename Tin, typename A, int DM, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT)
    attn_fwd(const Tin* __restrict__ qkv, A* __restrict__ out, A* __restrict__ lse, const Params<A> p) {
  constexpr int LD = DM + 1, LS = BK + 1, NACC = (BQ * DM + NT - 1) / NT;
  static_assert(NT >= BQ, "one thread per query row for the softmax statistics");
  static_assert(fwd_smem<A, DM, BQ, BK>() <= kStaticSmem, "forward tiles exceed 48 KB of shared memory");
  __shared__ A sq[BQ * LD];  // q * scale
  __shared__ A sk[BK * LD];
  __shared__ A sv[BK * LD];
  __shared__ A sp[BQ * LS];  // scores, then probabilities
  __shared__ A srow[BQ];     // per row: correction factor, at the end 1 / l

  const int tid = threadIdx.x, D = static_cast<int>(p.D);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * BQ, h = blockIdx.y, b = blockIdx.z;
  const int nq = static_cast<int>(min(static_cast<int64_t>(BQ), p.T - i0));
  const int64_t ldq = p.B * p.row;  // qkv rows of one sequence
  const int64_t qc = q_col(p, h), kc = k_col(p, h / p.qpg), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;

  load_tile<BQ, LD, NT>(qkv_b + qc, ldq, i0, nq, D, p.scale, sq);

  A acc[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) acc[k] = 0;
  A m = static_cast<A>(-INFINITY), l = 0;  // row tid's statistics (tid < nq)

  const int64_t last = i0 + nq - 1;  // causal: no key after the tile's last query
  for (int64_t j0 = 0; j0 <= last; j0 += BK) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
    __syncthreads();  // the previous tile's readers of sk, sv, sp, srow are done (and sq is written)
    load_tile<BK, LD, NT>(qkv_b + kc, ldq, j0, nk, D, A(1), sk);
    load_tile<BK, LD, NT>(qkv_b + vc, ldq, j0, nk, D, A(1), sv);
    __syncthreads();
    // S = (q scale) K^T for the causal entries (key j0 + j <= query i0 + i).
    for (int e = tid; e < BQ * BK; e += NT) {
      const int i = e / BK, j = e - i * BK;
      A s = 0;
      if (i < nq && j < nk && j0 + j <= i0 + i) s = dot_rows(sq + i * LD, sk + j * LD, D);
      sp[i * LS + j] = s;
    }
    __syncthreads();
    // Online softmax, one thread per query row: keys j < jn are visible.
    if (tid < BQ) {
      const int i = tid;
      A* s = sp + i * LS;
      const int jn = i < nq ? static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(nk), i0 + i - j0 + 1)))
                            : 0;
      A corr = 1;
      if (jn > 0) {
        A mx = m;
        for (int j = 0; j < jn; ++j) mx = max_a(mx, s[j]);
        corr = exp_a(m - mx);  // 0 on the first tile (m = -inf)
        A sum = 0;
        for (int j = 0; j < BK; ++j) {
          const A pj = j < jn ? exp_a(s[j] - mx) : A(0);
          s[j] = pj;
          sum += pj;
        }
        l = l * corr + sum;
        m = mx;
      } else {
        for (int j = 0; j < BK; ++j) s[j] = 0;
      }
      srow[i] = corr;
    }
    __syncthreads();
    if (p.drop) {  // uniform over the block
      for (int e = tid; e < BQ * BK; e += NT) {
        const int i = e / BK, j = e - i * BK;
        if (i < nq && j < nk && j0 + j <= i0 + i) {
          A& pe = sp[i * LS + j];
          pe = keep(p, b, h, i0 + i, j0 + j) ? pe * p.inv_keep : A(0);
        }
      }
      __syncthreads();
    }
    // Tile product: acc = acc * corr + P V over the visible keys of each row.
#pragma unroll
    for (int k = 0; k < NACC; ++k) {
      const int e = tid + k * NT;
      if (e < BQ * D) {
        const int i = e / D, c = e - i * D;
        if (i < nq) {
          const int jn = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(nk), i0 + i - j0 + 1)));
          A a = acc[k] * srow[i];
          const A* pi = sp + i * LS;
          for (int j = 0; j < jn; ++j) a += pi[j] * sv[j * LD + c];
          acc[k] = a;
        }
      }
    }
  }
  __syncthreads();  // the last tile's readers of srow are done
  if (tid < nq) {
    lse[(b * p.H + h) * p.T + i0 + tid] = m + log_a(l);
    srow[tid] = A(1) / l;
  }
  __syncthreads();
  const int64_t ldo = p.B * p.H * p.D;  // out rows of one sequence
  A* out_b = out + b * p.H * p.D + h * p.D;
#pragma unroll
  for (int k = 0; k < NACC; ++k) {
    const int e = tid + k * NT;
    if (e < BQ * D) {
      const int i = e / D, c = e - i * D;
      if (i < nq) out_b[(i0 + i) * ldo + c] = acc[k] * srow[i];
    }
  }
}

// ---------------------------------------------------------------------------
// Backward 1: D = rowsum(dO * O) per (token, head), parked in dqkv's q slot.
// 8 warps per block, one warp per row r = (t B + b) H + h of out.
constexpr int kDiThreads = 256;

template <typename A>
__global__ void __launch_bounds__(kDiThreads)
    attn_bwd_di(const A* __restrict__ out, const A* __restrict__ dout, A* dqkv, const Params<A> p) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kDiThreads / 32) + (threadIdx.x >> 5);
  if (r >= p.T * p.B * p.H) return;  // whole warps only; no block barrier below
  const A* o = out + r * p.D;
  const A* d = dout + r * p.D;
  A s = 0;
  for (int64_t c = lane; c < p.D; c += 32) s += d[c] * o[c];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) {
    const int64_t h = r % p.H, tb = r / p.H;  // tb = t B + b: the qkv row
    dqkv[tb * p.row + q_col(p, h)] = s;
  }
}

// Backward 2: dK, dV. Grid (ceil(T / BK), G, B), NT threads.
template <typename Tin, typename A, int DM, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT) attn_bwd_dkv(const Tin* __restrict__ qkv, const A* __restrict__ dout,
                                                   const A* __restrict__ lse, A* dqkv, const Params<A> p) {
  constexpr int LD = DM + 1, LS = BK + 1, NACC = (BK * DM + NT - 1) / NT;
  static_assert(NT >= BQ, "one thread per query row for lse and D");
  static_assert(dkv_smem<A, DM, BQ, BK>() <= kStaticSmem, "dK/dV tiles exceed 48 KB of shared memory");
  __shared__ A sk[BK * LD];
  __shared__ A sv[BK * LD];
  __shared__ A sq[BQ * LD];
  __shared__ A sdo[BQ * LD];
  __shared__ A sp[BQ * LS];   // P after dropout (as applied to V)
  __shared__ A sds[BQ * LS];  // dS
  __shared__ A slse[BQ];
  __shared__ A sdi[BQ];

  const int tid = threadIdx.x, D = static_cast<int>(p.D);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BK, g = blockIdx.y, b = blockIdx.z;
  const int nk = static_cast<int>(min(static_cast<int64_t>(BK), p.T - j0));
  const int64_t ldq = p.B * p.row, ldo = p.B * p.H * p.D;
  const int64_t kc = k_col(p, g), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;
  A* dqkv_b = dqkv + b * p.row;

  load_tile<BK, LD, NT>(qkv_b + kc, ldq, j0, nk, D, A(1), sk);
  load_tile<BK, LD, NT>(qkv_b + vc, ldq, j0, nk, D, A(1), sv);

  A dk[NACC], dv[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) dk[k] = 0, dv[k] = 0;

  for (int64_t h = g * p.qpg; h < (g + 1) * p.qpg; ++h) {
    const int64_t qc = q_col(p, h);
    const A* dout_bh = dout + b * p.H * p.D + h * p.D;
    // Query tiles holding a row >= j0 (the first is the one containing j0).
    for (int64_t i0 = (j0 / BQ) * BQ; i0 < p.T; i0 += BQ) {
      const int nq = static_cast<int>(min(static_cast<int64_t>(BQ), p.T - i0));
      __syncthreads();  // the previous query tile's readers are done (and sk, sv are written)
      load_tile<BQ, LD, NT>(qkv_b + qc, ldq, i0, nq, D, A(1), sq);
      load_tile<BQ, LD, NT>(dout_bh, ldo, i0, nq, D, A(1), sdo);
      if (tid < BQ) {
        A li = 0, di = 0;
        if (tid < nq) {
          li = lse[(b * p.H + h) * p.T + i0 + tid];
          di = dqkv_b[(i0 + tid) * ldq + qc];  // parked by attn_bwd_di
        }
        slse[tid] = li;
        sdi[tid] = di;
      }
      __syncthreads();
      for (int e = tid; e < BQ * BK; e += NT) {
        const int i = e / BK, j = e - i * BK;
        A pd = 0, ds = 0;
        if (i < nq && j < nk && j0 + j <= i0 + i) {
          const A s = dot_rows(sq + i * LD, sk + j * LD, D);
          A dp = dot_rows(sdo + i * LD, sv + j * LD, D);
          const A pr = exp_a(s * p.scale - slse[i]);
          pd = pr;
          if (p.drop) {
            const bool kp = keep(p, b, h, i0 + i, j0 + j);
            pd = kp ? pr * p.inv_keep : A(0);
            dp = kp ? dp * p.inv_keep : A(0);
          }
          ds = pr * (dp - sdi[i]) * p.scale;
        }
        sp[i * LS + j] = pd;
        sds[i * LS + j] = ds;
      }
      __syncthreads();
      // Tile products: dV += P^T dO, dK += dS^T Q over the rows that see each key.
#pragma unroll
      for (int k = 0; k < NACC; ++k) {
        const int e = tid + k * NT;
        if (e < BK * D) {
          const int j = e / D, c = e - j * D;
          const int ifirst = static_cast<int>(max(static_cast<int64_t>(0), j0 + j - i0));
          A av = dv[k], ak = dk[k];
          for (int i = ifirst; i < nq; ++i) {
            av += sp[i * LS + j] * sdo[i * LD + c];
            ak += sds[i * LS + j] * sq[i * LD + c];
          }
          dv[k] = av;
          dk[k] = ak;
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NACC; ++k) {
    const int e = tid + k * NT;
    if (e < BK * D) {
      const int j = e / D, c = e - j * D;
      if (j < nk) {
        A* r = dqkv_b + (j0 + j) * ldq + kc;
        r[c] = dk[k];
        r[p.D + c] = dv[k];
      }
    }
  }
}

// Backward 3: dQ. Grid (ceil(T / BQ), H, B), NT threads.
template <typename Tin, typename A, int DM, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT) attn_bwd_dq(const Tin* __restrict__ qkv, const A* __restrict__ dout,
                                                  const A* __restrict__ lse, A* dqkv, const Params<A> p) {
  constexpr int LD = DM + 1, LS = BK + 1, NACC = (BQ * DM + NT - 1) / NT;
  static_assert(NT >= BQ, "one thread per query row for lse and D");
  static_assert(dq_smem<A, DM, BQ, BK>() <= kStaticSmem, "dQ tiles exceed 48 KB of shared memory");
  __shared__ A sq[BQ * LD];
  __shared__ A sdo[BQ * LD];
  __shared__ A sk[BK * LD];
  __shared__ A sv[BK * LD];
  __shared__ A sds[BQ * LS];
  __shared__ A slse[BQ];
  __shared__ A sdi[BQ];

  const int tid = threadIdx.x, D = static_cast<int>(p.D);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * BQ, h = blockIdx.y, b = blockIdx.z;
  const int nq = static_cast<int>(min(static_cast<int64_t>(BQ), p.T - i0));
  const int64_t ldq = p.B * p.row, ldo = p.B * p.H * p.D;
  const int64_t qc = q_col(p, h), kc = k_col(p, h / p.qpg), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;
  A* dqkv_b = dqkv + b * p.row;

  load_tile<BQ, LD, NT>(qkv_b + qc, ldq, i0, nq, D, A(1), sq);
  load_tile<BQ, LD, NT>(dout + b * p.H * p.D + h * p.D, ldo, i0, nq, D, A(1), sdo);
  if (tid < BQ) {
    A li = 0, di = 0;
    if (tid < nq) {
      li = lse[(b * p.H + h) * p.T + i0 + tid];
      di = dqkv_b[(i0 + tid) * ldq + qc];  // parked by attn_bwd_di; this block overwrites it below
    }
    slse[tid] = li;
    sdi[tid] = di;
  }

  A dq[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) dq[k] = 0;

  const int64_t last = i0 + nq - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += BK) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
    __syncthreads();  // previous key tile's readers are done (and sq, sdo, slse, sdi are written)
    load_tile<BK, LD, NT>(qkv_b + kc, ldq, j0, nk, D, A(1), sk);
    load_tile<BK, LD, NT>(qkv_b + vc, ldq, j0, nk, D, A(1), sv);
    __syncthreads();
    for (int e = tid; e < BQ * BK; e += NT) {
      const int i = e / BK, j = e - i * BK;
      A ds = 0;
      if (i < nq && j < nk && j0 + j <= i0 + i) {
        const A s = dot_rows(sq + i * LD, sk + j * LD, D);
        A dp = dot_rows(sdo + i * LD, sv + j * LD, D);
        const A pr = exp_a(s * p.scale - slse[i]);
        if (p.drop) dp = keep(p, b, h, i0 + i, j0 + j) ? dp * p.inv_keep : A(0);
        ds = pr * (dp - sdi[i]) * p.scale;
      }
      sds[i * LS + j] = ds;
    }
    __syncthreads();
    // Tile product: dQ += dS K over the visible keys of each row.
#pragma unroll
    for (int k = 0; k < NACC; ++k) {
      const int e = tid + k * NT;
      if (e < BQ * D) {
        const int i = e / D, c = e - i * D;
        if (i < nq) {
          const int jn = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(nk), i0 + i - j0 + 1)));
          A a = dq[k];
          const A* dsi = sds + i * LS;
          for (int j = 0; j < jn; ++j) a += dsi[j] * sk[j * LD + c];
          dq[k] = a;
        }
      }
    }
  }
  // Every thread is past the loop's barriers, so the parked D reads (before
  // the first barrier) are complete before these writes.
#pragma unroll
  for (int k = 0; k < NACC; ++k) {
    const int e = tid + k * NT;
    if (e < BQ * D) {
      const int i = e / D, c = e - i * D;
      if (i < nq) dqkv_b[(i0 + i) * ldq + qc + c] = dq[k];
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

unsigned tiles(int64_t n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <typename Tin, typename A, int DM>
void launch_fwd(const Tin* qkv, A* out, A* lse, const Params<A>& p) {
  using C = typename Cfg<A, DM>::Fwd;
  const dim3 grid(tiles(p.T, C::BQ), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  attn_fwd<Tin, A, DM, C::BQ, C::BK, C::NT><<<grid, C::NT, 0, ::mt::cuda::stream()>>>(qkv, out, lse, p);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename Tin, typename A, int DM>
void launch_bwd(const Tin* qkv, const A* dout, const A* lse, A* dqkv, const Params<A>& p) {
  using K = typename Cfg<A, DM>::Dkv;
  using Q = typename Cfg<A, DM>::Dq;
  const unsigned G = static_cast<unsigned>(p.H / p.qpg);
  const dim3 gkv(tiles(p.T, K::BK), G, static_cast<unsigned>(p.B));
  attn_bwd_dkv<Tin, A, DM, K::BQ, K::BK, K::NT><<<gkv, K::NT, 0, ::mt::cuda::stream()>>>(qkv, dout, lse, dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
  const dim3 gq(tiles(p.T, Q::BQ), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  attn_bwd_dq<Tin, A, DM, Q::BQ, Q::BK, Q::NT><<<gq, Q::NT, 0, ::mt::cuda::stream()>>>(qkv, dout, lse, dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename Tin, typename A>
void fwd(const Tin* qkv, const QkvLayout& L, const AttentionOptions& o, A* out, A* lse) {
  const Params<A> p = make_params<A>(L, o);
  if (p.D <= 64) launch_fwd<Tin, A, 64>(qkv, out, lse, p);
  else if (p.D <= 128) launch_fwd<Tin, A, 128>(qkv, out, lse, p);
  else launch_fwd<Tin, A, 256>(qkv, out, lse, p);
}

template <typename Tin, typename A>
void bwd(const Tin* qkv, const A* out, const A* dout, const A* lse, const QkvLayout& L, const AttentionOptions& o,
         A* dqkv) {
  const Params<A> p = make_params<A>(L, o);
  const int64_t rows = p.T * p.B * p.H;
  attn_bwd_di<A><<<::mt::cuda::blocks_for(rows, kDiThreads / 32), kDiThreads, 0, ::mt::cuda::stream()>>>(out, dout,
                                                                                                        dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
  if (p.D <= 64) launch_bwd<Tin, A, 64>(qkv, dout, lse, dqkv, p);
  else if (p.D <= 128) launch_bwd<Tin, A, 128>(qkv, dout, lse, dqkv, p);
  else launch_bwd<Tin, A, 256>(qkv, dout, lse, dqkv, p);
}

// The CPU twin's checks (same messages), plus where the tensors live and the
// grid limits.
void check(const Tensor& qkv, const QkvLayout& L, const Tensor& out, const Tensor& lse) {
  L.check();
  MT_CHECK(L.head_dim <= kAttnMaxHeadDim, "attention: head_dim above kAttnMaxHeadDim");
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "attention: qkv size does not match the layout");
  MT_CHECK(out.numel() == L.tokens() * L.heads * L.head_dim, "attention: out must be [T*B, a*d]");
  MT_CHECK(lse.numel() == L.batch * L.heads * L.seq, "attention: lse must be [B, a, T]");
  MT_CHECK(qkv.device() == Device::kCuda && out.device() == Device::kCuda && lse.device() == Device::kCuda,
           "attention (CUDA): tensors must be on the GPU");
  MT_CHECK(L.heads <= 65535 && L.batch <= 65535, "attention (CUDA): heads and batch must be <= 65535 (grid y, z)");
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
  MT_CHECK(dout.device() == Device::kCuda && dqkv.device() == Device::kCuda,
           "attention (CUDA): tensors must be on the GPU");
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

}  // namespace mt::kernels::cuda
