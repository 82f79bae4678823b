// CUDA twins of kernels/cpu/norm.cc: LayerNorm and RMSNorm over the last
// dimension of x [N, C], fp32 or fp64, x/dx and dy also bf16 with fp32
// parameters (kernels/norm.h has the contract; bf16 values are widened as
// loaded and a bf16 dx rounded once as stored, as in the CPU twin).
//
// Rows whose length C is a multiple of 8 from 1024 to 4096 (the hidden
// sizes of the models trained here), with fp32 parameters and 16-byte
// aligned tensors, take the packed kernels (norm_fwd_packed,
// norm_bwd_packed: each thread moves 8 consecutive columns as one 16-byte
// bf16 load, 4 rows share their barriers; see packed_fits). Other rows
// (--qk-layernorm's heads, narrower models, fp64), and every row when a
// benchmark turns the packed kernels off (set_norm_packed(false)), take the
// column-a-thread kernels below (the ones timed on the H200:
// bench/cuda_h200_notes.md).
//
// Forward: one block of kThreads per row. The mean and the variance are
// accumulated in double for fp32 too (as the CPU twin does): each thread sums
// a strided subset of the row, then block_sum (fixed-shape tree). The row is
// read again for the variance (two-pass, like the CPU) and for y; it stays in
// L1/L2. mean/rstd are rounded to T exactly where the CPU twin rounds them.
// y (x's dtype, or bf16 for fp32 x: a GEMM input under --bf16) may alias x
// when it has x's dtype: each thread writes only the elements it read, after the
// block's last barrier.
//
// Column-a-thread backward (dx += ..., dw += ..., db += ...) for rows up to
// 4096 wide: norm_bwd_fused, one block per 16 rows or
// more, does the dx arithmetic of kernel 2 below row by row while its threads
// add dy * xhat and dy of their columns; the block stores those column
// partials, and norm_bwd_chunk_sum adds the chunks' partials onto dw/db in a
// fixed order. dy and x are read from memory once instead of twice, and no
// atomics: deterministic. Wider rows take the three kernels below:
//   1. the column sums dw[c] += sum_i dy*xhat, db[c] += sum_i dy, in two
//      kernels so that the N rows are spread over many blocks:
//      norm_bwd_dwdb_part, grid (column tiles of 32, R row chunks), block
//      (32 columns) x (16 row lanes): lane ty sums its chunk's rows ty, ty+16,
//      ... in T, thread ty == 0 adds the 16 lane partials in lane order and
//      stores the chunk's partial (op scratch, [R][C] for dw and for db);
//      norm_bwd_dwdb_sum, one thread per column, adds the R partials in chunk
//      order onto dw/db. R depends only on N, so the order is fixed:
//      deterministic, no atomics.
//   2. norm_bwd_dx: one block per row; sum(g) and sum(g * xhat) in T by
//      block_sum, then dx[c] += rstd * (g - mean(g) - xhat * mean(g * xhat)).
// dw/db run first, so dx may even alias dy (each dx element is read and
// written by one thread after the row's sums are complete).
#include <algorithm>
#include <atomic>

#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/norm.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

constexpr int kColTile = 32;   // columns per dw/db block (one warp wide: coalesced row reads)
constexpr int kRowLanes = 16;  // row lanes per dw/db block

// One block per row i. mean may be null (RMSNorm, or LayerNorm called
// without it), b may be null.
template <typename T, typename X, typename Y>
__global__ void norm_fwd(int64_t C, const X* x, const T* __restrict__ w, const T* __restrict__ b,
                         double eps, Y* y, T* mean, T* rstd, bool rms) {
  const int64_t i = blockIdx.x;
  const X* xi = x + i * C;
  Y* yi = y + i * C;
  double m = 0;
  if (!rms) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += static_cast<double>(ld<T>(xi[c]));
    m = block_sum(s) / static_cast<double>(C);
  }
  double v = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    double d = static_cast<double>(ld<T>(xi[c])) - m;
    v += d * d;
  }
  v = block_sum(v) / static_cast<double>(C);
  const T mu = static_cast<T>(m), r = static_cast<T>(1.0 / sqrt(v + eps));
  // Every thread has passed the block_sum barriers, so writing y over x (y
  // aliasing x) cannot race with the reads above.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    T o = (ld<T>(xi[c]) - mu) * r * w[c];
    yi[c] = to_out<Y>(b ? o + b[c] : o);
  }
  if (threadIdx.x == 0) {
    if (mean) mean[i] = mu;
    rstd[i] = r;
  }
}

