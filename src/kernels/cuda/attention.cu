// CUDA twins of kernels/cpu/attention.cc: causal (grouped-query) attention
// over Megatron's fused QKV rows, flash-attention style (kernels/attention.h
// has the contract; kernels/qkv_layout.h the layout).
//
// Two implementations of the same algorithm (masks, dropout, outputs):
//  - the SIMT kernels (first below): fp32 arithmetic (fp64 for the fp64
//    reference path) from shared memory, any head_dim; they match the CPU
//    twin to fp32 rounding and serve fp32 training and fp64 tests;
//  - the tensor-core kernels ("Tensor-core path" below): bf16 mma.sync with
//    fp32 accumulation, head_dim 64 or 128, taken when the caller allows bf16
//    products (AttentionOptions::bf16_matmul, set under --bf16).
// The SIMT kernels' inner products over the head dimension go through
// dot_rows() and their P V / dS K style products through the loops marked
// "tile product".
//
// Tiles: q rows [BQ][d] and k/v rows [BK][d] in static shared memory (rows
// padded to DM + 1 against bank conflicts), DM = 64, 128 or 256 the smallest
// supported size >= d; any d <= kAttnMaxHeadDim works (loops run to d, the
// padding is unused). Tile sizes per (type, DM) are in Cfg below, each
// checked to fit 48 KB. bf16 qkv is widened to fp32 as it is loaded; all
// arithmetic is in the accumulation type A (fp32, fp64 for fp64 qkv). With
// bf16 qkv, out, dout and dqkv may each be bf16 as well (kernels/attention.h):
// dout and out are widened as they are loaded, out and dqkv rounded once as
// they are stored (Y, Yo, Yd, Yg below are their element types).
// Query tiles are the QueryChunks tiles (kernels/attention.h): all T
// positions, or under context parallelism the rank's two chunks; a tile's
// position (masks, dropout, q and dQ rows of qkv/dqkv) and its local row
// (out, dout, lse) differ then, and the key side always spans all T.
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
//      head (its first element; for a bf16 dqkv its fp32 bits over the first
//      two, see park_di): the q slots are not otherwise written until
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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/attention_types.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pointwise_common.cuh"

namespace mt::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------
// Scalars every kernel needs, computed once on the host exactly as the CPU
// twin computes them (scale and 1/(1-p) rounded to A from double, the dropout
// threshold rounded to float).
template <typename A>
struct Params {
  int64_t T = 0, B = 0, H = 0, qpg = 0, D = 0, row = 0;  // seq, batch, heads, heads per group, head_dim, (a+2g)d
  QueryChunks qc;  // the query rows (all T, or a CP rank's two chunks)
  int64_t Tq = 0;  // qc.rows(): rows of out, dout and lse per (b, head)
  A scale = 0, inv_keep = 1;
  float dropout = 0;
  bool drop = false;
  uint64_t seed = 0, stream = 0;
  int64_t head_offset = 0;
  const int32_t* doc = nullptr;  // --reset-attention-mask: [B, T] first position of each position's document
};

template <typename A>
Params<A> make_params(const QkvLayout& L, const AttentionOptions& o) {
  Params<A> p;
  p.T = L.seq, p.B = L.batch, p.H = L.heads, p.qpg = L.heads_per_group(), p.D = L.head_dim, p.row = L.row();
  p.qc = query_chunks(L, o), p.Tq = p.qc.rows();
  p.scale = static_cast<A>(o.scale);
  p.drop = o.dropout > 0;
  p.inv_keep = p.drop ? static_cast<A>(1.0 / (1.0 - o.dropout)) : A(1);
  p.dropout = static_cast<float>(o.dropout);
  p.seed = o.seed, p.stream = o.stream, p.head_offset = o.head_offset;
  if (o.doc_start.defined()) p.doc = o.doc_start.ptr<int32_t>();
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

// The first key position visible to the query at position `pos` of
// sequence b: its document's first position (--reset-attention-mask), else 0.
template <typename A>
__device__ __forceinline__ int64_t doc_first(const Params<A>& p, int64_t b, int64_t pos) {
  return p.doc ? static_cast<int64_t>(p.doc[b * p.T + pos]) : 0;
}
// The first key tile (of `tile` keys) a query tile from position i0 needs:
// the one holding its first row's first visible key (starts rise along a sequence).
template <typename A>
__device__ __forceinline__ int64_t first_key_tile(const Params<A>& p, int64_t b, int64_t i0, int64_t tile) {
  return doc_first(p, b, i0) / tile * tile;
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

// D_i parked in dqkv's q slot of its row (see Backward above): the first
// element, or for a bf16 dqkv the fp32 bits over the first two elements (low
// half first), so D is never rounded. Needs head_dim >= 2 for bf16.
__device__ __forceinline__ void park_di(float* slot, float d) { slot[0] = d; }
__device__ __forceinline__ void park_di(double* slot, double d) { slot[0] = d; }
__device__ __forceinline__ void park_di(bf16* slot, float d) {
  const uint32_t u = __float_as_uint(d);
  slot[0].bits = static_cast<uint16_t>(u & 0xffffu);
  slot[1].bits = static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float parked_di(const float* slot) { return slot[0]; }
__device__ __forceinline__ double parked_di(const double* slot) { return slot[0]; }
__device__ __forceinline__ float parked_di(const bf16* slot) {
  return __uint_as_float(static_cast<uint32_t>(slot[0].bits) | static_cast<uint32_t>(slot[1].bits) << 16);
}

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
// Forward. Grid (query tiles: QueryChunks::tiles(BQ), H, B), NT threads. out is stored as Y (A, or
// bf16 rounded once).
template <typename Tin, typename A, typename Y, int DM, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT)
    attn_fwd(const Tin* __restrict__ qkv, Y* __restrict__ out, A* __restrict__ lse, const Params<A> p) {
  constexpr int LD = DM + 1, LS = BK + 1, NACC = (BQ * DM + NT - 1) / NT;
  static_assert(NT >= BQ, "one thread per query row for the softmax statistics");
  static_assert(fwd_smem<A, DM, BQ, BK>() <= kStaticSmem, "forward tiles exceed 48 KB of shared memory");
  __shared__ A sq[BQ * LD];  // q * scale
  __shared__ A sk[BK * LD];
  __shared__ A sv[BK * LD];
  __shared__ A sp[BQ * LS];  // scores, then probabilities
  __shared__ A srow[BQ];     // per row: correction factor, at the end 1 / l

  const int tid = threadIdx.x, D = static_cast<int>(p.D);
  // i0: the tile's first position (masks, dropout, q rows); r0: its first local row (out, lse).
  const QueryChunks::Tile tile = p.qc.tile(blockIdx.x, BQ);
  const int64_t i0 = tile.pos, r0 = tile.local, h = blockIdx.y, b = blockIdx.z;
  const int nq = static_cast<int>(tile.rows);
  const int64_t ldq = p.B * p.row;  // qkv rows of one sequence
  const int64_t qc = q_col(p, h), kc = k_col(p, h / p.qpg), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;

  load_tile<BQ, LD, NT>(qkv_b + qc, ldq, i0, nq, D, p.scale, sq);

  A acc[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) acc[k] = 0;
  A m = static_cast<A>(-INFINITY), l = 0;  // row tid's statistics (tid < nq)

  const int64_t last = i0 + nq - 1;  // causal: no key after the tile's last query
  for (int64_t j0 = first_key_tile(p, b, i0, BK); j0 <= last; j0 += BK) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
    __syncthreads();  // the previous tile's readers of sk, sv, sp, srow are done (and sq is written)
    load_tile<BK, LD, NT>(qkv_b + kc, ldq, j0, nk, D, A(1), sk);
    load_tile<BK, LD, NT>(qkv_b + vc, ldq, j0, nk, D, A(1), sv);
    __syncthreads();
    // S = (q scale) K^T for the visible entries (causal: key j0 + j <= query
    // i0 + i; documents: and at or after the query's document start).
    for (int e = tid; e < BQ * BK; e += NT) {
      const int i = e / BK, j = e - i * BK;
      A s = 0;
      if (i < nq && j < nk && j0 + j <= i0 + i && j0 + j >= doc_first(p, b, i0 + i))
        s = dot_rows(sq + i * LD, sk + j * LD, D);
      sp[i * LS + j] = s;
    }
    __syncthreads();
    // Online softmax, one thread per query row: keys jl <= j < jn are visible.
    if (tid < BQ) {
      const int i = tid;
      A* s = sp + i * LS;
      const int jn = i < nq ? static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(nk), i0 + i - j0 + 1)))
                            : 0;
      const int jl = i < nq ? static_cast<int>(min(static_cast<int64_t>(BK), max(static_cast<int64_t>(0),
                                                                                doc_first(p, b, i0 + i) - j0)))
                            : 0;
      A corr = 1;
      if (jn > jl) {
        A mx = m;
        for (int j = jl; j < jn; ++j) mx = max_a(mx, s[j]);
        corr = exp_a(m - mx);  // 0 on the first tile (m = -inf)
        A sum = 0;
        for (int j = 0; j < BK; ++j) {
          const A pj = j >= jl && j < jn ? exp_a(s[j] - mx) : A(0);
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
        if (i < nq && j < nk && j0 + j <= i0 + i && j0 + j >= doc_first(p, b, i0 + i)) {
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
          const int jl = static_cast<int>(max(static_cast<int64_t>(0), doc_first(p, b, i0 + i) - j0));
          A a = acc[k] * srow[i];
          const A* pi = sp + i * LS;
          for (int j = jl; j < jn; ++j) a += pi[j] * sv[j * LD + c];
          acc[k] = a;
        }
      }
    }
  }
  __syncthreads();  // the last tile's readers of srow are done
  if (tid < nq) {
    lse[(b * p.H + h) * p.Tq + r0 + tid] = m + log_a(l);
    srow[tid] = A(1) / l;
  }
  __syncthreads();
  const int64_t ldo = p.B * p.H * p.D;  // out rows of one sequence
  Y* out_b = out + b * p.H * p.D + h * p.D;
