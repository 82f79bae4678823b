// CUDA twins of kernels/cpu/norm.cc: LayerNorm and RMSNorm over the last
// dimension of x [N, C], fp32 or fp64, x/dx and dy also bf16 with fp32
// parameters (kernels/norm.h has the contract; bf16 values are widened as
// loaded and a bf16 dx rounded once as stored, as in the CPU twin).
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
// Backward (dx += ..., dw += ..., db += ...) for rows up to 4096 wide (all
// of training's hidden sizes here): norm_bwd_fused, one block per 16 rows or
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

template <typename T, typename X, typename Y>
void launch_fwd(int64_t N, int64_t C, const X* x, const T* w, const T* b, T eps, Y* y, T* mean, T* rstd, bool rms) {
  if (N == 0) return;
  // eps goes through T first, as in the CPU twin (static_cast<T>(eps) then back to double).
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

template <typename T, typename X, typename D>
void launch_bwd(int64_t N, int64_t C, const D* dy, const X* x, const T* w, const T* mean, const T* rstd, X* dx,
                T* dw, T* db, bool rms) {
  if (N == 0 || C == 0) return;  // nothing to add (the CPU twin adds zeros)
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