// Column sums of a (kColTile, kRowLanes) block: thread (tx, ty) brings its
// lane's sums sw, sb of column tx; thread ty == 0 gets the kRowLanes lanes
// added in lane order (a fixed order: deterministic). Every thread calls it.
template <typename T>
__device__ void add_row_lanes(T sw, T sb, T& tw, T& tb) {
  __shared__ T lw[kRowLanes][kColTile];
  __shared__ T lb[kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  lw[ty][tx] = sw;
  lb[ty][tx] = sb;
  __syncthreads();
  tw = 0, tb = 0;
  if (ty == 0)
    for (int k = 0; k < kRowLanes; ++k) {
      tw += lw[k][tx];
      tb += lb[k][tx];
    }
}

// Rows per chunk of the column sums: enough chunks to fill the GPU for
// the token counts of training (8192 rows: 32 chunks of 256), at least 64 rows
// per chunk (4 per row lane).
constexpr int64_t kMaxRowChunks = 64;
inline int64_t row_chunks(int64_t N) { return std::clamp<int64_t>(N / 256, 1, kMaxRowChunks); }

// Partial column sums of rows [r0, r1) of chunk blockIdx.y:
// pw[chunk][c] = sum dy[i,c] * xhat[i,c], pb[chunk][c] = sum dy[i,c] (pb may be null).
// Block (kColTile, kRowLanes); grid (ceil(C / kColTile), R).
template <typename T, typename X, typename D>
__global__ void norm_bwd_dwdb_part(int64_t N, int64_t C, const D* __restrict__ dy, const X* __restrict__ x,
                                   const T* __restrict__ mean, const T* __restrict__ rstd, T* __restrict__ pw,
                                   T* __restrict__ pb, bool rms) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t R = gridDim.y, chunk = blockIdx.y;
  const int64_t r0 = N * chunk / R, r1 = N * (chunk + 1) / R;
  T sw = 0, sb = 0;
  if (c < C) {
    for (int64_t i = r0 + ty; i < r1; i += kRowLanes) {
      const T mu = rms ? T(0) : mean[i];
      const T d = ld<T>(dy[i * C + c]);
      const T xh = (ld<T>(x[i * C + c]) - mu) * rstd[i];
      sw += d * xh;
      sb += d;
    }
  }
  T tw, tb;
  add_row_lanes(sw, sb, tw, tb);
  if (ty == 0 && c < C) {
    pw[chunk * C + c] = tw;
    if (pb) pb[chunk * C + c] = tb;
  }
}

// dw[c] += sum over chunks of pw[chunk][c] in chunk order; likewise db.
template <typename T>
__global__ void norm_bwd_dwdb_sum(int64_t C, int64_t R, const T* __restrict__ pw, const T* __restrict__ pb, T* dw,
                                  T* db) {
  for (int64_t c = gs_begin(); c < C; c += gs_stride()) {
    T tw = 0, tb = 0;
    for (int64_t r = 0; r < R; ++r) {
      tw += pw[r * C + c];
      if (db) tb += pb[r * C + c];
    }
    dw[c] += tw;
    if (db) db[c] += tb;
  }
}

// One block per row i: dx[i, :] += rstd * (g - mean(g) - xhat * mean(g xhat)), g = dy * w.
template <typename T, typename X, typename D>
__global__ void norm_bwd_dx(int64_t C, const D* dy, const X* __restrict__ x, const T* __restrict__ w,
                            const T* __restrict__ mean, const T* __restrict__ rstd, X* dx, bool rms) {
  const int64_t i = blockIdx.x;
  const D* dyi = dy + i * C;
  const X* xi = x + i * C;
  X* dxi = dx + i * C;
  const T mu = rms ? T(0) : mean[i], r = rstd[i];
  T sg = 0, sgx = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T xh = (ld<T>(xi[c]) - mu) * r;
    const T g = ld<T>(dyi[c]) * w[c];
    sg += g;
    sgx += g * xh;
  }
  sg = block_sum(sg);
  sgx = block_sum(sgx);
  const T mg = rms ? T(0) : sg / static_cast<T>(C), mgx = sgx / static_cast<T>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T xh = (ld<T>(xi[c]) - mu) * r;
    dxi[c] = to_out<X>(ld<T>(dxi[c]) + r * (ld<T>(dyi[c]) * w[c] - mg - xh * mgx));
  }
}

