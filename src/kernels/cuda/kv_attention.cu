// CUDA twins of kernels/cpu/kv_attention.cc: appending new tokens' keys and
// values to the cache, and attending those tokens against it (incremental
// decoding; kernels/kv_attention.h has the contract). fp32 or fp64, all
// arithmetic in the tensors' type, as on the CPU.
//
// kv_cache_append: one thread per copied element (n x g x d of k, and of v).
// kv_attention: one block of kThreads (8 warps) per (new token i, head h).
//   q * scale (the CPU twin's order of operations) sits in shared memory. The
//   keys 0 .. pos + i stream in chunks of kChunk: each warp takes keys of the
//   chunk in turn and computes a score with its lanes striding over d
//   (coalesced cache reads) and a fixed xor-shuffle tree; thread 0 then runs
//   the online softmax over the chunk in key order (running max m, sum l,
//   correction exp(m_old - m_new)); then thread c < d updates output column
//   c: acc = acc * corr + sum_j p_j v_j[c], keys in order. out = acc / l.
//   The CPU twin takes the max over the whole row first (two passes); the
//   online form gives the same value up to rounding. Deterministic: every
//   sum has a fixed order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda/check.cuh"
#include "kernels/attention.h"
#include "kernels/kv_attention.h"

namespace mt::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // >= kAttnMaxHeadDim: one output column per thread
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;  // keys per softmax step
static_assert(kThreads >= kAttnMaxHeadDim, "one thread per output column");

struct Dims {
  int64_t n = 0, H = 0, G = 0, D = 0, qpg = 0, row = 0;  // new tokens, heads, groups, head_dim, heads per group, (a+2g)d
};

Dims dims_of(const QkvLayout& L) {
  Dims d;
  d.n = L.seq, d.H = L.heads, d.G = L.groups, d.D = L.head_dim, d.qpg = L.heads_per_group(), d.row = L.row();
  return d;
}

// QkvLayout::q_col / k_col on the device (v_col = k_col + D).
__device__ __forceinline__ int64_t q_col(const Dims& a, int64_t head) {
  return (head / a.qpg) * (a.qpg + 2) * a.D + (head % a.qpg) * a.D;
}
__device__ __forceinline__ int64_t k_col(const Dims& a, int64_t group) { return (group * (a.qpg + 2) + a.qpg) * a.D; }

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float max_t(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_t(double a, double b) { return fmax(a, b); }

// Cache rows [pos, pos + n): kc[pos + i][g][c] = k of token i, group g (and v).
template <typename T>
__global__ void kv_append(const T* __restrict__ qkv, T* __restrict__ kc, T* __restrict__ vc, const Dims a,
                          int64_t pos) {
  const int64_t total = a.n * a.G * a.D;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / (a.G * a.D), rem = idx - i * (a.G * a.D);
    const int64_t g = rem / a.D, c = rem - g * a.D;
    const T* src = qkv + i * a.row + k_col(a, g);
    const int64_t dst = ((pos + i) * a.G + g) * a.D + c;
    kc[dst] = src[c];
    vc[dst] = src[a.D + c];
  }
}

// Grid (n, H), kThreads threads.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    kv_attend(const T* __restrict__ qkv, const T* __restrict__ kc, const T* __restrict__ vc, T* __restrict__ out,
              const Dims a, int64_t pos, T scale) {
  __shared__ T sq[kAttnMaxHeadDim];
  __shared__ T sp[kChunk];  // scores, then probabilities
  __shared__ T sstat[2];    // correction of the current chunk; 1 / l at the end
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, D = static_cast<int>(a.D);
  const int64_t i = blockIdx.x, h = blockIdx.y, g = h / a.qpg, last = pos + i;  // keys 0..last
  const T* qs = qkv + i * a.row + q_col(a, h);
  if (tid < D) sq[tid] = qs[tid] * scale;
  T m = static_cast<T>(-INFINITY), l = 0;  // thread 0's running statistics
  T acc = 0;                               // output column tid (tid < D)
  for (int64_t j0 = 0; j0 <= last; j0 += kChunk) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(kChunk), last + 1 - j0));
    __syncthreads();  // sq is written; the previous chunk's readers of sp, sstat are done
    for (int jj = warp; jj < nk; jj += kWarps) {
      const T* kr = kc + ((j0 + jj) * a.G + g) * a.D;
      T part = 0;
      for (int c = lane; c < D; c += 32) part += sq[c] * kr[c];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
      if (lane == 0) sp[jj] = part;
    }
    __syncthreads();
    if (tid == 0) {
      T mx = m;
      for (int j = 0; j < nk; ++j) mx = max_t(mx, sp[j]);
      const T corr = exp_t(m - mx);  // 0 on the first chunk (m = -inf)
      T sum = 0;
      for (int j = 0; j < nk; ++j) {
        const T pj = exp_t(sp[j] - mx);
        sp[j] = pj;
        sum += pj;
      }
      l = l * corr + sum;
      m = mx;
      sstat[0] = corr;
    }
    __syncthreads();
    if (tid < D) {
      T o = acc * sstat[0];
      const T* vcol = vc + (j0 * a.G + g) * a.D + tid;
      for (int j = 0; j < nk; ++j) o += sp[j] * vcol[j * a.G * a.D];
      acc = o;
    }
  }
  if (tid == 0) sstat[1] = T(1) / l;
  __syncthreads();
  if (tid < D) out[(i * a.H + h) * a.D + tid] = acc * sstat[1];
}