#pragma unroll
  for (int k = 0; k < NACC; ++k) {
    const int e = tid + k * NT;
    if (e < BQ * D) {
      const int i = e / D, c = e - i * D;
      if (i < nq) out_b[(r0 + i) * ldo + c] = pointwise::to_out<Y>(acc[k] * srow[i]);
    }
  }
}

// ---------------------------------------------------------------------------
// Backward 1: D = rowsum(dO * O) per (token, head), parked in dqkv's q slot.
// 8 warps per block, one warp per row r = (t B + b) H + h of out.
constexpr int kDiThreads = 256;

template <typename A, typename Yo, typename Yd, typename Yg>
__global__ void __launch_bounds__(kDiThreads)
    attn_bwd_di(const Yo* __restrict__ out, const Yd* __restrict__ dout, Yg* dqkv, const Params<A> p) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kDiThreads / 32) + (threadIdx.x >> 5);
  if (r >= p.Tq * p.B * p.H) return;  // whole warps only; no block barrier below
  const Yo* o = out + r * p.D;
  const Yd* d = dout + r * p.D;
  A s = 0;
  for (int64_t c = lane; c < p.D; c += 32) s += static_cast<A>(widen(d[c])) * static_cast<A>(widen(o[c]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) {
    const int64_t h = r % p.H, tb = r / p.H;  // tb = t B + b: the out row; t's position is the qkv row's
    park_di(dqkv + (p.qc.position(tb / p.B) * p.B + tb % p.B) * p.row + q_col(p, h), s);
  }
}

// Backward 2: dK, dV. Grid (ceil(T / BK), G, B), NT threads. dout is read as
// Yd, dqkv stored as Yg (each A, or bf16).
template <typename Tin, typename A, typename Yd, typename Yg, int DM, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT) attn_bwd_dkv(const Tin* __restrict__ qkv, const Yd* __restrict__ dout,
                                                   const A* __restrict__ lse, Yg* dqkv, const Params<A> p) {
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
  Yg* dqkv_b = dqkv + b * p.row;

  load_tile<BK, LD, NT>(qkv_b + kc, ldq, j0, nk, D, A(1), sk);
  load_tile<BK, LD, NT>(qkv_b + vc, ldq, j0, nk, D, A(1), sv);

  A dk[NACC], dv[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) dk[k] = 0, dv[k] = 0;

  for (int64_t h = g * p.qpg; h < (g + 1) * p.qpg; ++h) {
    const int64_t qc = q_col(p, h);
    const Yd* dout_bh = dout + b * p.H * p.D + h * p.D;
    // Query tiles holding a position >= j0 (a suffix of the tiles: positions rise with the local row).
    for (int64_t qt = 0; qt < p.qc.tiles(BQ); ++qt) {
      const QueryChunks::Tile tile = p.qc.tile(qt, BQ);
      if (tile.pos + tile.rows <= j0) continue;  // uniform over the block
      const int64_t i0 = tile.pos, r0 = tile.local;  // first position, first local row
      const int nq = static_cast<int>(tile.rows);
      __syncthreads();  // the previous query tile's readers are done (and sk, sv are written)
      load_tile<BQ, LD, NT>(qkv_b + qc, ldq, i0, nq, D, A(1), sq);
      load_tile<BQ, LD, NT>(dout_bh, ldo, r0, nq, D, A(1), sdo);
      if (tid < BQ) {
        A li = 0, di = 0;
        if (tid < nq) {
          li = lse[(b * p.H + h) * p.Tq + r0 + tid];
          di = parked_di(dqkv_b + (i0 + tid) * ldq + qc);  // parked by attn_bwd_di
        }
        slse[tid] = li;
        sdi[tid] = di;
      }
      __syncthreads();
      for (int e = tid; e < BQ * BK; e += NT) {
        const int i = e / BK, j = e - i * BK;
        A pd = 0, ds = 0;
        if (i < nq && j < nk && j0 + j <= i0 + i && j0 + j >= doc_first(p, b, i0 + i)) {
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
        Yg* r = dqkv_b + (j0 + j) * ldq + kc;
        r[c] = pointwise::to_out<Yg>(dk[k]);
        r[p.D + c] = pointwise::to_out<Yg>(dv[k]);
      }
    }
  }
}

// Backward 3: dQ. Grid (QueryChunks::tiles(BQ), H, B), NT threads; dout as Yd, dqkv as Yg.
template <typename Tin, typename A, typename Yd, typename Yg, int DM, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT) attn_bwd_dq(const Tin* __restrict__ qkv, const Yd* __restrict__ dout,
                                                  const A* __restrict__ lse, Yg* dqkv, const Params<A> p) {
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
  const QueryChunks::Tile tile = p.qc.tile(blockIdx.x, BQ);
  const int64_t i0 = tile.pos, r0 = tile.local, h = blockIdx.y, b = blockIdx.z;  // first position, first local row
  const int nq = static_cast<int>(tile.rows);
  const int64_t ldq = p.B * p.row, ldo = p.B * p.H * p.D;
  const int64_t qc = q_col(p, h), kc = k_col(p, h / p.qpg), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;
  Yg* dqkv_b = dqkv + b * p.row;

  load_tile<BQ, LD, NT>(qkv_b + qc, ldq, i0, nq, D, A(1), sq);
  load_tile<BQ, LD, NT>(dout + b * p.H * p.D + h * p.D, ldo, r0, nq, D, A(1), sdo);
  if (tid < BQ) {
    A li = 0, di = 0;
    if (tid < nq) {
      li = lse[(b * p.H + h) * p.Tq + r0 + tid];
      di = parked_di(dqkv_b + (i0 + tid) * ldq + qc);  // parked by attn_bwd_di; this block overwrites it below
    }
    slse[tid] = li;
    sdi[tid] = di;
  }

  A dq[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) dq[k] = 0;

  const int64_t last = i0 + nq - 1;
  for (int64_t j0 = first_key_tile(p, b, i0, BK); j0 <= last; j0 += BK) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
    __syncthreads();  // previous key tile's readers are done (and sq, sdo, slse, sdi are written)
    load_tile<BK, LD, NT>(qkv_b + kc, ldq, j0, nk, D, A(1), sk);
    load_tile<BK, LD, NT>(qkv_b + vc, ldq, j0, nk, D, A(1), sv);
    __syncthreads();
    for (int e = tid; e < BQ * BK; e += NT) {
      const int i = e / BK, j = e - i * BK;
      A ds = 0;
      if (i < nq && j < nk && j0 + j <= i0 + i && j0 + j >= doc_first(p, b, i0 + i)) {
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
      if (i < nq) dqkv_b[(i0 + i) * ldq + qc + c] = pointwise::to_out<Yg>(dq[k]);
    }
  }
}