// ---- the packed kernels' layout (forward and backward): C a multiple of
// kPackW from kThreads * kPackW / 2 to kThreads * kPackW * kMaxPacks (at
// least half the threads busy: narrower rows, such as --qk-layernorm's
// heads of 128, would leave most of a block idle and stay with the column
// kernels), every pointer 16-byte aligned (so every row is). Thread t owns the packs of kPackW consecutive columns
// starting at kPackW * (t + kThreads * j): a bf16 row moves as one 16-byte
// load or store per thread and pack, 8 times fewer memory instructions than
// a column a thread. kGroupRows rows go together: their loads are in flight
// together and their sums share the barriers.
constexpr int kPackW = 8;      // columns per pack: 16 bytes of bf16
constexpr int kMaxPacks = 2;   // packs per thread: C up to 4096
constexpr int kGroupRows = 4;  // rows per group

// The packed kernels serve fp32 parameters (fp32 or bf16 rows); fp64, a
// reference dtype whose speed does not matter, keeps to the column kernels.
template <typename T>
inline constexpr bool kPackedTypes = sizeof(T) == 4;

// Whether a row length and these pointers (null ones aside) take the packed kernels.
inline bool packed_fits(int64_t C, std::initializer_list<const void*> ps) {
  return C % kPackW == 0 && C >= int64_t{kThreads} * kPackW / 2 && C <= int64_t{kThreads} * kPackW * kMaxPacks &&
         packs_fit(16, ps);
}

// The packs a thread owns: pack j starts at column col[j] and lies in the
// row when on[j] (C a multiple of kPackW: wholly in it or wholly past it;
// C <= 4096: int columns).
template <int NP>
struct ThreadPacks {
  int col[NP];
  bool on[NP];
  __device__ __forceinline__ explicit ThreadPacks(int64_t C) {
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      col[j] = kPackW * (static_cast<int>(threadIdx.x) + kThreads * j);
      on[j] = col[j] < static_cast<int>(C);
    }
  }
};

// f(g, j) for the first `rows` rows g of a group of G (the others lie past
// the rows' end) and the packs j of the row, rows in order, unrolled.
template <int G, int NP, typename F>
__device__ __forceinline__ void each_pack(const ThreadPacks<NP>& tp, int64_t rows, F&& f) {
#pragma unroll
  for (int g = 0; g < G; ++g)
    if (g < rows) {
#pragma unroll
      for (int j = 0; j < NP; ++j)
        if (tp.on[j]) f(g, j);
    }
}

// s[k], first <= k < K, summed over the block into every thread's s[k]: warp
// trees to lane 0, lane 0 into part, one barrier, then each thread adds the
// warps' values in warp order (the same bits in every thread). The caller
// sees to it that no thread still reads part from an earlier call (separate
// tables, or a barrier between).
template <int K, typename T>
__device__ __forceinline__ void block_sums(T (&s)[K], T (&part)[kThreads / 32][K], int first = 0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k < first) continue;
    const T v = warp_sum_to_lane0(s[k]);
    if (lane == 0) part[warp][k] = v;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k < first) continue;
    T t = 0;
    for (int q = 0; q < kThreads / 32; ++q) t += part[q][k];
    s[k] = t;
  }
}

// The forward of kGroupRows rows a block (rows past N are skipped): the rows
// are read once into registers (norm_fwd reads a row three times), and the
// sums of a group take one barrier each. norm_fwd's formulas (sums in
// double, mu and rstd rounded to T, y from T values) in another summation
// order (8 consecutive columns a thread, the warps added in order), so mu
// and rstd may differ from norm_fwd's in the last bit. y may alias x (each
// thread writes only the elements it holds).
template <typename T, typename X, typename Y, int NP>
__global__ void __launch_bounds__(kThreads)
    norm_fwd_packed(int64_t N, int64_t C, const X* x, const T* __restrict__ w, const T* __restrict__ b, double eps,
                    Y* y, T* mean, T* rstd, bool rms) {
  constexpr int W = kPackW, G = kGroupRows, kWarps = kThreads / 32;
  __shared__ double part_m[kWarps][G], part_v[kWarps][G];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * G, rows = N - i0;
  const ThreadPacks<NP> tp(C);
  Pack<X, W> xv[G][NP];
  each_pack<G>(tp, rows, [&](int g, int j) { xv[g][j] = ld_pack<W>(x + (i0 + g) * C + tp.col[j]); });
  double m[G] = {};
  if (!rms) {
    each_pack<G>(tp, rows, [&](int g, int j) {
#pragma unroll
      for (int e = 0; e < W; ++e) m[g] += static_cast<double>(ld<T>(xv[g][j].v[e]));
    });
    block_sums(m, part_m);
#pragma unroll
    for (int g = 0; g < G; ++g) m[g] /= static_cast<double>(C);
  }
  double v[G] = {};
  each_pack<G>(tp, rows, [&](int g, int j) {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const double d = static_cast<double>(ld<T>(xv[g][j].v[e])) - m[g];
      v[g] += d * d;
    }
  });
  block_sums(v, part_v);
  T mu[G], r[G];