// The CPU twin's checks (same messages), plus where the tensors live.
void check(const Tensor& qkv, const QkvLayout& L, const Tensor& kc, const Tensor& vc, int64_t pos) {
  L.check();
  MT_CHECK(L.batch == 1, "kv_attention: one sequence (batch 1)");
  MT_CHECK(qkv.numel() == L.seq * L.row(), "kv_attention: qkv must be [n, (a+2g)d]");
  MT_CHECK(kc.ndim() == 3 && kc.dim(1) == L.groups && kc.dim(2) == L.head_dim && vc.shape() == kc.shape(),
           "kv_attention: caches must be [T_max, g, d]");
  MT_CHECK(pos >= 0 && pos + L.seq <= kc.dim(0),
           "kv_attention: positions [" + std::to_string(pos) + ", " + std::to_string(pos + L.seq) +
               ") outside the cache's " + std::to_string(kc.dim(0)));
  MT_CHECK(qkv.dtype() == kc.dtype() && kc.dtype() == vc.dtype(), "kv_attention: dtypes differ");
  MT_CHECK(qkv.device() == Device::kCuda && kc.device() == Device::kCuda && vc.device() == Device::kCuda,
           "kv_attention (CUDA): tensors must be on the GPU");
}

void check_float(DType dt) {
  MT_CHECK(dt == DType::kF32 || dt == DType::kF64, std::string("unsupported dtype ") + dtype_name(dt));
}

template <typename T>
void append(const Tensor& qkv, const QkvLayout& L, int64_t pos, const Tensor& kc, const Tensor& vc) {
  const Dims a = dims_of(L);
  const int64_t total = a.n * a.G * a.D;
  constexpr int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, int64_t{1} << 20);  // grid-stride beyond
  kv_append<T><<<static_cast<unsigned>(blocks), threads, 0, ::mt::cuda::stream()>>>(qkv.ptr<T>(), kc.ptr<T>(),
                                                                                     vc.ptr<T>(), a, pos);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attend(const Tensor& qkv, const QkvLayout& L, const Tensor& kc, const Tensor& vc, int64_t pos, double scale,
            const Tensor& out) {
  const Dims a = dims_of(L);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(a.H));
  kv_attend<T><<<grid, kThreads, 0, ::mt::cuda::stream()>>>(qkv.ptr<T>(), kc.ptr<T>(), vc.ptr<T>(), out.ptr<T>(), a,
                                                            pos, static_cast<T>(scale));
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kv_cache_append(const Tensor& qkv, const QkvLayout& L, int64_t pos, const Tensor& kc, const Tensor& vc) {
  check(qkv, L, kc, vc, pos);
  check_float(qkv.dtype());
  if (qkv.dtype() == DType::kF32) append<float>(qkv, L, pos, kc, vc);
  else append<double>(qkv, L, pos, kc, vc);
}

void kv_attention(const Tensor& qkv, const QkvLayout& L, const Tensor& kc, const Tensor& vc, int64_t pos,
                  double scale, const Tensor& out) {
  check(qkv, L, kc, vc, pos);
  MT_CHECK(out.numel() == L.seq * L.heads * L.head_dim && out.dtype() == qkv.dtype(),
           "kv_attention: out must be [n, a*d] in qkv's dtype");
  MT_CHECK(L.head_dim <= kAttnMaxHeadDim, "kv_attention: head_dim above the kernel's limit");
  MT_CHECK(out.device() == Device::kCuda, "kv_attention (CUDA): tensors must be on the GPU");
  MT_CHECK(L.heads <= 65535, "kv_attention (CUDA): heads must be <= 65535 (grid y)");
  check_float(qkv.dtype());
  if (qkv.dtype() == DType::kF32) attend<float>(qkv, L, kc, vc, pos, scale, out);
  else attend<double>(qkv, L, kc, vc, pos, scale, out);
}

}  // namespace mt::kernels::cuda