// ---------------------------------------------------------------------------
// Tensor-core path (AttentionOptions::bf16_matmul, head_dim 64 or 128, fp32 or
// bf16 qkv, 16-byte aligned tensors): the same three-pass algorithm, masks,
// dropout and outputs as the kernels above, with every tile product on bf16
// mma.sync (kernels/cuda/mma.cuh) and fp32 accumulation. Q, K, V and dO are
// rounded to bf16 as they are loaded (bf16 ones are taken as they are), and
// P and dS as they enter their products (Megatron's bf16 attention rounds the
// same operands); scores, the softmax statistics, dP and all accumulators
// stay fp32. out and dqkv (fp32 or bf16) are rounded only as they are stored.
// The softmax runs in base 2 on the special function unit (tc::exp2_approx,
// relative error about 2^-22 where the SIMT kernels' expf is within 2 ulp),
// with the scale folded into one FMA per score, as FlashAttention does.
//
// Each block has 4 warps and each warp owns 16 rows of the block's tile (the
// M of m16n8k16), so a row's softmax statistics live in the 4 lanes of one
// quad (lane / 4 = the row's g) and are reduced with two xor shuffles; no
// block-wide reduction and no shared score tile.
//
// Shared tiles are row-major bf16 ([token][head_dim], rows padded by kTcPad
// elements: a row pitch of 4 mod 32 words keeps ldmatrix conflict-free), in
// dynamic shared memory. Operands come out of them by ldmatrix: straight for
// a tile that is an A, or the B of a product with the tile transposed
// (Q K^T), and with .trans for a B that is the tile itself (P V, dS K,
// P^T dO, dS^T Q), so no tile is ever stored transposed. bf16 tiles are
// copied by cp.async, double-buffered: the copy of the next tile runs while
// the current one is multiplied (fp32 sources are rounded and stored by the
// threads themselves, in the same layout).
//   forward  per (head, sequence, query tile of 64): Q fragments in registers,
//            two stages of K and V tiles of 64 keys; S, P and the output
//            accumulator in registers (P feeds the P V product straight
//            from the S accumulators). 70 KB of shared memory at head_dim
//            128.
//   dK/dV    per (group, sequence, key tile of 64): K and V of the tile in
//            shared memory, dK, dV accumulators in registers; two stages of
//            Q and dO tiles of 32 queries (with their lse and D), taken per
//            head of the group and query tile from the key tile on. 70 KB.
//   dQ       per (head, sequence, query tile of 64): Q and dO fragments, lse
//            and D in registers; two stages of K and V tiles of 32 keys;
//            dQ += dS K. 35 KB.
// The grids are one-dimensional, in the order blocks start (their index):
// block rank * pairs + pair (tc_block), pair = head + heads x sequence, and
// rank 0 the longest tile (the query-tile kernels' last tile, the dK/dV
// kernel's first), so the longest blocks of every head and sequence start
// first. With the tile fastest (grid (tile, head, batch), as before
// 2026-12-04) one head's and sequence's tiles went after another's, and the
// last long blocks started when most of the work was done and ran on alone:
// a model of the benchmark's shape (bench/attention_launch_order.py: 2
// blocks an SM of 132, block time by its steps) puts the dK/dV kernel's span
// at 1.6x the balanced one that way and the forward's and dQ's at 1.15x;
// longest first, within 1% of it.

constexpr int kTcThreads = 128;  // 4 warps of 16 rows
constexpr int kTcPad = 8;        // bf16 elements of padding per shared row
constexpr int kTcFwdBQ = 64, kTcFwdBK = 64;
constexpr int kTcDkvBK = 64, kTcDkvBQ = 32;
constexpr int kTcDqBQ = 64, kTcDqBK = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

using SmemWord = tc::F4;  // dynamic shared memory in 16-byte units

// A tensor-core block's tile rank (0: the longest), head (or group) and
// sequence: block index rank * pairs + head + heads * sequence (pairs =
// heads x batch). One 32-bit division a block; tc_grid sizes the grid.
struct TcBlock {
  int64_t rank, head, b;
};
__device__ __forceinline__ TcBlock tc_block(int64_t heads, int64_t batch) {
  const unsigned h = static_cast<unsigned>(heads), pairs = static_cast<unsigned>(heads * batch), id = blockIdx.x;
  const unsigned rank = id / pairs, pair = id - rank * pairs;
  return TcBlock{rank, pair % h, pair / h};
}

// Shared memory bytes of each kernel (two stages of two tiles, plus the dK/dV
// kernel's K and V and its two stages of lse and D).
template <int D>
constexpr size_t fwd_tc_smem() {
  return sizeof(uint16_t) * 4 * kTcFwdBK * (D + kTcPad);
}
template <int D>
constexpr size_t dkv_tc_smem() {
  return sizeof(uint16_t) * (2 * kTcDkvBK + 4 * kTcDkvBQ) * (D + kTcPad) + 4 * kTcDkvBQ * sizeof(float);
}
template <int D>
constexpr size_t dq_tc_smem() {
  return sizeof(uint16_t) * 4 * kTcDqBK * (D + kTcPad);
}

// Rows t0 .. t0 + n of a D-wide column block (rows `ld` elements apart) into
// the row-major shared tile dst (pitch D + kTcPad); rows n .. ROWS are zeros.
// bf16 sources go by cp.async, 16 bytes a copy: they land at the caller's
// cp_async_wait that covers the group it commits next. fp32 sources are
// rounded to bf16 and stored now.
template <int ROWS, int D, typename Tin>
__device__ __forceinline__ void tc_load(const Tin* __restrict__ src, int64_t ld, int64_t t0, int n, uint16_t* dst) {
  constexpr int LD = D + kTcPad;
  if constexpr (std::is_same_v<Tin, bf16>) {
    constexpr int C8 = D / 8;
    for (int e = threadIdx.x; e < ROWS * C8; e += kTcThreads) {
      const int r = e / C8, c = e % C8 * 8;
      const bool in = r < n;
      tc::cp_async16(dst + r * LD + c, in ? src + (t0 + r) * ld + c : src, in);
    }
  } else {
    constexpr int C4 = D / 4;
    for (int e = threadIdx.x; e < ROWS * C4; e += kTcThreads) {
      const int r = e / C4, c = e % C4 * 4;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (r < n) tc::load4(src + (t0 + r) * ld + c, v);
      // One 8-byte store (c is a multiple of 4 elements, the pitch of 8 bytes).
      *reinterpret_cast<tc::U2*>(dst + r * LD + c) = tc::U2{tc::pack_bf16x2(v[0], v[1]), tc::pack_bf16x2(v[2], v[3])};
    }
  }
}

// Key tile jt (BK keys from jt BK, none past key `last`) of K and V (column
// blocks k and v, rows ld apart) into stage jt % 2 of `stages` (K, then V,
// BK (D + kTcPad) elements each), as one cp.async group: the forward's and
// the dQ kernel's double-buffered key tiles.
template <int BK, int D, typename Tin>
__device__ __forceinline__ void tc_load_kv_stage(const Tin* __restrict__ k, const Tin* __restrict__ v, int64_t ld,
                                                 int64_t last, int jt, uint16_t* stages) {
  constexpr int TILE = BK * (D + kTcPad);
  uint16_t* st = stages + (jt & 1) * 2 * TILE;
  const int64_t j0 = static_cast<int64_t>(jt) * BK;
  const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
  tc_load<BK, D>(k, ld, j0, nk, st);
  tc_load<BK, D>(v, ld, j0, nk, st + TILE);
  tc::cp_async_commit();
}

// The A fragments (16 rows from `row0`, all D columns) of a row-major fp32 or
// bf16 matrix in global memory, rows `ld` apart; rows at or past n are zeros.
// fp32 is rounded to bf16; bf16 (qkv, or dout under --bf16) is taken as it is.
template <int D, typename Tin>
__device__ __forceinline__ void tc_fragments_a(const Tin* __restrict__ src, int64_t ld, int row0, int n,
                                               uint32_t (&a)[D / 16][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = row0 + g, r1 = r0 + 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    a[kk][0] = a[kk][1] = a[kk][2] = a[kk][3] = 0u;
    if (r0 < n) a[kk][0] = tc::load2_bf16x2(src + r0 * ld + c), a[kk][2] = tc::load2_bf16x2(src + r0 * ld + c + 8);
    if (r1 < n) a[kk][1] = tc::load2_bf16x2(src + r1 * ld + c), a[kk][3] = tc::load2_bf16x2(src + r1 * ld + c + 8);
  }
}