#pragma unroll
  for (int g = 0; g < G; ++g)
    mu[g] = static_cast<T>(m[g]), r[g] = static_cast<T>(1.0 / sqrt(v[g] / static_cast<double>(C) + eps));
  // w and b are loaded again for each row of the group (L1 hits): held in
  // registers for the whole group they take ptxas sm_90a from 78 registers
  // to 100, three blocks an SM to two.
  each_pack<G>(tp, rows, [&](int g, int j) {
    const Pack<T, W> wp = ld_pack<W>(w + tp.col[j]);
    Pack<T, W> bp{};
    if (b) bp = ld_pack<W>(b + tp.col[j]);
    Pack<Y, W> out;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const T o = (ld<T>(xv[g][j].v[e]) - mu[g]) * r[g] * wp.v[e];
      out.v[e] = to_out<Y>(b ? o + bp.v[e] : o);
    }
    st_pack<W>(y + (i0 + g) * C + tp.col[j], out);
  });
  if (threadIdx.x == 0)
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (g < rows) {
        if (mean) mean[i0 + g] = mu[g];
        rstd[i0 + g] = r[g];
      }
}

// set_norm_packed: the packed kernels where they fit (the default).
std::atomic<bool> g_norm_packed{true};

template <typename T, typename X, typename Y>
void launch_fwd(int64_t N, int64_t C, const X* x, const T* w, const T* b, T eps, Y* y, T* mean, T* rstd, bool rms) {
  if (N == 0) return;
  // eps goes through T first, as in the CPU twin (static_cast<T>(eps) then back to double).
  if constexpr (kPackedTypes<T>) {
    if (g_norm_packed.load(std::memory_order_relaxed) && packed_fits(C, {x, y, w, b})) {
      const unsigned blocks = row_grid((N + kGroupRows - 1) / kGroupRows);
      if (C <= int64_t{kThreads} * kPackW)
        norm_fwd_packed<T, X, Y, 1><<<blocks, kThreads, 0, ::mt::cuda::stream()>>>(
            N, C, x, w, b, static_cast<double>(eps), y, mean, rstd, rms);
      else
        norm_fwd_packed<T, X, Y, 2><<<blocks, kThreads, 0, ::mt::cuda::stream()>>>(
            N, C, x, w, b, static_cast<double>(eps), y, mean, rstd, rms);
      MT_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  norm_fwd<T, X, Y><<<row_grid(N), kThreads, 0, ::mt::cuda::stream()>>>(
      C, x, w, b, static_cast<double>(eps), y, mean, rstd, rms);
  MT_CUDA_CHECK_LAUNCH();
}

// ---- the one-pass backward (C <= kThreads * kMaxFusedCols)

constexpr int kMaxFusedCols = 16;  // columns per thread: C up to 4096
// Rows per block: at least 16 (512 blocks at training's 8192 rows: enough
// to fill the GPU) and at most 512 chunks whatever N is, so the column
// partials (op scratch, 2 x chunks x C) stay within 16 MiB for fp32 rows of
// 4096.
constexpr int64_t kMaxFusedChunks = 512;
inline int64_t fused_rows(int64_t N) { return std::max<int64_t>(16, (N + kMaxFusedChunks - 1) / kMaxFusedChunks); }

// Block b owns rows [b * rows, min(N, (b + 1) * rows)) and, per row, does
// norm_bwd_dx's arithmetic (same per-thread column order and block_sum, so
// the same dx bits) while each thread adds dy * xhat and dy of its columns
// c = tid + k * blockDim.x over the block's rows in order; at the end the
// block stores those column partials as chunk b of pw (and pb). dy, x and dx
// are read once from memory. Every dy element a thread uses is in its
// registers before the row's barriers, so dx may alias dy.
// (C <= 4096: column indices in int. fp32 up to 8 columns a thread is
// bounded to 128 registers, so that two blocks share an SM; 16 would spill.)
template <typename T, typename X, typename D, int NC>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 && NC <= 8 ? 2 : 1)
    norm_bwd_fused(int64_t N, int64_t C, int64_t rows, const D* dy, const X* __restrict__ x,
                               const T* __restrict__ w, const T* __restrict__ mean, const T* __restrict__ rstd, X* dx,
                               T* __restrict__ pw, T* __restrict__ pb, bool rms) {
  const int64_t chunk = blockIdx.x, r0 = chunk * rows, r1 = min(N, r0 + rows);
  const int Ci = static_cast<int>(C);
  T aw[NC], ab[NC], wc[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c = static_cast<int>(threadIdx.x + k * blockDim.x);
    aw[k] = T(0), ab[k] = T(0), wc[k] = c < Ci ? w[c] : T(0);
  }
  // Row i's dy, x and dx are loaded while row i - 1 is reduced (its loads
  // are in flight across that row's barriers): next_d / next_x / next_o hold
  // the row ahead. (Row i + 1 of dx is written only in its own turn, so its
  // early read sees what the caller passed, dy's values where dx aliases dy.)
  T next_d[NC] = {}, next_x[NC] = {}, next_o[NC] = {};
  auto load_row = [&](int64_t i) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = static_cast<int>(threadIdx.x + k * blockDim.x);
      if (c < Ci) next_d[k] = ld<T>(dy[i * C + c]), next_x[k] = ld<T>(x[i * C + c]), next_o[k] = ld<T>(dx[i * C + c]);
    }
  };
  if (r0 < r1) load_row(r0);
  for (int64_t i = r0; i < r1; ++i) {
    const T mu = rms ? T(0) : mean[i], r = rstd[i];
    T d[NC], xh[NC], o[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) d[k] = next_d[k], xh[k] = next_x[k], o[k] = next_o[k];
    if (i + 1 < r1) load_row(i + 1);  // (rows i + 1 of dy are not rows i of dx: dx may alias dy)
    T sg = 0, sgx = 0;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = static_cast<int>(threadIdx.x + k * blockDim.x);
      if (c < Ci) {
        xh[k] = (xh[k] - mu) * r;
        const T g = d[k] * wc[k];
        sg += g;
        sgx += g * xh[k];
        aw[k] += d[k] * xh[k];
        ab[k] += d[k];
      }
    }
    if (!rms) sg = block_sum(sg);  // RMSNorm has no mean term: one reduction a row, not two
    sgx = block_sum(sgx);
    const T mg = rms ? T(0) : sg / static_cast<T>(C), mgx = sgx / static_cast<T>(C);
    X* dxi = dx + i * C;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = static_cast<int>(threadIdx.x + k * blockDim.x);
      if (c < Ci) dxi[c] = to_out<X>(o[k] + r * (d[k] * wc[k] - mg - xh[k] * mgx));
    }
  }
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c = static_cast<int>(threadIdx.x + k * blockDim.x);
    if (c < Ci) {
      pw[chunk * C + c] = aw[k];
      if (pb) pb[chunk * C + c] = ab[k];
    }
  }
}

// dw[c] += sum over the R chunks of pw[chunk][c] (likewise db), in a fixed
// order: block (kColTile columns, kRowLanes lanes), lane ty adds chunks ty,
// ty + kRowLanes, ... in order, then add_row_lanes. Grid: ceil(C / kColTile)
// blocks.
template <typename T>
__global__ void norm_bwd_chunk_sum(int64_t C, int64_t R, const T* __restrict__ pw, const T* __restrict__ pb, T* dw,
                                   T* db) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  T sw = 0, sb = 0;
  if (c < C) {
#pragma unroll 4  // (the loads of four chunks in flight at once; the adds stay in order)
    for (int64_t r = ty; r < R; r += kRowLanes) {
      sw += pw[r * C + c];
      if (pb) sb += pb[r * C + c];
    }
  }
  T tw, tb;
  add_row_lanes(sw, sb, tw, tb);
  if (ty == 0 && c < C) {
    dw[c] += tw;
    if (db) db[c] += tb;
  }
}

template <typename T, typename X, typename D, int NC>
void launch_bwd_fused(int64_t N, int64_t C, const D* dy, const X* x, const T* w, const T* mean, const T* rstd, X* dx,
                      T* dw, T* db, bool rms) {
  const int64_t rows = fused_rows(N), R = (N + rows - 1) / rows;
  T* pw = static_cast<T*>(::mt::cuda::op_scratch("norm backward column partials",
                                                  static_cast<size_t>(2 * R * C) * sizeof(T)));
  T* pb = db ? pw + R * C : nullptr;
  norm_bwd_fused<T, X, D, NC><<<static_cast<unsigned>(R), kThreads, 0, ::mt::cuda::stream()>>>(N, C, rows, dy, x, w, mean,
                                                                                           rstd, dx, pw, pb, rms);
  MT_CUDA_CHECK_LAUNCH();
  const dim3 block(kColTile, kRowLanes), grid(::mt::cuda::blocks_for(C, kColTile));
  norm_bwd_chunk_sum<T><<<grid, block, 0, ::mt::cuda::stream()>>>(C, R, pw, pb, dw, db);
  MT_CUDA_CHECK_LAUNCH();
}