// Operands by ldmatrix from a row-major shared tile (pitch LD); lane 8 m + i
// addresses row i of matrix m (mma.cuh).
// The A fragment of the 16 x 16 block at (row0, col0): matrices (row0, col0),
// (row0 + 8, col0), (row0, col0 + 8), (row0 + 8, col0 + 8) are a0 .. a3.
template <int LD>
__device__ __forceinline__ void tc_ldsm_a(const uint16_t* tile, int row0, int col0, uint32_t (&a)[4]) {
  const int lane = threadIdx.x & 31, m = lane >> 3, i = lane & 7;
  tc::ldsm_x4<false>(a, tile + (row0 + (m & 1) * 8 + i) * LD + col0 + (m >> 1) * 8);
}
// The B fragments of n-blocks n0 and n0 + 8 (k from k0, 16 deep) of B = the
// tile transposed (rows n, columns k: S = Q K^T takes K this way): matrices
// (n0, k0), (n0, k0 + 8) are b0, (n0 + 8, k0), (n0 + 8, k0 + 8) are b1.
template <int LD>
__device__ __forceinline__ void tc_ldsm_b(const uint16_t* tile, int n0, int k0, uint32_t (&b0)[2],
                                          uint32_t (&b1)[2]) {
  const int lane = threadIdx.x & 31, m = lane >> 3, i = lane & 7;
  uint32_t r[4];
  tc::ldsm_x4<false>(r, tile + (n0 + (m >> 1) * 8 + i) * LD + k0 + (m & 1) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
// The B fragments of n-blocks n0 and n0 + 8 (k from k0) of B = the tile
// itself (rows k, columns n: P V takes V this way), by transposing loads:
// matrices (k0, n0), (k0 + 8, n0) are b0, (k0, n0 + 8), (k0 + 8, n0 + 8) b1.
template <int LD>
__device__ __forceinline__ void tc_ldsm_bt(const uint16_t* tile, int k0, int n0, uint32_t (&b0)[2],
                                           uint32_t (&b1)[2]) {
  const int lane = threadIdx.x & 31, m = lane >> 3, i = lane & 7;
  uint32_t r[4];
  tc::ldsm_x4<true>(r, tile + (k0 + (m & 1) * 8 + i) * LD + n0 + (m >> 1) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// The accumulators of n-blocks 2 kb and 2 kb + 1 as the A fragment of k-block kb.
__device__ __forceinline__ void tc_c_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&a)[4]) {
  a[0] = tc::pack_bf16x2(c0[0], c0[1]);
  a[1] = tc::pack_bf16x2(c0[2], c0[3]);
  a[2] = tc::pack_bf16x2(c1[0], c1[1]);
  a[3] = tc::pack_bf16x2(c1[2], c1[3]);
}

// s[nb] += A B^T for the NB n-blocks of 8 rows of `tile` (rows n, columns k,
// D deep), with A the KB = D / 16 fragments a: S = Q K^T, dP = dO V^T.
template <int LD, int KB, int NB>
__device__ __forceinline__ void tc_scores(float (&s)[NB][4], const uint32_t (&a)[KB][4], const uint16_t* tile) {
#pragma unroll
  for (int kk = 0; kk < KB; ++kk)
#pragma unroll
    for (int nb = 0; nb < NB; nb += 2) {
      uint32_t b0[2], b1[2];
      tc_ldsm_b<LD>(tile, nb * 8, kk * 16, b0, b1);
      tc::mma_bf16(s[nb], a[kk], b0);
      tc::mma_bf16(s[nb + 1], a[kk], b1);
    }
}

// acc[dn] += A X for dn < DN, where A is the A fragment made of the score-
// shaped accumulators c0 | c1 (k-block at k0) and X rows k0 .. k0 + 16 of
// the shared tile (rows k, DN * 8 columns): one k-step of P V, dS K, P^T dO
// and dS^T Q.
template <int LD, int DN>
__device__ __forceinline__ void tc_accumulate(float (&acc)[DN][4], const float (&c0)[4], const float (&c1)[4],
                                              const uint16_t* tile, int k0) {
  uint32_t a[4];
  tc_c_to_a(c0, c1, a);
#pragma unroll
  for (int dn = 0; dn < DN; dn += 2) {
    uint32_t b0[2], b1[2];
    tc_ldsm_bt<LD>(tile, k0, dn * 8, b0, b1);
    tc::mma_bf16(acc[dn], a, b0);
    tc::mma_bf16(acc[dn + 1], a, b1);
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullWarp, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullWarp, v, 1);
  return v + __shfl_xor_sync(kFullWarp, v, 2);
}

// Forward. Grid tc_grid(QueryChunks::tiles(64), H, B), 128 threads, fwd_tc_smem<D>() bytes of
// dynamic shared memory; out stored as Y (fp32 or bf16).
template <typename Tin, typename Y, int D>
__global__ void __launch_bounds__(kTcThreads)
    attn_fwd_tc(const Tin* __restrict__ qkv, Y* __restrict__ out, float* __restrict__ lse, const Params<float> p) {
  constexpr int BQ = kTcFwdBQ, BK = kTcFwdBK, LD = D + kTcPad, KB = D / 16, NB = BK / 8, DN = D / 8, TILE = BK * LD;
  extern __shared__ SmemWord tc_smem[];
  uint16_t* const stages = reinterpret_cast<uint16_t*>(tc_smem);  // stage s: K at 2 s TILE, V at (2 s + 1) TILE
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // The last tiles (the most keys) first; i0: first position, q0: first local row.
  const TcBlock blk = tc_block(p.H, p.B);
  const QueryChunks::Tile tile = p.qc.tile(p.qc.tiles(BQ) - 1 - blk.rank, BQ);
  const int64_t i0 = tile.pos, q0 = tile.local, h = blk.head, b = blk.b;
  const int nq = static_cast<int>(tile.rows);
  const int64_t ldq = p.B * p.row;
  const int64_t qc = q_col(p, h), kc = k_col(p, h / p.qpg), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;
  const int r0 = warp * 16 + g, r1 = r0 + 8;  // this lane's rows of the tile
  const int64_t last = i0 + nq - 1;
  const int ntiles = static_cast<int>(last / BK) + 1, jt0 = static_cast<int>(first_key_tile(p, b, i0, BK) / BK);
  // --reset-attention-mask: the lane's rows' first visible keys.
  const int64_t d0 = r0 < nq ? doc_first(p, b, i0 + r0) : 0, d1 = r1 < nq ? doc_first(p, b, i0 + r1) : 0;
  auto load_tile = [&](int jt) { tc_load_kv_stage<BK, D>(qkv_b + kc, qkv_b + vc, ldq, last, jt, stages); };
  load_tile(jt0);

  uint32_t qa[KB][4];
  tc_fragments_a<D>(qkv_b + i0 * ldq + qc, ldq, warp * 16, nq, qa);
  float o[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  // m: the row maxima of the unscaled scores; l: this lane's part of the row sums.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = p.scale * tc::kLog2e;  // scores to base-2 exponents

  for (int jt = jt0; jt < ntiles; ++jt) {
    const int64_t j0 = static_cast<int64_t>(jt) * BK;
    const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
    if (jt + 1 < ntiles) {
      load_tile(jt + 1);  // into the stage whose readers finished at the end of the previous step
      tc::cp_async_wait<1>();
    } else {
      tc::cp_async_wait<0>();
    }
    __syncthreads();  // tile jt is in shared memory, every thread's copies of it landed
    const uint16_t* sk = stages + (jt & 1) * 2 * TILE;
    const uint16_t* sv = sk + TILE;
    float s[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    tc_scores<LD, KB, NB>(s, qa, sk);
    // Mask (causal, sequence end) where the tile crosses the diagonal or the
    // end; then the online softmax per row, on unscaled scores (the scale is
    // positive, so the row maxima are the same), in base 2: p = 2^(s sl2 - m sl2).
    if (j0 + BK - 1 > i0 || nk < BK || j0 < d1 || j0 < d0) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, j = nb * 8 + 2 * t + (e & 1);
          if (!(r < nq && j < nk && j0 + j <= i0 + r && j0 + j >= (e < 2 ? d0 : d1))) s[nb][e] = -INFINITY;
        }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
    }
    const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
    // A row with nothing visible yet keeps m = -inf; 0 stands in for it.
    const float base0 = mn0 == -INFINITY ? 0.f : mn0 * sl2, base1 = mn1 == -INFINITY ? 0.f : mn1 * sl2;
    const float c0 = tc::exp2_approx(m0 * sl2 - base0), c1 = tc::exp2_approx(m1 * sl2 - base1);  // 0 on a row's first tile
    m0 = mn0, m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = tc::exp2_approx(fmaf(s[nb][e], sl2, -(e < 2 ? base0 : base1)));  // masked: 2^-inf = 0
        s[nb][e] = pe;
        if (e < 2) sum0 += pe;
        else sum1 += pe;
      }
    l0 = l0 * c0 + sum0, l1 = l1 * c1 + sum1;  // before dropout, as the CPU twin
    if (p.drop) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (s[nb][e] != 0.f) {
            const int r = e < 2 ? r0 : r1, j = nb * 8 + 2 * t + (e & 1);
            s[nb][e] = keep(p, b, h, i0 + r, j0 + j) ? s[nb][e] * p.inv_keep : 0.f;
          }
    }
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) o[dn][0] *= c0, o[dn][1] *= c0, o[dn][2] *= c1, o[dn][3] *= c1;
#pragma unroll
    for (int kb = 0; kb < BK / 16; ++kb) tc_accumulate<LD, DN>(o, s[2 * kb], s[2 * kb + 1], sv, kb * 16);
    __syncthreads();  // every reader of this stage is done before load_tile(jt + 2) refills it
  }
  l0 = quad_sum(l0), l1 = quad_sum(l1);
  const int64_t ldo = p.B * p.H * p.D;
  Y* out_b = out + b * p.H * p.D + h * p.D;
  if (r0 < nq) {
    const float inv = 1.f / l0;
    Y* row = out_b + (q0 + r0) * ldo;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) tc::store2(row + dn * 8 + 2 * t, o[dn][0] * inv, o[dn][1] * inv);
    if (t == 0) lse[(b * p.H + h) * p.Tq + q0 + r0] = m0 * p.scale + logf(l0);
  }
  if (r1 < nq) {
    const float inv = 1.f / l1;
    Y* row = out_b + (q0 + r1) * ldo;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) tc::store2(row + dn * 8 + 2 * t, o[dn][2] * inv, o[dn][3] * inv);
    if (t == 0) lse[(b * p.H + h) * p.Tq + q0 + r1] = m1 * p.scale + logf(l1);
  }
}

// Backward 2 on tensor cores: dK, dV. Grid tc_grid(ceil(T / 64), G, B), 128 threads,
// dkv_tc_smem<D>() bytes of dynamic shared memory; dout read as Yd, dqkv
// stored as Yg (each fp32 or bf16).
//
// Two builds, the same bits (CudaTwin.AttentionDkvKernelBuildsAgreeBitwise);
// kernels::cuda::set_dkv_lean picks one and attention_bench times both:
//   default  the build measured on the H200 (bench/cuda_h200_notes.md): each
//            step's lse and D are read by warp 0 as the step's tiles are
//            requested (the other warps wait for those reads at the next
//            barrier), its query tile comes from p.qc.tile (two 64-bit
//            divisions) and every score is tested against the masks;
//   kLean    the next step's lse and D are read into registers with its tiles
//            and stored after this step's products; the steps are walked
//            with QueryChunks::next (no division in the loop); and a step
//            whose 64 keys x 32 queries are all visible (below the diagonal,
//            whole tiles, one document) skips the mask tests.
template <typename Tin, typename Yd, typename Yg, int D, bool kLean>
__global__ void __launch_bounds__(kTcThreads) attn_bwd_dkv_tc(const Tin* __restrict__ qkv, const Yd* __restrict__ dout,
                                                              const float* __restrict__ lse, Yg* dqkv,
                                                              const Params<float> p) {
  constexpr int BK = kTcDkvBK, BQ = kTcDkvBQ, LD = D + kTcPad, KB = D / 16, NB = BQ / 8, DN = D / 8,
                QTILE = BQ * LD;
  extern __shared__ SmemWord tc_smem[];
  uint16_t* sk = reinterpret_cast<uint16_t*>(tc_smem);
  uint16_t* sv = sk + BK * LD;
  uint16_t* stages = sv + BK * LD;  // stage s: Q at 2 s QTILE, dO at (2 s + 1) QTILE
  float* sstat = reinterpret_cast<float*>(stages + 4 * QTILE);  // stage s: lse log2(e) at 2 s BQ, D at (2 s + 1) BQ

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const TcBlock blk = tc_block(p.H / p.qpg, p.B);
  const int64_t j0 = blk.rank * BK, grp = blk.head, b = blk.b;
  const int nk = static_cast<int>(min(static_cast<int64_t>(BK), p.T - j0));
  const int64_t ldq = p.B * p.row, ldo = p.B * p.H * p.D;
  const int64_t kc = k_col(p, grp), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;
  Yg* dqkv_b = dqkv + b * p.row;
  const int k0 = warp * 16 + g, k1 = k0 + 8;  // this lane's key rows of the tile
  const float sl2 = p.scale * tc::kLog2e;     // P = 2^(s sl2 - lse log2(e))
  // The steps: every head of the group, and per head every query tile with
  // a position at or after the key tile's first (a suffix of the local
  // tiles, from `first`: positions rise with the local row; with all T
  // queries, the tiles from the key tile on).
  const int64_t ntile = p.qc.tiles(BQ);
  int64_t first = 0;
  QueryChunks::Place first_at{0, 0};  // kLean: tile `first`'s place
  while (first < ntile) {
    const QueryChunks::Tile f = kLean ? p.qc.tile_at(first_at, BQ) : p.qc.tile(first, BQ);
    if (f.pos + f.rows > j0) break;
    ++first;
    if constexpr (kLean) first_at = p.qc.next(first_at, BQ);
  }
  const int per_head = static_cast<int>(ntile - first), steps = static_cast<int>(p.qpg) * per_head;
  // kLean: a step's lse and D (threads below BQ, one query row each) are
  // read from global memory as its tiles are requested, and stored into its
  // stage when the previous step's products are done.
  float ahead_li = 0.f, ahead_di = 0.f;
  auto fetch_stats = [&](const QueryChunks::Tile& tile, int64_t h) {
    const int r = threadIdx.x;
    ahead_li = ahead_di = 0.f;
    if (r < BQ && r < tile.rows) {
      ahead_li = lse[(b * p.H + h) * p.Tq + tile.local + r];
      ahead_di = parked_di(dqkv_b + (tile.pos + r) * ldq + q_col(p, h));  // parked by attn_bwd_di
    }
  };
  auto store_stats = [&](int stage) {
    if (threadIdx.x < BQ) {
      sstat[stage * 2 * BQ + threadIdx.x] = ahead_li * tc::kLog2e;
      sstat[stage * 2 * BQ + BQ + threadIdx.x] = ahead_di;
    }
  };
  // A step's Q and dO (query tile `tile` of head h) into `stage` as one cp.async group.
  auto load_tiles = [&](const QueryChunks::Tile& tile, int64_t h, int stage) {
    uint16_t* st = stages + stage * 2 * QTILE;
    const int nq = static_cast<int>(tile.rows);
    tc_load<BQ, D>(qkv_b + q_col(p, h), ldq, tile.pos, nq, st);
    tc_load<BQ, D>(dout + b * p.H * p.D + h * p.D, ldo, tile.local, nq, st + QTILE);
    tc::cp_async_commit();
  };
  // The default build's step `it`: its tiles, then its lse and D, read and
  // stored now (warp 0 waits for the reads, and the others for warp 0 at the
  // next barrier).
  auto load_step = [&](int it) {
    const QueryChunks::Tile tile = p.qc.tile(first + it % per_head, BQ);
    const int64_t h = grp * p.qpg + it / per_head, i0 = tile.pos, q0 = tile.local;
    const int nq = static_cast<int>(tile.rows);
    load_tiles(tile, h, it & 1);
    if (threadIdx.x < BQ) {
      const int r = threadIdx.x;
      float li = 0.f, di = 0.f;
      if (r < nq) {
        li = lse[(b * p.H + h) * p.Tq + q0 + r];
        di = parked_di(dqkv_b + (i0 + r) * ldq + q_col(p, h));  // parked by attn_bwd_di
      }
      sstat[(it & 1) * 2 * BQ + r] = li * tc::kLog2e;
      sstat[(it & 1) * 2 * BQ + BQ + r] = di;
    }
  };
  // kLean: the walk. (at, ah) is the next step to load; (cur, ch) the step
  // loaded last. After a head's last tile the walk returns to `first` with
  // the next head.
  QueryChunks::Place at = first_at;
  int64_t ah = grp * p.qpg;
  QueryChunks::Tile cur{0, 0, 0};
  int64_t ch = 0;
  auto load_next = [&](int stage) {
    cur = p.qc.tile_at(at, BQ), ch = ah;
    load_tiles(cur, ch, stage);
    fetch_stats(cur, ch);  // in flight across this step's products
    at = p.qc.next(at, BQ);
    if (at.chunk == p.qc.n) at = first_at, ++ah;
  };
  if (steps > 0) {  // else no local query sees these keys (context parallelism): zeros
    tc_load<BK, D>(qkv_b + kc, ldq, j0, nk, sk);
    tc_load<BK, D>(qkv_b + vc, ldq, j0, nk, sv);
    if constexpr (kLean) load_next(0), store_stats(0);  // one group with K and V
    else load_step(0);
  }
  float dk[DN][4], dv[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dn][e] = 0.f, dv[dn][e] = 0.f;

  for (int it = 0; it < steps; ++it) {
    QueryChunks::Tile tile;
    int64_t h;
    if constexpr (kLean) {
      tile = cur, h = ch;
    } else {
      tile = p.qc.tile(first + it % per_head, BQ);
      h = grp * p.qpg + it / per_head;
    }
    const int64_t i0 = tile.pos;
    const int nq = static_cast<int>(tile.rows);
    if (it + 1 < steps) {
      if constexpr (kLean) load_next((it + 1) & 1);
      else load_step(it + 1);
      tc::cp_async_wait<1>();
    } else {
      tc::cp_async_wait<0>();
    }
    __syncthreads();  // step it's tiles (and K, V) are in shared memory
    const uint16_t* sq = stages + (it & 1) * 2 * QTILE;
    const uint16_t* sdo = sq + QTILE;
    const float* slse = sstat + (it & 1) * 2 * BQ;
    const float* sdi = slse + BQ;
    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x 32 queries.
    float st[NB][4], dpt[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nb][e] = 0.f, dpt[nb][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KB; ++kk) {
      uint32_t ka[4], va[4];
      tc_ldsm_a<LD>(sk, warp * 16, kk * 16, ka);
      tc_ldsm_a<LD>(sv, warp * 16, kk * 16, va);
#pragma unroll
      for (int nb = 0; nb < NB; nb += 2) {
        uint32_t bq0[2], bq1[2], bo0[2], bo1[2];
        tc_ldsm_b<LD>(sq, nb * 8, kk * 16, bq0, bq1);
        tc_ldsm_b<LD>(sdo, nb * 8, kk * 16, bo0, bo1);
        tc::mma_bf16(st[nb], ka, bq0);
        tc::mma_bf16(st[nb + 1], ka, bq1);
        tc::mma_bf16(dpt[nb], va, bo0);
        tc::mma_bf16(dpt[nb + 1], va, bo1);
      }
    }
    // P (dropped, for dV) into st, dS into dpt; rows are keys, columns
    // queries. `masked` false: every score of the step is visible.
    auto p_and_ds = [&](auto masked) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kl = e < 2 ? k0 : k1, il = nb * 8 + 2 * t + (e & 1);
          bool vis = true;
          if constexpr (decltype(masked)::value)
            vis = il < nq && kl < nk && j0 + kl <= i0 + il && j0 + kl >= doc_first(p, b, i0 + il);
          const float pr = vis ? tc::exp2_approx(fmaf(st[nb][e], sl2, -slse[il])) : 0.f;
          float pd = pr, dp = dpt[nb][e];
          if (p.drop && vis) {
            const bool kp = keep(p, b, h, i0 + il, j0 + kl);
            pd = kp ? pr * p.inv_keep : 0.f;
            dp = kp ? dp * p.inv_keep : 0.f;
          }
          st[nb][e] = pd;
          dpt[nb][e] = pr * (dp - sdi[il]) * p.scale;
        }
    };
    if constexpr (kLean) {
      // All visible: whole tiles, the last key at or before the first query,
      // and (documents start nondecreasing) the last query's document
      // starting at or before the first key.
      const bool all = nq == BQ && nk == BK && j0 + BK - 1 <= i0 && (!p.doc || doc_first(p, b, i0 + BQ - 1) <= j0);
      if (all) p_and_ds(std::false_type{});
      else p_and_ds(std::true_type{});
    } else {
      p_and_ds(std::true_type{});
    }
    // dV += P^T dO, dK += dS^T Q.