// ---- the packed backward (packed_fits): norm_bwd_fused's arithmetic in
// the packed layout (a bf16 row's dy, x and dx as one 16-byte load per
// thread and pack), a group of rows at a time (their loads in flight
// together, their sums reduced in one pass: one barrier per group instead of
// two per row), and every thread adds the warps' partial sums itself from a
// double-buffered shared table (no second barrier to broadcast a total).
// Column partials as in norm_bwd_fused (rows in order per column), then
// norm_bwd_chunk_sum. Deterministic: fixed shapes, no atomics.
// Rows per block: N / 256 rounded up, so at most 256 chunks whatever N is
// (training's 8192 rows: 256 blocks of 32, about one wave at two blocks an
// SM; the column partials then take 2 x 256 x C values). A chunk need not
// hold whole groups: its last group stops at the chunk's end.
constexpr int64_t kMaxPackedChunks = 256;
inline int64_t packed_rows(int64_t N) { return std::max<int64_t>(1, (N + kMaxPackedChunks - 1) / kMaxPackedChunks); }

// kRms: RMSNorm (no mean term, no column sums of dy). (Two blocks an SM:
// at most 128 registers; ptxas sm_90a: bf16 rows do not spill, fp32 rows up
// to 208 bytes. Two packs a thread take half the rows a group.)
template <typename T, typename X, typename D, int NP, bool kRms>
__global__ void __launch_bounds__(kThreads, 2)
    norm_bwd_packed(int64_t N, int64_t C, int64_t rows, const D* dy, const X* __restrict__ x,
                    const T* __restrict__ w, const T* __restrict__ mean, const T* __restrict__ rstd, X* dx,
                    T* __restrict__ pw, T* __restrict__ pb) {
  constexpr int W = kPackW, G = kGroupRows / NP, kWarps = kThreads / 32;
  // part[buffer][warp][k]: k < G the rows' sum(g), k >= G their sum(g xhat).
  // Group n uses buffer n % 2: a thread writes buffer b again two groups
  // later, after a barrier that every thread reaches only once it has read
  // buffer b's totals.
  __shared__ T part[2][kWarps][2 * G];
  const int64_t chunk = blockIdx.x, r0 = chunk * rows, r1 = min(N, r0 + rows);
  const ThreadPacks<NP> tp(C);
  T aw[NP][W], ab[NP][W], wc[NP][W];
#pragma unroll
  for (int j = 0; j < NP; ++j) {
    const Pack<T, W> wp = tp.on[j] ? ld_pack<W>(w + tp.col[j]) : Pack<T, W>{};
#pragma unroll
    for (int e = 0; e < W; ++e) aw[j][e] = T(0), ab[j][e] = T(0), wc[j][e] = wp.v[e];
  }
  int buf = 0;
  for (int64_t i0 = r0; i0 < r1; i0 += G, buf ^= 1) {
    const int64_t n = r1 - i0;  // the group's rows in the chunk: G, or fewer at its end
    // The group's dy and x, all loads issued before any is used (dx's are
    // issued after the barrier, before its first use: registers for two
    // blocks an SM). Rows past the chunk load nothing and add nothing. (dx
    // may alias dy: each thread reads its packs of both before it writes them.)
    Pack<D, W> d[G][NP];
    Pack<X, W> xv[G][NP], o[G][NP];
    T mu[G], r[G], s[2 * G] = {};
#pragma unroll
    for (int g = 0; g < G; ++g) {
      mu[g] = T(0), r[g] = T(0);
      if (g < n) {
        if constexpr (!kRms) mu[g] = mean[i0 + g];
        r[g] = rstd[i0 + g];
      }
    }
    each_pack<G>(tp, n, [&](int g, int j) {
      d[g][j] = ld_pack<W>(dy + (i0 + g) * C + tp.col[j]);
      xv[g][j] = ld_pack<W>(x + (i0 + g) * C + tp.col[j]);
    });
    // Rows in order, so each column's partials add rows in order.
    each_pack<G>(tp, n, [&](int g, int j) {
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const T dd = ld<T>(d[g][j].v[e]), xh = (ld<T>(xv[g][j].v[e]) - mu[g]) * r[g];
        const T gv = dd * wc[j][e];
        if constexpr (!kRms) s[g] += gv;
        s[G + g] += gv * xh;
        aw[j][e] += dd * xh;
        if constexpr (!kRms) ab[j][e] += dd;
      }
    });
    block_sums(s, part[buf], kRms ? G : 0);  // RMSNorm needs only sum(g xhat)
    each_pack<G>(tp, n, [&](int g, int j) { o[g][j] = ld_pack<W>(dx + (i0 + g) * C + tp.col[j]); });
    T mg[G], mgx[G];
#pragma unroll
    for (int g = 0; g < G; ++g)
      mg[g] = kRms ? T(0) : s[g] / static_cast<T>(C), mgx[g] = s[G + g] / static_cast<T>(C);
    each_pack<G>(tp, n, [&](int g, int j) {
      Pack<X, W> out;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const T xh = (ld<T>(xv[g][j].v[e]) - mu[g]) * r[g];
        out.v[e] = to_out<X>(ld<T>(o[g][j].v[e]) + r[g] * (ld<T>(d[g][j].v[e]) * wc[j][e] - mg[g] - xh * mgx[g]));
      }
      st_pack<W>(dx + (i0 + g) * C + tp.col[j], out);
    });
  }