#pragma unroll
    for (int qb = 0; qb < BQ / 16; ++qb) {
      tc_accumulate<LD, DN>(dv, st[2 * qb], st[2 * qb + 1], sdo, qb * 16);
      tc_accumulate<LD, DN>(dk, dpt[2 * qb], dpt[2 * qb + 1], sq, qb * 16);
    }
    // Stage (it + 1) % 2's stats were last read in step it - 1.
    if constexpr (kLean)
      if (it + 1 < steps) store_stats((it + 1) & 1);
    __syncthreads();  // every reader of this stage is done before the load of step it + 2 refills it
  }
  if (k0 < nk) {
    Yg* r = dqkv_b + (j0 + k0) * ldq + kc;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      tc::store2(r + dn * 8 + 2 * t, dk[dn][0], dk[dn][1]);
      tc::store2(r + p.D + dn * 8 + 2 * t, dv[dn][0], dv[dn][1]);
    }
  }
  if (k1 < nk) {
    Yg* r = dqkv_b + (j0 + k1) * ldq + kc;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      tc::store2(r + dn * 8 + 2 * t, dk[dn][2], dk[dn][3]);
      tc::store2(r + p.D + dn * 8 + 2 * t, dv[dn][2], dv[dn][3]);
    }
  }
}

// Backward 3 on tensor cores: dQ. Grid tc_grid(QueryChunks::tiles(64), H, B), 128 threads,
// dq_tc_smem<D>() bytes of dynamic shared memory; dout read as Yd, dqkv
// stored as Yg.
template <typename Tin, typename Yd, typename Yg, int D>
__global__ void __launch_bounds__(kTcThreads) attn_bwd_dq_tc(const Tin* __restrict__ qkv, const Yd* __restrict__ dout,
                                                             const float* __restrict__ lse, Yg* dqkv,
                                                             const Params<float> p) {
  constexpr int BQ = kTcDqBQ, BK = kTcDqBK, LD = D + kTcPad, KB = D / 16, NB = BK / 8, DN = D / 8, TILE = BK * LD;
  extern __shared__ SmemWord tc_smem[];
  uint16_t* const stages = reinterpret_cast<uint16_t*>(tc_smem);  // stage s: K at 2 s TILE, V at (2 s + 1) TILE
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const TcBlock blk = tc_block(p.H, p.B);
  const QueryChunks::Tile tile = p.qc.tile(p.qc.tiles(BQ) - 1 - blk.rank, BQ);  // the most keys first
  const int64_t i0 = tile.pos, q0 = tile.local, h = blk.head, b = blk.b;  // first position, first local row
  const int nq = static_cast<int>(tile.rows);
  const int64_t ldq = p.B * p.row, ldo = p.B * p.H * p.D;
  const int64_t qc = q_col(p, h), kc = k_col(p, h / p.qpg), vc = kc + p.D;
  const Tin* qkv_b = qkv + b * p.row;
  Yg* dqkv_b = dqkv + b * p.row;
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const int64_t last = i0 + nq - 1;
  const int ntiles = static_cast<int>(last / BK) + 1, jt0 = static_cast<int>(first_key_tile(p, b, i0, BK) / BK);
  const int64_t d0 = r0 < nq ? doc_first(p, b, i0 + r0) : 0, d1 = r1 < nq ? doc_first(p, b, i0 + r1) : 0;
  // The warp's last row and its document's first position: a key tile whose
  // scores are all visible to the warp's 16 rows skips the mask tests.
  const int wl = warp * 16 + 15;
  const int64_t dw = wl < nq ? doc_first(p, b, i0 + wl) : 0;
  auto load_tile = [&](int jt) { tc_load_kv_stage<BK, D>(qkv_b + kc, qkv_b + vc, ldq, last, jt, stages); };
  load_tile(jt0);

  uint32_t qa[KB][4], da[KB][4];
  tc_fragments_a<D>(qkv_b + i0 * ldq + qc, ldq, warp * 16, nq, qa);
  tc_fragments_a<D>(dout + b * p.H * p.D + h * p.D + q0 * ldo, ldo, warp * 16, nq, da);
  // lse and D of the lane's rows; D is parked in the row's q slot, which this
  // warp alone overwrites, after the loop.
  float lse0 = 0.f, lse1 = 0.f, di0 = 0.f, di1 = 0.f;
  if (r0 < nq) lse0 = lse[(b * p.H + h) * p.Tq + q0 + r0], di0 = parked_di(dqkv_b + (i0 + r0) * ldq + qc);
  if (r1 < nq) lse1 = lse[(b * p.H + h) * p.Tq + q0 + r1], di1 = parked_di(dqkv_b + (i0 + r1) * ldq + qc);
  const float sl2 = p.scale * tc::kLog2e;  // P = 2^(s sl2 - lse log2(e))
  lse0 *= tc::kLog2e, lse1 *= tc::kLog2e;
  float dq[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) dq[dn][0] = dq[dn][1] = dq[dn][2] = dq[dn][3] = 0.f;

  for (int jt = jt0; jt < ntiles; ++jt) {
    const int64_t j0 = static_cast<int64_t>(jt) * BK;
    const int nk = static_cast<int>(min(static_cast<int64_t>(BK), last + 1 - j0));
    if (jt + 1 < ntiles) {
      load_tile(jt + 1);
      tc::cp_async_wait<1>();
    } else {
      tc::cp_async_wait<0>();
    }
    __syncthreads();  // tile jt is in shared memory
    const uint16_t* sk = stages + (jt & 1) * 2 * TILE;
    const uint16_t* sv = sk + TILE;
    float s[NB][4], dp[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.f, dp[nb][e] = 0.f;
    tc_scores<LD, KB, NB>(s, qa, sk);
    tc_scores<LD, KB, NB>(dp, da, sv);
    // dS into s; `masked` false: all the warp's scores of the tile are
    // visible (whole tiles, the last key at or before the warp's first row,
    // and the warp's last row's document starting at or before the first key:
    // document starts are nondecreasing).
    auto ds = [&](auto masked) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, j = nb * 8 + 2 * t + (e & 1);
          bool vis = true;
          if constexpr (decltype(masked)::value)
            vis = r < nq && j < nk && j0 + j <= i0 + r && j0 + j >= (e < 2 ? d0 : d1);
          const float pr = vis ? tc::exp2_approx(fmaf(s[nb][e], sl2, -(e < 2 ? lse0 : lse1))) : 0.f;
          float d = dp[nb][e];
          if (p.drop && vis) d = keep(p, b, h, i0 + r, j0 + j) ? d * p.inv_keep : 0.f;
          s[nb][e] = pr * (d - (e < 2 ? di0 : di1)) * p.scale;
        }
    };
    if (wl < nq && nk == BK && j0 + BK - 1 <= i0 + warp * 16 && j0 >= dw) ds(std::false_type{});
    else ds(std::true_type{});
#pragma unroll
    for (int jb = 0; jb < BK / 16; ++jb) tc_accumulate<LD, DN>(dq, s[2 * jb], s[2 * jb + 1], sk, jb * 16);
    __syncthreads();  // every reader of this stage is done before load_tile(jt + 2) refills it
  }
  if (r0 < nq) {
    Yg* row = dqkv_b + (i0 + r0) * ldq + qc;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) tc::store2(row + dn * 8 + 2 * t, dq[dn][0], dq[dn][1]);
  }
  if (r1 < nq) {
    Yg* row = dqkv_b + (i0 + r1) * ldq + qc;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) tc::store2(row + dn * 8 + 2 * t, dq[dn][2], dq[dn][3]);
  }
}

// ---------------------------------------------------------------------------
// Host side.

unsigned tiles(int64_t n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <typename Tin, typename A, typename Y, int DM>
void launch_fwd(const Tin* qkv, Y* out, A* lse, const Params<A>& p) {
  using C = typename Cfg<A, DM>::Fwd;
  const dim3 grid(static_cast<unsigned>(p.qc.tiles(C::BQ)), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  attn_fwd<Tin, A, Y, DM, C::BQ, C::BK, C::NT><<<grid, C::NT, 0, ::mt::cuda::stream()>>>(qkv, out, lse, p);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename Tin, typename A, typename Yd, typename Yg, int DM>
void launch_bwd(const Tin* qkv, const Yd* dout, const A* lse, Yg* dqkv, const Params<A>& p) {
  using K = typename Cfg<A, DM>::Dkv;
  using Q = typename Cfg<A, DM>::Dq;
  const unsigned G = static_cast<unsigned>(p.H / p.qpg);
  const dim3 gkv(tiles(p.T, K::BK), G, static_cast<unsigned>(p.B));
  attn_bwd_dkv<Tin, A, Yd, Yg, DM, K::BQ, K::BK, K::NT><<<gkv, K::NT, 0, ::mt::cuda::stream()>>>(qkv, dout, lse,
                                                                                                 dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
  const dim3 gq(static_cast<unsigned>(p.qc.tiles(Q::BQ)), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  attn_bwd_dq<Tin, A, Yd, Yg, DM, Q::BQ, Q::BK, Q::NT><<<gq, Q::NT, 0, ::mt::cuda::stream()>>>(qkv, dout, lse, dqkv,
                                                                                              p);
  MT_CUDA_CHECK_LAUNCH();
}

// Whether the tensor-core kernels take a call: allowed by the options, a
// head_dim they are built for, a positive scale, fp32 accumulation, and 16-byte aligned
// tensors (their vector loads; every row pitch and column offset is then a
// multiple of 16 bytes, since head_dim is). The same for fp32 and bf16 out,
// dout and dqkv.
template <typename Tin, typename A>
bool use_tc(const QkvLayout& L, const AttentionOptions& o, std::initializer_list<const void*> ptrs) {
  if constexpr (!std::is_same_v<A, float>) {
    return false;
  } else {
    if (!o.bf16_matmul || (L.head_dim != 64 && L.head_dim != 128)) return false;
    // The forward's row maxima are taken on unscaled scores (the same maxima
    // only for a positive scale); the SIMT kernels take any other.
    if (!(o.scale > 0)) return false;
    for (const void* ptr : ptrs)
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
    return true;
  }
}

// Above 48 KB a kernel's dynamic shared memory must be allowed first; done
// once per kernel and device (the attribute belongs to the device's context;
// the larger tensor-core kernels need it).
template <auto Kernel>
void allow_dynamic_shared(size_t bytes) {
  static std::mutex mu;
  static std::vector<int> allowed;  // devices
  const int device = ::mt::cuda::current_device();
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(allowed.begin(), allowed.end(), device) != allowed.end()) return;
  MT_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  allowed.push_back(device);
}

// A tensor-core grid (see tc_block): ntiles x heads x batch blocks, at most
// 2^31 - 1.
unsigned tc_grid(int64_t ntiles, int64_t heads, int64_t batch) {
  const int64_t n = ntiles * heads * batch;
  MT_CHECK(n <= 0x7fffffff, fmt::format("attention (CUDA): {} tiles of 64 x {} heads x {} sequences = {} blocks, "
                                        "above a grid's 2^31 - 1; use a smaller micro-batch or more tensor "
                                        "parallelism",
                                        ntiles, heads, batch, n));
  return static_cast<unsigned>(n);
}

template <typename Tin, typename Y, int D>
void launch_fwd_tc(const Tin* qkv, Y* out, float* lse, const Params<float>& p) {
  constexpr size_t smem = fwd_tc_smem<D>();
  allow_dynamic_shared<attn_fwd_tc<Tin, Y, D>>(smem);
  const unsigned grid = tc_grid(p.qc.tiles(kTcFwdBQ), p.H, p.B);
  attn_fwd_tc<Tin, Y, D><<<grid, kTcThreads, smem, ::mt::cuda::stream()>>>(qkv, out, lse, p);
  MT_CUDA_CHECK_LAUNCH();
}

// Backward 2 and 3 on tensor cores (after attn_bwd_di).
std::atomic<bool> g_dkv_lean{false};

template <typename Tin, typename Yd, typename Yg, int D, bool kLean>
void launch_dkv_tc(const Tin* qkv, const Yd* dout, const float* lse, Yg* dqkv, const Params<float>& p) {
  constexpr size_t kv_smem = dkv_tc_smem<D>();
  allow_dynamic_shared<attn_bwd_dkv_tc<Tin, Yd, Yg, D, kLean>>(kv_smem);
  const unsigned gkv = tc_grid(tiles(p.T, kTcDkvBK), p.H / p.qpg, p.B);
  attn_bwd_dkv_tc<Tin, Yd, Yg, D, kLean><<<gkv, kTcThreads, kv_smem, ::mt::cuda::stream()>>>(qkv, dout, lse,
                                                                                                  dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename Tin, typename Yd, typename Yg, int D>
void launch_bwd_tc(const Tin* qkv, const Yd* dout, const float* lse, Yg* dqkv, const Params<float>& p) {
  constexpr size_t q_smem = dq_tc_smem<D>();
  allow_dynamic_shared<attn_bwd_dq_tc<Tin, Yd, Yg, D>>(q_smem);
  if (g_dkv_lean.load(std::memory_order_relaxed)) launch_dkv_tc<Tin, Yd, Yg, D, true>(qkv, dout, lse, dqkv, p);
  else launch_dkv_tc<Tin, Yd, Yg, D, false>(qkv, dout, lse, dqkv, p);
  const unsigned gq = tc_grid(p.qc.tiles(kTcDqBQ), p.H, p.B);
  attn_bwd_dq_tc<Tin, Yd, Yg, D><<<gq, kTcThreads, q_smem, ::mt::cuda::stream()>>>(qkv, dout, lse, dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename Tin, typename A, typename Y>
void fwd(const Tin* qkv, const QkvLayout& L, const AttentionOptions& o, Y* out, A* lse) {
  const Params<A> p = make_params<A>(L, o);
  if constexpr (std::is_same_v<A, float>) {
    if (use_tc<Tin, A>(L, o, {qkv, out})) {
      if (p.D == 64) launch_fwd_tc<Tin, Y, 64>(qkv, out, lse, p);
      else launch_fwd_tc<Tin, Y, 128>(qkv, out, lse, p);
      return;
    }
  }
  if (p.D <= 64) launch_fwd<Tin, A, Y, 64>(qkv, out, lse, p);
  else if (p.D <= 128) launch_fwd<Tin, A, Y, 128>(qkv, out, lse, p);
  else launch_fwd<Tin, A, Y, 256>(qkv, out, lse, p);
}

template <typename Tin, typename A, typename Yo, typename Yd, typename Yg>
void bwd(const Tin* qkv, const Yo* out, const Yd* dout, const A* lse, const QkvLayout& L, const AttentionOptions& o,
         Yg* dqkv) {
  const Params<A> p = make_params<A>(L, o);
  const bool tc = use_tc<Tin, A>(L, o, {qkv, dout, dqkv});
  if (tc) tc_grid(tiles(p.T, kTcDkvBK), p.H / p.qpg, p.B), tc_grid(p.qc.tiles(kTcDqBQ), p.H, p.B);  // before any launch
  const int64_t rows = p.Tq * p.B * p.H;
  attn_bwd_di<A, Yo, Yd, Yg><<<::mt::cuda::blocks_for(rows, kDiThreads / 32), kDiThreads, 0, ::mt::cuda::stream()>>>(
      out, dout, dqkv, p);
  MT_CUDA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<A, float>) {
    if (tc) {
      if (p.D == 64) launch_bwd_tc<Tin, Yd, Yg, 64>(qkv, dout, lse, dqkv, p);
      else launch_bwd_tc<Tin, Yd, Yg, 128>(qkv, dout, lse, dqkv, p);
      return;
    }
  }
  if (p.D <= 64) launch_bwd<Tin, A, Yd, Yg, 64>(qkv, dout, lse, dqkv, p);
  else if (p.D <= 128) launch_bwd<Tin, A, Yd, Yg, 128>(qkv, dout, lse, dqkv, p);
  else launch_bwd<Tin, A, Yd, Yg, 256>(qkv, dout, lse, dqkv, p);
}

// The CPU twin's checks (same messages), plus where the tensors live and the
// grid limits.
void check(const Tensor& qkv, const QkvLayout& L, const AttentionOptions& o, const Tensor& out, const Tensor& lse) {
  L.check();
  check_options(L, o, qkv);
  const int64_t Tq = query_chunks(L, o).rows();
  MT_CHECK(L.head_dim <= kAttnMaxHeadDim, "attention: head_dim above kAttnMaxHeadDim");
  MT_CHECK(qkv.numel() == L.tokens() * L.row(), "attention: qkv size does not match the layout");
  MT_CHECK(out.numel() == Tq * L.batch * L.heads * L.head_dim, "attention: out must be [T/cp*B, a*d]");
  MT_CHECK(lse.numel() == L.batch * L.heads * Tq, "attention: lse must be [B, a, T/cp]");
  MT_CHECK(qkv.device() == Device::kCuda && out.device() == Device::kCuda && lse.device() == Device::kCuda,
           "attention (CUDA): tensors must be on the GPU");
  MT_CHECK(L.heads <= 65535 && L.batch <= 65535, "attention (CUDA): heads and batch must be <= 65535 (grid y, z)");
}

}  // namespace

void attention_forward(const Tensor& qkv, const QkvLayout& L, const AttentionOptions& o, const Tensor& out,
                       const Tensor& lse) {
  check(qkv, L, o, out, lse);
  constexpr const char* op = "attention_forward";
  attention_qkv_types(qkv.dtype(), op, [&](auto tin) {
    using Tin = decltype(tin);
    using A = AttnAcc<Tin>;
    attention_check_lse<Tin>(lse.dtype(), op);
    attention_types<Tin>(out.dtype(), op, "out", [&](auto yo) {
      using Y = decltype(yo);
      fwd<Tin, A, Y>(qkv.ptr<Tin>(), L, o, out.ptr<Y>(), lse.ptr<A>());
    });
  });
}

void set_dkv_lean(bool on) { g_dkv_lean.store(on, std::memory_order_relaxed); }

bool attention_uses_tensor_cores(const Tensor& qkv, const QkvLayout& L, const AttentionOptions& o) {
  const void* p = qkv.data();
  switch (qkv.dtype()) {
    case DType::kF32: return use_tc<float, float>(L, o, {p});
    case DType::kBF16: return use_tc<bf16, float>(L, o, {p});
    default: return false;
  }
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                        const QkvLayout& L, const AttentionOptions& o, const Tensor& dqkv) {
  check(qkv, L, o, out, lse);
  MT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention_backward: sizes");
  MT_CHECK(dout.device() == Device::kCuda && dqkv.device() == Device::kCuda,
           "attention (CUDA): tensors must be on the GPU");
  MT_CHECK(dqkv.dtype() != DType::kBF16 || L.head_dim >= 2,
           "attention_backward (CUDA): a bf16 dqkv needs head_dim >= 2 (D is parked in its q slot as fp32)");
  constexpr const char* op = "attention_backward";
  attention_qkv_types(qkv.dtype(), op, [&](auto tin) {
    using Tin = decltype(tin);
    using A = AttnAcc<Tin>;
    attention_check_lse<Tin>(lse.dtype(), op);
    attention_types<Tin>(out.dtype(), op, "out", [&](auto yo) {
      attention_types<Tin>(dout.dtype(), op, "dout", [&](auto yd) {
        attention_types<Tin>(dqkv.dtype(), op, "dqkv", [&](auto yg) {
          using Yo = decltype(yo);
          using Yd = decltype(yd);
          using Yg = decltype(yg);
          bwd<Tin, A, Yo, Yd, Yg>(qkv.ptr<Tin>(), out.ptr<Yo>(), dout.ptr<Yd>(), lse.ptr<A>(), L, o, dqkv.ptr<Yg>());
        });
      });
    });
  });
}

}  // namespace mt::kernels::cuda