#pragma unroll
  for (int j = 0; j < NP; ++j)
    if (tp.on[j]) {
      Pack<T, W> a, b;
#pragma unroll
      for (int e = 0; e < W; ++e) a.v[e] = aw[j][e], b.v[e] = ab[j][e];
      st_pack<W>(pw + chunk * C + tp.col[j], a);
      if (!kRms && pb) st_pack<W>(pb + chunk * C + tp.col[j], b);
    }
}

template <typename T, typename X, typename D, int NP>
void launch_bwd_packed(int64_t N, int64_t C, const D* dy, const X* x, const T* w, const T* mean, const T* rstd,
                       X* dx, T* dw, T* db, bool rms) {
  const int64_t rows = packed_rows(N), R = (N + rows - 1) / rows;
  T* pw = static_cast<T*>(::mt::cuda::op_scratch("norm backward column partials",
                                                  static_cast<size_t>(2 * R * C) * sizeof(T)));
  T* pb = db ? pw + R * C : nullptr;
  if (rms)
    norm_bwd_packed<T, X, D, NP, true><<<static_cast<unsigned>(R), kThreads, 0, ::mt::cuda::stream()>>>(
        N, C, rows, dy, x, w, mean, rstd, dx, pw, nullptr);
  else
    norm_bwd_packed<T, X, D, NP, false><<<static_cast<unsigned>(R), kThreads, 0, ::mt::cuda::stream()>>>(
        N, C, rows, dy, x, w, mean, rstd, dx, pw, pb);
  MT_CUDA_CHECK_LAUNCH();
  const dim3 block(kColTile, kRowLanes), grid(::mt::cuda::blocks_for(C, kColTile));
  norm_bwd_chunk_sum<T><<<grid, block, 0, ::mt::cuda::stream()>>>(C, R, pw, pb, dw, db);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T, typename X, typename D>
void launch_bwd(int64_t N, int64_t C, const D* dy, const X* x, const T* w, const T* mean, const T* rstd, X* dx,
                T* dw, T* db, bool rms) {
  if (N == 0 || C == 0) return;  // nothing to add (the CPU twin adds zeros)
  if constexpr (kPackedTypes<T>) {
    if (g_norm_packed.load(std::memory_order_relaxed) && packed_fits(C, {dy, x, dx, w})) {
      if (C <= int64_t{kThreads} * kPackW)
        return launch_bwd_packed<T, X, D, 1>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
      return launch_bwd_packed<T, X, D, 2>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
    }
  }
  const int64_t cols = (C + kThreads - 1) / kThreads;  // per thread
  if (cols <= 1) return launch_bwd_fused<T, X, D, 1>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
  if (cols <= 2) return launch_bwd_fused<T, X, D, 2>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
  if (cols <= 4) return launch_bwd_fused<T, X, D, 4>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
  if (cols <= 8) return launch_bwd_fused<T, X, D, 8>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
  if (cols <= kMaxFusedCols) return launch_bwd_fused<T, X, D, kMaxFusedCols>(N, C, dy, x, w, mean, rstd, dx, dw, db, rms);
  // Wider rows: the three-kernel backward below.
  const int64_t R = row_chunks(N);
  T* pw = static_cast<T*>(::mt::cuda::op_scratch("norm backward column partials",
                                                  static_cast<size_t>(2 * R * C) * sizeof(T)));
  T* pb = db ? pw + R * C : nullptr;
  const dim3 block(kColTile, kRowLanes), grid(::mt::cuda::blocks_for(C, kColTile), static_cast<unsigned>(R));
  norm_bwd_dwdb_part<T, X, D><<<grid, block, 0, ::mt::cuda::stream()>>>(N, C, dy, x, mean, rstd, pw, pb, rms);
  MT_CUDA_CHECK_LAUNCH();
  norm_bwd_dwdb_sum<T><<<grid_for(C), kThreads, 0, ::mt::cuda::stream()>>>(C, R, pw, pb, dw, db);
  MT_CUDA_CHECK_LAUNCH();
  norm_bwd_dx<T, X, D><<<row_grid(N), kThreads, 0, ::mt::cuda::stream()>>>(C, dy, x, w, mean, rstd, dx, rms);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void set_norm_packed(bool on) { g_norm_packed.store(on, std::memory_order_relaxed); }

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd) {
  int64_t C = x.dim(-1), N = C == 0 ? 0 : x.numel() / C;
  MT_CHECK(w.numel() == C && y.numel() == x.numel() && rstd.numel() >= N && mean.numel() >= N,
           "layernorm_forward: shapes");
  check_on_gpu({&x, &w, &b, &y, &mean, &rstd}, "layernorm_forward");
  norm_fwd_types(x.dtype(), w.dtype(), y.dtype(), "layernorm_forward", [&](auto t_, auto x_, auto y_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using Y = decltype(y_);
    launch_fwd<T, X, Y>(N, C, x.ptr<X>(), w.ptr<T>(), opt_ptr<T>(b), static_cast<T>(eps), y.ptr<Y>(), mean.ptr<T>(),
                        rstd.ptr<T>(), false);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  int64_t C = x.dim(-1), N = C == 0 ? 0 : x.numel() / C;
  MT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dw.numel() == C, "layernorm_backward: shapes");
  check_on_gpu({&dy, &x, &w, &mean, &rstd, &dx, &dw, &db}, "layernorm_backward");
  norm_bwd_types(dy.dtype(), x.dtype(), w.dtype(), dx.dtype(), "layernorm_backward", [&](auto t_, auto x_, auto d_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using D = decltype(d_);
    launch_bwd<T, X, D>(N, C, dy.ptr<D>(), x.ptr<X>(), w.ptr<T>(), mean.ptr<T>(), rstd.ptr<T>(), dx.ptr<X>(),
                        dw.ptr<T>(), opt_ptr<T>(db), false);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) {
  int64_t C = x.dim(-1), N = C == 0 ? 0 : x.numel() / C;
  MT_CHECK(w.numel() == C && y.numel() == x.numel() && rstd.numel() >= N, "rmsnorm_forward: shapes");
  check_on_gpu({&x, &w, &y, &rstd}, "rmsnorm_forward");
  norm_fwd_types(x.dtype(), w.dtype(), y.dtype(), "rmsnorm_forward", [&](auto t_, auto x_, auto y_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using Y = decltype(y_);
    launch_fwd<T, X, Y>(N, C, x.ptr<X>(), w.ptr<T>(), nullptr, static_cast<T>(eps), y.ptr<Y>(), nullptr,
                        rstd.ptr<T>(), true);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw) {
  int64_t C = x.dim(-1), N = C == 0 ? 0 : x.numel() / C;
  MT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dw.numel() == C, "rmsnorm_backward: shapes");
  check_on_gpu({&dy, &x, &w, &rstd, &dx, &dw}, "rmsnorm_backward");
  norm_bwd_types(dy.dtype(), x.dtype(), w.dtype(), dx.dtype(), "rmsnorm_backward", [&](auto t_, auto x_, auto d_) {
    using T = decltype(t_);
    using X = decltype(x_);
    using D = decltype(d_);
    launch_bwd<T, X, D>(N, C, dy.ptr<D>(), x.ptr<X>(), w.ptr<T>(), nullptr, rstd.ptr<T>(), dx.ptr<X>(), dw.ptr<T>(),
                        nullptr, true);
  });
}

}  // namespace mt::kernels::cuda
